"""The approving side's gate (`proxy_app`) on SQLite and PostgreSQL, its upstream a subprocess over
stdio (upgraded between two starts by a variant file): an approval whose tool changed upstream
since it was proposed is neither approved nor run, however long the approving process has been
up. And an upstream that cannot be reached is named, by the proxy, `proxy_app` and the command
line, never reported as a bug."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from effectgate import Approver, Executed, Grant, Keyring, Pending, open_store
from effectgate.context import CallContext
from effectgate.effects import Effect
from effectgate.errors import PolicyViolation
from effectgate.mcp import proxy_app
from effectgate.mcp._config import ENV_CONFIG, Http, Row, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.mcp._upstream import UpstreamUnreachable
from effectgate.stores import SQLStore

from ._serving import free_port, run
from .test_proxy import IDENTITY
from .test_proxy_command import UPSTREAM, effects

SUPPORT = Approver("sam", "support")
MAIL = {"to": "ada@example.com", "body": "hello"}


def _config(tmp_path: Path, log: Path, variant: Path) -> Path:
    """One stdio upstream (the files server), whose variant is read from `variant` at each start."""
    path = tmp_path / "proxy.toml"
    command = json.dumps([sys.executable, UPSTREAM, "stdio"])
    env = {"EFFECTS_LOG": str(log), "UPSTREAM_VARIANT_FILE": str(variant)}
    path.write_text(
        f"""
[identity]
agent = "desk"
user = "u1"

[servers.files]
command = {command}
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}

[servers.files.tools.send_mail]
effect = "send"
approver_role = "support"
"""
    )
    return path


def test_an_approval_whose_tool_changed_upstream_is_neither_approved_nor_run(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """proxy_app reads the upstream once when it starts. Carol's send is approved and runs while
    the upstream is unchanged. Then the upstream is upgraded (send_mail reworded): Ada's and
    Dave's approved sends are refused at execute (sync and async) and Bob's cannot be approved;
    each refusal is recorded, and only Carol's mail was sent."""
    log, variant = tmp_path / "effects.jsonl", tmp_path / "variant"
    variant.write_text("1")
    monkeypatch.setenv(ENV_CONFIG, str(_config(tmp_path, log, variant)))
    store = open_store(store_url)
    store.setup()
    try:
        gate = proxy_app(store, keyring=Keyring.generate())

        def propose(to: str) -> Pending:
            ctx = CallContext(session_id="s", origin_message_id=f"m-{to}", user_id="u1", agent_id="desk")
            pending = gate.call("files__send_mail", {**MAIL, "to": to}, ctx)
            assert isinstance(pending, Pending)
            return pending

        def approve(pending: Pending) -> Grant:
            grant = gate.approve(pending.approval_id, version=1, approver=SUPPORT)
            assert isinstance(grant, Grant)
            return grant

        carol, ada, dave, bob = (propose(f"{n}@example.com") for n in ("carol", "ada", "dave", "bob"))
        assert isinstance(gate.execute(approve(carol).token), Executed)
        ada_grant, dave_grant = approve(ada), approve(dave)
        variant.write_text("2")  # the upstream is upgraded: send_mail's description is reworded
        refusals = []
        with pytest.raises(PolicyViolation) as raised:
            gate.execute(ada_grant.token)
        refusals.append(raised.value)
        with pytest.raises(PolicyViolation) as raised:
            asyncio.run(gate.aexecute(dave_grant.token))
        refusals.append(raised.value)
        with pytest.raises(PolicyViolation) as raised:
            gate.approve(bob.approval_id, version=1, approver=SUPPORT)
        refusals.append(raised.value)
        assert [r.code for r in refusals] == ["reclassified"] * 3
        assert all("changed upstream" in str(r) for r in refusals)
        assert gate.card(bob.approval_id).status == "pending"
        assert [a.status for a in (gate.card(ada.approval_id), gate.card(dave.approval_id))] == [
            "approved"
        ] * 2
        refused = [json.loads(e.detail_json or "{}") for e in store.events(kind="refused")]
        assert [(d["code"], d["refused_approval"]) for d in refused] == [
            ("mismatch", p.approval_id) for p in (ada, dave, bob)
        ]
        gate.close()
    finally:
        store.close()
    assert [e["args"]["to"] for e in effects(log, "send_mail")] == ["carol@example.com"]


def test_an_unreachable_upstream_is_named(
    store: SQLStore,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An HTTP upstream nobody listens on (a closed loopback port): the proxy, `proxy_app` and
    the commands (`mcp proxy`, `pending --app effectgate.mcp:proxy_app`) say which upstream
    could not be reached (exit 2), not "unexpected ExceptionGroup ... a bug" (exit 70)."""
    from effectgate.cli import main

    url = f"http://127.0.0.1:{free_port()}/mcp"
    upstream = Upstream(name="files", target=Http(url=url), prefix="files", default=Row(effect=Effect.READ))
    proxy = GatedProxy([upstream], store, identity=IDENTITY, keyring=Keyring.generate())

    async def enter() -> None:
        async with proxy:
            pass

    with pytest.raises(UpstreamUnreachable, match=r"^upstream 'files': connecting failed: ConnectError"):
        run(enter)
    config = tmp_path / "proxy.toml"
    config.write_text(f'[identity]\nagent = "desk"\nuser = "u1"\n[servers.files]\nurl = "{url}"\n')
    monkeypatch.setenv(ENV_CONFIG, str(config))
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    with pytest.raises(UpstreamUnreachable, match=r"^upstream 'files': listing its tools failed"):
        proxy_app(store)
    capsys.readouterr()
    for argv in (["mcp", "proxy", "--config", str(config)], ["pending", "--app", "effectgate.mcp:proxy_app"]):
        assert main(["--db", store_url, *argv]) == 2
        err = capsys.readouterr().err
        assert "upstream 'files'" in err
        assert "ExceptionGroup" not in err
