"""Round 24 (today's changes, MCP): the approving side (`proxy_app`) decides the calls of the
agent the proxy ran as, whichever way that agent was named (a flag, a variable, the config)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending, open_store
from effectgate.context import CallContext
from effectgate.mcp import proxy_app
from effectgate.mcp._config import ENV_AGENT, ENV_CONFIG
from effectgate.mcp._upstream import table_of

from .test_proxy_command import UPSTREAM, effects

SUPPORT = Approver("sam", "support")


def _config(tmp_path: Path, log: Path) -> Path:
    path = tmp_path / "proxy.toml"
    command = json.dumps([sys.executable, UPSTREAM, "stdio"])
    path.write_text(
        f"""
[identity]
agent = "desk"
user = "u1"

[servers.files]
command = {command}
env = {{ EFFECTS_LOG = {json.dumps(str(log))} }}

[servers.files.tools.send_mail]
effect = "send"
approver_role = "support"
"""
    )
    return path


def test_the_approving_side_decides_a_call_of_the_agent_the_proxy_ran_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy ran as `laptop` (`effectgate mcp proxy --agent laptop`, or its variable), its
    config naming `desk`; the approving shell has neither. The proxy has no allowlists (every
    served row is its agent's), yet `Ledger.bar` refused the approval `not_allowed`: the
    approving side's table allowed only the config's agent, and no proxied call of another
    could ever be approved. The mail is approved and sent once."""
    log = tmp_path / "effects.jsonl"
    monkeypatch.setenv(ENV_CONFIG, str(_config(tmp_path, log)))
    store = open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    store.setup()
    keyring = Keyring.generate()
    try:
        monkeypatch.delenv(ENV_AGENT, raising=False)  # the approving shell names no agent
        approving = proxy_app(store, keyring=keyring)
        # the proxy's own table, as `GatedProxy` builds it for the agent it runs as
        proxying = EffectGate(table_of([list(approving.table)], "laptop"), store, keyring=keyring)
        ctx = CallContext(session_id="s", origin_message_id="m1", user_id="u1", agent_id="laptop")
        pending = proxying.call("files__send_mail", {"to": "ada@example.com", "body": "hi"}, ctx)
        assert isinstance(pending, Pending)
        proxying.close()
        grant = approving.approve(pending.approval_id, version=1, approver=SUPPORT)
        assert isinstance(grant, Grant)
        assert isinstance(approving.execute(grant.token), Executed)
        approving.close()
    finally:
        store.close()
    assert [e["args"]["to"] for e in effects(log, "send_mail")] == ["ada@example.com"]
