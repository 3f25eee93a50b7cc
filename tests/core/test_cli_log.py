"""The gate's log lines under the `effectgate` command: its warnings reach stderr with control,
invisible and reordering characters escaped (a failed tool's error may quote model-written
arguments), and the handler the command installs is gone when `main` returns."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effectgate import CallContext, Pending, open_store
from effectgate.cli import keyring_for, main

EVIL = "+44\x1b]0;PWNED\x07\x1b[2J\x1b[31mAPPROVED-OK\x1b[0m\u202e"

# A send tool whose provider error echoes the (model-written) recipient, as many SDKs do.
ECHOING_APP = """
from effectgate import Effect, EffectGate, EffectTable, ToolSpec
from effectgate.effects import Reversibility


def send_sms(to: str, body: str) -> dict:
    raise RuntimeError(f"provider rejected recipient {to}")


def factory(store, *, keyring=None):
    spec = ToolSpec(
        name="send_sms", effect=Effect.SEND, fn=send_sms, approver_role="support_lead",
        reversibility=Reversibility.IRREVERSIBLE, subject=("to",),
    )
    table = EffectTable([spec])
    table.allow_all("support")
    return EffectGate(table, store, keyring=keyring)
"""


@pytest.fixture
def echoing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A ledger with one pending send_sms whose recipient carries terminal escapes; the app's
    module sits in `tmp_path`. Returns the database URL and the approval id."""
    (tmp_path / "eg_echoing_app.py").write_text(ECHOING_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    import eg_echoing_app  # type: ignore[import-not-found]

    url = f"sqlite:///{tmp_path}/eg.db"
    with open_store(url) as store:
        store.setup()
        gate = eg_echoing_app.factory(store, keyring=keyring_for(url))
        ctx = CallContext(session_id="s", origin_message_id="m", user_id="u1", agent_id="support")
        pending = gate.call("send_sms", {"to": EVIL, "body": "hi"}, ctx)
        gate.close()
    assert isinstance(pending, Pending)
    return url, pending.approval_id


def test_a_failed_execution_warning_reaches_the_terminal_escaped(
    echoing: tuple[str, str], tmp_path: Path
) -> None:
    """`approve --execute` of a send whose tool raises with the model's recipient: the gate's
    warning is on stderr, one line, with every escape written out (\\u001b) and no raw ESC."""
    url, approval_id = echoing
    argv = [sys.executable, "-m", "effectgate.cli", "--db", url, "approve", approval_id, "--version", "1"]
    argv += ["--as", "support_lead", "--approver", "sam", "--app", "eg_echoing_app:factory", "--execute"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("EFFECTGATE_DEBUG", None)
    done = subprocess.run(argv, capture_output=True, env=env, timeout=60, check=False)
    assert done.returncode == 6  # approved (recorded), then the run's outcome is unknown
    assert b"\x1b" not in done.stderr
    assert b"\xe2\x80\xae" not in done.stderr  # U+202E, the right-to-left override
    warnings = [
        line for line in done.stderr.decode().splitlines() if line.startswith("effectgate._execution:")
    ]
    assert len(warnings) == 1, done.stderr
    assert "warning: execution needs_reconciliation" in warnings[0]
    assert "+44\\u001b]0;PWNED\\u0007\\u001b[2J" in warnings[0]
    assert warnings[0].endswith("\\u202e")


def test_the_handler_is_installed_only_while_main_runs(
    echoing: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, the warning goes to stderr escaped while `main` runs; afterwards the
    `effectgate` logger has the handlers and propagation it had (a library user's set-up)."""
    url, approval_id = echoing
    monkeypatch.delenv("EFFECTGATE_DEBUG", raising=False)
    logger = logging.getLogger("effectgate")
    handlers, propagate = list(logger.handlers), logger.propagate
    argv = ["--db", url, "approve", approval_id, "--version", "1", "--as", "support_lead"]
    code = main([*argv, "--approver", "sam", "--app", "eg_echoing_app:factory", "--execute"])
    assert code == 6
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "effectgate._execution: warning: execution needs_reconciliation" in err
    assert (logger.handlers, logger.propagate) == (handlers, propagate)
