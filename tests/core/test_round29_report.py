"""Round 29: the operational report after late-run erasure, on SQLite and PostgreSQL.

Fixed: a record whose call was erased with it (a run that lost its lease came back after its call
was settled and erased: `_late_erasure`) stays `needs_reconciliation` for ever, and nothing can
settle it (reconcile and settle refuse it as erased); the report counted it in the reconciliation
backlog for ever. It is now counted apart (`Metrics.backlog_erased`), never in the backlog; a
marker edited into a record's error column with no redaction entry behind it, or with an entry
inserted whose seal does not verify under the ledger's keyring, hides nothing.
Fixed: the p95 decision time read `eg_approvals.decided_at - created_at`, columns no seal covers in
a mutable table: an edited row moved the figure. It is now taken from the append-only records: the
call's first "proposed" event (chained) to its version's deny decision, else the last approve of its
first grant round (`_queries.LATENCY_P95`); the rank is counted over the same latencies."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Pending
from effectgate.errors import PolicyViolation
from effectgate.redact import redact
from effectgate.report import figures
from effectgate.stores import SQLStore
from effectgate.stores._dialect import REDACTED_PREFIX
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate
from .test_round11_report import REFUND, decided_after, edit
from .test_round14_reconcile import FINANCE, StalledPay, context, stalled_then_settled_failed
from .test_round26_today import _late_write, eraser


def _backlog(gate: EffectGate) -> tuple[int, list[tuple[str, int]], int]:
    m = figures(gate.store, keyring=gate.keyring).metrics
    return m.needs_reconciliation, m.backlog_by_day, m.backlog_erased


def _waiting(store: SQLStore) -> list[str]:
    rows = (row for t, row in store.every_row() if t == "eg_idempotency")
    return [row["key"] for row in rows if row["status"] == "needs_reconciliation"]


@pytest.mark.parametrize("how", ["redact", "retain"])
def test_a_late_write_erased_with_its_call_is_counted_apart_not_in_the_backlog(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, how: str
) -> None:
    """The write's late run, erased with its call, leaves a record awaiting reconciliation that
    nothing can settle: the report counts it apart as erased, not as an open item of the backlog."""
    gate = _late_write(make_gate, clock, eraser(store, how), raises=True)
    [key] = _waiting(store)  # the record stays as it is: the ledger is not rewritten
    with pytest.raises(PolicyViolation):
        gate.settle(key, happened=False, by="fiona")
    assert _waiting(store) == [key]
    assert _backlog(gate) == (0, [], 1)
    data = figures(store, keyring=gate.keyring).metrics.to_dict()
    assert (data["needs_reconciliation"], data["backlog_erased"]) == (0, 1)


def test_a_late_grant_erased_with_its_call_is_counted_apart_not_in_the_backlog(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The same for a gated call: its grant's late run, erased with the call, is no open item."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)

    def erase() -> None:
        redact(store, first.keyring, user_id="u1", by="dpo", reason="erasure request")

    grant = stalled_then_settled_failed(bank, first, other, clock, then=erase)
    with pytest.raises(PolicyViolation):
        first.reconcile(grant.approval_id)
    assert len(_waiting(store)) == 1
    assert _backlog(first) == (0, [], 1)


def _forge_marker(store: SQLStore, *, entry: bool) -> None:
    """Edit each record awaiting reconciliation's error into a redaction marker; with `entry`, also
    insert a redaction entry for it whose seal is not the keyring's (the append-only table takes
    inserts)."""
    with store.engine.begin() as conn:
        keys = conn.execute(sa.text("SELECT key FROM eg_idempotency WHERE status = 'needs_reconciliation'"))
        for (key,) in list(keys):
            marker = REDACTED_PREFIX + '"r-forged"}'
            conn.execute(
                sa.text("UPDATE eg_idempotency SET error = :m WHERE key = :k"), {"m": marker, "k": key}
            )
            if entry:
                conn.execute(
                    sa.text(
                        "INSERT INTO eg_redacted (redaction_id, table_name, row_key, column_name, "
                        "commitment, at, seal) VALUES ('r-forged', 'eg_idempotency', :k, 'error', 'c', 0, "
                        "'k1:forged')"
                    ),
                    {"k": key},
                )


@pytest.mark.parametrize("entry", [False, True], ids=["marker", "marker_and_entry"])
def test_a_marker_edited_into_an_open_record_does_not_take_it_out_of_the_backlog(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, entry: bool
) -> None:
    """A record awaiting reconciliation (never erased) whose error column is edited into a redaction
    marker, with no redaction entry behind it or with one inserted whose seal is not the ledger's,
    stays in the backlog of a report given the keyring: the marker proves nothing."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)
    stalled_then_settled_failed(bank, first, other, clock, then=lambda: None)
    before = _backlog(first)
    assert (before[0], before[2]) == (1, 0)
    _forge_marker(store, entry=entry)
    assert _backlog(first) == before


def test_an_edited_decision_time_does_not_move_the_p95(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A call decided 60 s after it was proposed: editing its approval's decided_at in the database
    does not change the p95 decision time the report shows."""
    bank = StalledPay()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(60)
    gate.approve(out.approval_id, version=1, approver=FINANCE)
    before = figures(store, keyring=gate.keyring).metrics.latency_p95_s
    assert list(before.values()) == [60.0]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET decided_at = created_at + 1"))
    assert figures(store, keyring=gate.keyring).metrics.latency_p95_s == before


def _p95(gate: EffectGate) -> dict[str, float | None]:
    return figures(gate.store, keyring=gate.keyring).metrics.latency_p95_s


@pytest.mark.parametrize("value", [-1000.0, 2e9], ids=["earlier", "later"])
def test_an_edited_proposal_time_does_not_move_the_p95(
    shop_gate: ShopGate, clock: FakeClock, value: float
) -> None:
    """Three refunds decided after 1 s, 100 s and 5 s: the p95 is 100 s. Editing every approval's
    created_at in the database (far earlier, or after it was decided) leaves it at 100 s (the
    approvals stay in the report's window: an open one)."""
    _, gate = shop_gate
    for approval_id in decided_after(gate, clock, (1, 100, 5)):
        edit(gate, "created_at", value, approval_id)
    assert _p95(gate) == {"finance": 100.0}


@pytest.mark.parametrize("value", [None, math.nan, -1.0, 10**6])
def test_a_decision_time_edited_out_of_the_count_does_not_move_the_p95(
    shop_gate: ShopGate, clock: FakeClock, value: float | None
) -> None:
    """Refunds decided after 1, 100, 5 and 7 s (p95: 100 s): the two slow ones' decided_at edited
    (NULL, NaN, before they were proposed, far later) neither drops them from the latencies the
    rank counts nor moves them: the p95 stays 100 s."""
    _, gate = shop_gate
    first, slow, *_ = decided_after(gate, clock, (1, 100, 5, 7))
    assert _p95(gate) == {"finance": 100.0}
    edit(gate, "decided_at", value, slow)
    edit(gate, "decided_at", value, first)
    assert _p95(gate) == {"finance": 100.0}


SECOND = Approver("farid", "finance")


def _denied(gate: EffectGate, clock: FakeClock) -> str:
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(40)
    gate.deny(out.approval_id, approver=FINANCE, reason="no")
    return out.approval_id


def _approved_then_denied(gate: EffectGate, clock: FakeClock) -> str:
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(10)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Grant)
    clock.advance(30)  # its grant unpresented: the deny revokes it
    gate.deny(out.approval_id, approver=SECOND, reason="changed my mind")
    return out.approval_id


def _regranted(gate: EffectGate, clock: FakeClock) -> str:
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(40)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Grant)
    clock.advance(gate.policy.token_ttl + 290)  # the grant lapses unpresented; granted again
    assert isinstance(gate.approve(out.approval_id, version=1, approver=SECOND), Grant)
    return out.approval_id


def _amended(gate: EffectGate, clock: FakeClock) -> str:
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(25)
    again = gate.call("refund_order", {**REFUND, "amount": 1300}, context("m2"))
    assert isinstance(again, Pending)
    assert again.version == 2
    clock.advance(15)
    assert isinstance(gate.approve(out.approval_id, version=2, approver=FINANCE), Grant)
    return out.approval_id


@pytest.mark.parametrize("decide", [_denied, _approved_then_denied, _regranted, _amended])
def test_the_p95_runs_from_the_proposal_to_the_deny_or_the_first_rounds_last_approve(
    shop_gate: ShopGate, clock: FakeClock, decide: Callable[[EffectGate, FakeClock], str]
) -> None:
    """A refund decided 40 s after it was proposed: denied; approved, then denied before its grant
    ran; approved, its grant lapsed and granted again later (the first round decided it); or
    amended by a new message after 25 s and approved 15 s later (from the call's proposal, as
    created_at counted it). The p95 is those 40 s, as decided_at - created_at says, and stays so
    with decided_at edited."""
    _, gate = shop_gate
    approval_id = decide(gate, clock)
    with gate.store.reading() as conn:
        assert conn.execute(sa.text("SELECT decided_at - created_at FROM eg_approvals")).scalar() == 40.0
    assert _p95(gate) == {"finance": 40.0}
    edit(gate, "decided_at", 1e9, approval_id)
    assert _p95(gate) == {"finance": 40.0}
