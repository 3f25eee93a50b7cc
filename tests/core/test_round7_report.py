"""Round 7 review of the governance report: figures counted against a ledger built through the
gate, on SQLite and PostgreSQL; the clock is injected, nothing sleeps."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.cli import main
from effectgate.report import disagreement, figures
from effectgate.stores import SQLStore, open_store
from effectgate.testing import FakeClock


def pay(payee: str, amount: int) -> dict[str, Any]:
    return {"ok": True}


def table(*names: str) -> EffectTable:
    t = EffectTable(
        [
            ToolSpec(name=n, effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("payee",))
            for n in names
        ]
    )
    t.allow_all("agent")
    return t


def ctx(n: int, model: str = "m1") -> CallContext:
    return CallContext(
        session_id=f"s{n}", origin_message_id=f"m{n}", user_id="u1", agent_id="agent", model_id=model
    )


def test_a_tool_first_used_while_the_report_runs_is_live_not_unverified(
    store: SQLStore, store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second process proposes the first call of a new tool (its rule recorded in the same
    transaction) after the report read the rules but before it counted the decisions: every seal
    verifies, so the call is live, never "unverified" beside a note that says all is verified."""
    keyring = Keyring.generate()
    with EffectGate(table("pay"), store, keyring=keyring, clock=clock) as gate:
        assert isinstance(gate.call("pay", {"payee": "a", "amount": 1}, ctx(1)), Pending)
    other = open_store(store_url, clock=clock)  # the second process
    counted = store.report_rows
    proposed: list[str] = []
    tools = ["refund", "chargeback"]  # a new tool each time: its rule is recorded with its call

    def second_process_first(conn: Any, what: Any, **window: Any) -> Any:
        if what == "decisions" and not proposed:
            tool = tools.pop(0)
            with EffectGate(table("pay", tool), other, keyring=keyring, clock=clock) as gate:
                out = gate.call(tool, {"payee": tool, "amount": 2}, ctx(len(tools) + 2))
                assert isinstance(out, Pending)
                proposed.append(out.approval_id)
        return counted(conn, what, **window)

    monkeypatch.setattr(store, "report_rows", second_process_first)
    try:
        report = figures(store, keyring=keyring)
        proposed.clear()
        by_role = disagreement(store, by="role", keyring=keyring)
    finally:
        other.close()
    assert (report.unverified, report.note) == (0, None)
    modes = {(r.key, r.mode, r.undecided) for r in report.by_tool}
    assert modes == {("pay", "live", 1), ("refund", "live", 1)}
    assert [(r.key, r.mode, r.undecided) for r in by_role] == [("finance", "live", 3)]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_html_over_a_symlink_or_a_pipe_is_refused_not_replaced(
    store: SQLStore, store_url: str, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--html` writes a partial file and renames it over the path: over a symlink (or a pipe, a
    device such as /dev/stdout) the rename would replace it rather than write into it, so it is
    refused as `export --out` refuses it: a usage error, the link and its target left as they were."""
    target = tmp_path / "kept.html"
    target.write_text("the page the link points to", encoding="utf-8")
    out = tmp_path / "report.html"
    if kind == "symlink":
        out.symlink_to(target)
    else:
        os.mkfifo(out)
    assert main(["report", "--db", store_url, "--html", str(out)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert out.is_symlink() if kind == "symlink" else stat.S_ISFIFO(out.lstat().st_mode)
    assert target.read_text(encoding="utf-8") == "the page the link points to"
    assert not (tmp_path / "report.html.partial").exists()


def test_an_approval_past_its_deadline_counts_as_expired(store: SQLStore, clock: FakeClock) -> None:
    """Two calls proposed; nobody decides and nothing sweeps the queue; a day later both are past
    their deadline (`Policy.pending_ttl`, a day): the gate would answer "expired" for each, and
    the report counts them so: two expired, none pending."""
    with EffectGate(table("pay"), store, keyring=Keyring.generate(), clock=clock) as gate:
        for n in range(2):
            assert isinstance(gate.call("pay", {"payee": f"p{n}", "amount": 1}, ctx(n)), Pending)
        gate.flush()
    clock.advance(2 * 86400)
    [rates] = figures(store).metrics.decision_rates
    assert (rates.expired, rates.pending, rates.rate("expired")) == (2, 0, 1.0)
