"""The CLI and the Approver value (round 15, reproduced first): an ISO 8601 basic date read as
epoch seconds by `report --since/--until`, an approver id that shows no character accepted, and
`approve --execute` of a tool this process cannot run said to have failed after it ran."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.cli import keyring_for
from effectgate.errors import EffectGateError
from effectgate.examples.shop import app, context
from effectgate.flow import READY_CHECK
from effectgate.replay import replay
from effectgate.testing import FakeClock
from effectgate.tokens import Keyring

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}
NOVEMBER = datetime(2026, 11, 15, 12, tzinfo=UTC).timestamp()


# -- 1. report --since / --until: 20261201 is 1 December 2026, not 1970-08-23


@pytest.fixture
def november_refund(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A refund proposed and denied on 15 November 2026: one decided call. Returns the URL."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(store_url), clock=FakeClock(NOVEMBER))
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        gate.deny(pending.approval_id, approver=Approver("fiona", "finance"), reason="no", version=1)
        gate.close()
    return store_url


def _decided(run: Run) -> int:
    assert run.code == 0, run.err
    return sum(row["decided"] for row in json.loads(run.out)["by_tool"])


def test_an_iso_basic_date_bounds_the_report_as_that_date(
    cli: Callable[..., Run], november_refund: str
) -> None:
    """`--since 20261201` asks for December's calls: the November refund is not one of them (it
    was read as epoch seconds, 1970-08-23, and every call was counted). `--until 20261201` holds
    it, and both read as their dashed form does."""
    url = november_refund
    assert _decided(cli("report", "--db", url, "--json", "--since", "2026-12-01")) == 0
    assert _decided(cli("report", "--db", url, "--json", "--since", "20261201")) == 0
    assert _decided(cli("report", "--db", url, "--json", "--since", "20261101")) == 1
    assert _decided(cli("report", "--db", url, "--json", "--until", "20261201")) == 1
    assert _decided(cli("report", "--db", url, "--json", "--since", "1000000")) == 1  # epoch seconds
    mistyped = cli("report", "--db", url, "--json", "--since", "20261301")  # no 13th month
    assert (mistyped.code, mistyped.out) == (2, "")  # not read as seconds in 1970
    assert "YYYYMMDD" in mistyped.err
    help_run = cli("report", "--help")
    assert help_run.code == 0
    assert "20261201" in help_run.out


# -- 2. an approver who shows no character is nobody


@pytest.mark.parametrize("blank", [" ", "\t", "\u200b", "\u3164", "  \u2060 "])
def test_an_approver_id_that_shows_no_character_is_refused(blank: str) -> None:
    """`Approver(" ")` was accepted and its approval recorded a decision by nobody: an id (or a
    role) of spaces or invisible characters only is refused like an empty one."""
    with pytest.raises(ValueError, match="shows no character"):
        Approver(blank, "finance")
    with pytest.raises(ValueError, match="shows no character"):
        Approver("fiona", blank)
    assert Approver("fi ona", "finance").id == "fi ona"  # a space inside is text, kept


def test_a_blank_approver_on_the_command_line_records_nothing(
    cli: Callable[..., Run], store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve --approver " "` is a usage error (exit 2) and no decision is recorded."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(store_url))
        pending = gate.call("refund_order", REFUND, context("m1"))
        gate.close()
    assert isinstance(pending, Pending)
    argv = ["--db", store_url, "approve", pending.approval_id, "--version", "1", "--as", "finance"]
    run = cli(*argv, "--approver", " ", "--app", "effectgate.examples.shop:app")
    assert run.code == 2, run
    with open_store(store_url) as store:
        assert store.all_decisions() == []
        row = store.get_approval(pending.approval_id)
        assert row is not None
        assert row.status == "pending"


def test_replay_of_a_stored_blank_approver_reports_instead_of_raising(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision row whose approver id an older release recorded blank (or someone edited so)
    is not an approver: replay leaves it out and reports the intent as one the current gate
    would refuse (it refuses that approver), never raising."""
    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=Keyring.generate())
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        gate.close()
        stored = store.all_decisions()
        legacy = [dataclasses.replace(d, approver_id=" ") for d in stored]
        monkeypatch.setattr(store, "all_decisions", lambda: legacy)  # the rows as read back
        report = replay(store, gate.table, gate.policy)  # no keyring: the rows are read as stored
    [verdict] = report.results
    assert verdict.approval_id == pending.approval_id
    assert verdict.verdict == "refused"


# -- 3. approve --execute of a tool this process cannot run: nothing ran, the grant kept


def _native_refund(order_id: str, amount: int) -> dict[str, Any]:
    RAN.append(order_id)
    return {"order_id": order_id, "refunded": amount}


def _not_here() -> None:
    raise EffectGateError("refund runs only inside its own framework call, where its context is known")


RAN: list[str] = []
setattr(_native_refund, READY_CHECK, _not_here)


@pytest.fixture
def native_app(monkeypatch: pytest.MonkeyPatch) -> str:
    """An application whose money tool is a framework's native tool: its function refuses to
    start outside the framework's own call (as the OpenAI Agents adapter's native tools do)."""
    module = types.ModuleType("eg_round15_native_app")

    def factory(store: Any, *, keyring: Any = None) -> EffectGate:
        spec = ToolSpec(name="refund", effect=Effect.MONEY, fn=_native_refund, approver_role="finance")
        table = EffectTable([spec])
        table.allow_all("support")
        return EffectGate(table, store, keyring=keyring)

    module.factory = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    RAN.clear()
    return f"{module.__name__}:factory"


def test_execute_of_a_tool_the_cli_cannot_run_says_nothing_ran(
    cli: Callable[..., Run], native_app: str, tmp_path: Path
) -> None:
    """`approve --execute` of a native tool's approval exited 6 ("then its run failed") and
    printed no token, though the gate refused before its claim: nothing ran and the grant was
    unspent, lost to the application. It exits 4 saying nothing ran, and prints the grant token
    (as without --execute), which then runs the call once."""
    url = f"sqlite:///{tmp_path / 'native.db'}"
    with open_store(url) as store:
        store.setup()
        gate = sys.modules[native_app.split(":")[0]].factory(store, keyring=keyring_for(url))
        ctx = CallContext(session_id="s", origin_message_id="m", user_id="u1", agent_id="support")
        pending = gate.call("refund", {"order_id": "1042", "amount": 5}, ctx)
        gate.close()
    assert isinstance(pending, Pending)
    argv = ["--db", url, "--app", native_app, "approve", pending.approval_id, "--version", "1"]
    run = cli(*argv, "--as", "finance", "--approver", "fiona", "--execute")
    assert run.code == 4, run
    assert "nothing ran" in run.err
    token = run.out.strip().splitlines()[-1]
    with open_store(url) as store:
        assert store.executions() == []
        row = store.get_approval(pending.approval_id)
        assert row is not None
        assert (row.status, row.token_used_at) == ("approved", None)
        gate = sys.modules[native_app.split(":")[0]].factory(store, keyring=keyring_for(url))
        setattr(_native_refund, READY_CHECK, lambda: None)  # now inside the framework's call
        try:
            done = gate.execute(token)
        finally:
            setattr(_native_refund, READY_CHECK, _not_here)
            gate.close()
    assert done.result == {"order_id": "1042", "refunded": 5}
    assert RAN == ["1042"]
