"""Round 29: an approval's pending deadline is re-derived where it decides, never read from its
`expires_at` column (no seal covers it): the `at` of the chained event that proposed or amended
the version plus the policy's `pending_ttl` (`effectgate._deadline`). On SQLite and PostgreSQL;
refunds counted at the provider's receiver.

- Edited forward after it passed, the column revives nothing: approve and deny are refused as
  expired (the row is marked so), a lapsed grant is not granted again, nothing runs.
- Edited backward, the column makes nothing lapse early: the sweep (`expire`), the listing and a
  replay of the call leave the approval pending (or, its grant lapsed, granted again), and it is
  approved and runs once. (The edit is
  not an error at decision time: the derived value decides, and the column is a copy for display.)
- An amended version's deadline runs from its amendment, not from the first proposal.
- The audit reports a granted version approved after its derived deadline (`approved_late`), as
  a gate that read the column (an earlier release) approved one edited forward; an untouched
  ledger, and one whose column alone was edited, are clean of it.
- Both reads walk the approvals' event index (SQLite's plans); approve stays one read.
- `redact` (and `retain`) judge whether a call may still run by the derived deadline too: one
  edited backward erases no live approval (`test_round29_erasure_deadline`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from effectgate import Approver, Grant, Pending, open_store
from effectgate import _decidable as decidable_module
from effectgate import audit as audit_module
from effectgate.audit import audit
from effectgate.errors import ApprovalExpired, TamperedRecord
from effectgate.examples.shop import context
from effectgate.redact import RedactionError, redact
from effectgate.stores import SQLStore
from effectgate.stores import _queries as Q
from effectgate.stores import _together as T
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_chain import unguard

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 8000, "currency": "GBP"}


def _propose(shop_gate: ShopGate, args: dict[str, Any] = REFUND, message: str = "m1") -> Pending:
    pending = shop_gate.gate.call("refund_order", args, context(message, session_id="s-ada"))
    assert isinstance(pending, Pending), pending
    return pending


def _set_deadline(store: SQLStore, approval_id: str, at: float) -> None:
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET expires_at = :t WHERE id = :id"), {"t": at, "id": approval_id}
        )


def _kinds(store: SQLStore, approval_id: str) -> list[str]:
    return [e.kind for e in store.events(approval_id=approval_id)]


def test_a_deadline_edited_forward_after_it_passed_is_refused_and_marked_expired(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl * 3)
    _set_deadline(store, pending.approval_id, clock.now() + 3600)
    with pytest.raises(ApprovalExpired):
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    with pytest.raises(ApprovalExpired):
        gate.deny(pending.approval_id, approver=FINANCE, reason="no")
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("expired", 0)
    kinds = _kinds(store, pending.approval_id)
    assert kinds.count("expired") == 1
    assert not {"approved", "token_minted", "denied"} & set(kinds)
    with store.reading() as conn:
        assert store.decisions(conn, pending.approval_id) == []
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_lapsed_grant_is_not_granted_again_after_the_deadline_was_edited_forward(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    first = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.pending_ttl * 3)  # the grant and the version's deadline both passed
    _set_deadline(store, pending.approval_id, clock.now() + 3600)
    with pytest.raises(ApprovalExpired):
        gate.approve(pending.approval_id, version=1, approver=Approver("fred", "finance"))
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("approved", 1)
    assert "regranted" not in _kinds(store, pending.approval_id)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_deadline_edited_backward_makes_nothing_lapse_early(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl / 2)
    _set_deadline(store, pending.approval_id, clock.now() - 3600)
    gate.expire()  # the sweep: its SQL lists it, the derived deadline keeps it
    assert [c.approval_id for c in gate.pending()] == [pending.approval_id]
    replay = _propose(shop_gate)  # the same message again: its proposal path judges it too
    assert (replay.approval_id, replay.replay) == (pending.approval_id, True)
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "pending"
    assert "expired" not in _kinds(store, pending.approval_id)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_a_lapsed_grant_is_not_answered_expired_for_a_deadline_edited_backward(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    first = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.token_ttl + 1)  # the grant lapsed unpresented; the approval stands
    _set_deadline(store, pending.approval_id, clock.now() - 1)
    replay = _propose(shop_gate)  # the replay is told it waits, not that it expired
    assert (replay.approval_id, replay.status) == (pending.approval_id, "approved")
    again = gate.approve(pending.approval_id, version=1, approver=Approver("fred", "finance"))
    assert isinstance(again, Grant)
    gate.execute(again.token)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_the_sweep_expires_at_the_derived_deadline_whatever_the_column_says(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    _set_deadline(store, pending.approval_id, clock.now() - 1)  # backward, then its true one passes
    clock.advance(gate.policy.pending_ttl + 1)
    gate.expire()
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "expired"
    assert _kinds(store, pending.approval_id).count("expired") == 1


def test_an_amended_version_runs_from_its_amendment(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    ttl = gate.policy.pending_ttl
    first = _propose(shop_gate)
    clock.advance(ttl * 0.75)
    amended = _propose(shop_gate, {**REFUND, "amount": 6000}, "m2")
    assert (amended.approval_id, amended.version) == (first.approval_id, 2)
    clock.advance(ttl * 0.5)  # past version 1's deadline, within version 2's
    _set_deadline(store, first.approval_id, clock.now() - ttl * 0.25)  # back to version 1's
    grant = gate.approve(first.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_an_amended_version_past_its_deadline_edited_forward_is_refused(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    ttl = gate.policy.pending_ttl
    first = _propose(shop_gate)
    clock.advance(ttl * 0.75)
    _propose(shop_gate, {**REFUND, "amount": 6000}, "m2")
    clock.advance(ttl + 1)
    _set_deadline(store, first.approval_id, clock.now() + 3600)
    with pytest.raises(ApprovalExpired):
        gate.approve(first.approval_id, version=2, approver=FINANCE)
    row = store.get_approval(first.approval_id)
    assert row is not None
    assert (row.status, row.version, row.grants) == ("expired", 2, 0)
    assert shop_gate.shop.receiver.count("refund") == 0


def _proposal_event_gone(shop_gate: ShopGate, store: SQLStore, edit: str) -> Pending:
    """A proposed refund whose `proposed` event `edit` (an UPDATE or DELETE of eg_events) took away."""
    pending = _propose(shop_gate)
    unguard(store, "eg_events")  # as the database's owner can
    with store.transaction() as conn:
        conn.execute(
            sa.text(f"{edit} WHERE approval_id = :id AND kind = 'proposed'"), {"id": pending.approval_id}
        )
    return pending


def test_a_version_whose_proposal_event_is_gone_is_refused_as_tampered(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    gate = shop_gate.gate
    pending = _proposal_event_gone(shop_gate, store, "UPDATE eg_events SET version = 7")
    with pytest.raises(TamperedRecord, match="proposed"):
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("pending", 0)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_replay_of_a_version_whose_proposal_event_is_gone_is_refused_as_tampered(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Round 31: as `approve` refuses it, so does the replay of its call (the same message): it
    answered Pending, an approval no one can ever decide (its deadline cannot be derived)."""
    gate = shop_gate.gate
    pending = _proposal_event_gone(shop_gate, store, "DELETE FROM eg_events")
    with pytest.raises(TamperedRecord, match="proposed"):
        gate.call("refund_order", REFUND, context("m1", session_id="s-ada"))
    assert [(r.id, r.status, r.grants) for r in store.approvals()] == [(pending.approval_id, "pending", 0)]
    assert shop_gate.shop.receiver.count("refund") == 0


def _late(shop_gate: ShopGate) -> list[tuple[str, str | None]]:
    report = audit(shop_gate.gate.store, keyring=shop_gate.gate.keyring)
    return [(f.kind, f.approval_id) for f in report.findings if f.kind == "approved_late"]


def test_the_audit_reports_a_version_approved_after_its_deadline(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = shop_gate.gate
    kept = _propose(shop_gate)
    grant = gate.approve(kept.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    late = _propose(shop_gate, {**REFUND, "order_id": "1043", "amount": 3000}, "m2")
    clock.advance(gate.policy.pending_ttl * 3)
    _set_deadline(store, late.approval_id, clock.now() + 3600)
    # as a gate that judged the deadline by its column (the release before this one) did
    monkeypatch.setattr(decidable_module, "derived", lambda row, proposed, ttl: row.expires_at)
    revived = gate.approve(late.approval_id, version=1, approver=FINANCE)
    assert isinstance(revived, Grant)
    gate.execute(revived.token)
    assert shop_gate.shop.receiver.count("refund") == 2
    assert _late(shop_gate) == [("approved_late", late.approval_id)]
    gate.close()  # no background thread: the scan may fork
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)  # each half read by its range's query
    assert _late(shop_gate) == [("approved_late", late.approval_id)]


def test_an_audit_of_deadlines_kept_is_clean_of_late_approvals(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    ttl = gate.policy.pending_ttl
    first = _propose(shop_gate)
    clock.advance(ttl * 0.75)
    _propose(shop_gate, {**REFUND, "amount": 6000}, "m2")  # version 2: its own deadline
    clock.advance(ttl * 0.5)
    _set_deadline(store, first.approval_id, clock.now() - 1)  # the column alone decides nothing
    grant = gate.approve(first.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    clock.advance(gate.policy.token_ttl + 1)  # lapsed unpresented: granted again, in time
    again = gate.approve(first.approval_id, version=2, approver=Approver("fred", "finance"))
    assert isinstance(again, Grant)
    gate.execute(again.token)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert audit(store, keyring=gate.keyring).clean


@pytest.fixture
def plans_db(tmp_path: Path) -> sqlite3.Connection:
    path = tmp_path / "plans.db"
    made = open_store(f"sqlite:///{path}")
    made.setup()
    made.close()
    return sqlite3.connect(path)


def _plan(db: sqlite3.Connection, sql: str, params: list[Any]) -> str:
    return " | ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_the_deadline_reads_walk_the_approvals_event_index(plans_db: sqlite3.Connection) -> None:
    at = re.sub(r":p_\w+", "?", T.APPROVAL_DECISIONS_AT)
    plan = _plan(plans_db, at, ["x"] * at.count("?"))
    assert "SEARCH e USING INDEX eg_events_approval (approval_id=?)" in plan, plan
    compiled = Q.proposal_times().compile(dialect=sqlite_dialect())
    expanded = compiled.construct_expanded_state({"p_ids": ["a", "b"]})
    plan = _plan(plans_db, expanded.statement, list(expanded.positional_parameters or ()))
    assert "eg_events_approval (approval_id=?)" in plan, plan
    assert "eg_events_kind" not in plan, plan


def test_the_store_reads_when_each_version_was_proposed(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    proposed = clock.now()
    first = _propose(shop_gate)
    clock.advance(60)
    _propose(shop_gate, {**REFUND, "amount": 6000}, "m2")
    with store.transaction() as conn:
        row, read, (at, detail) = store.locked_decided_at(conn, first.approval_id)
        plain = store.locked_decided(conn, first.approval_id)
        times = store.proposal_times(conn, [first.approval_id, "no-such-approval"])
        assert store.locked_decided_at(conn, "no-such-approval") == (None, [], (None, None))
    assert row is not None
    assert plain[0] is not None
    assert (row.id, row.version, row.seal, read) == (plain[0].id, 2, plain[0].seal, plain[1])
    assert at == proposed + 60
    ttl = shop_gate.gate.policy.pending_ttl  # round 30: with the detail that records it
    assert json.loads(detail)["pending_ttl"] == ttl
    assert {k: (t, json.loads(d)["pending_ttl"]) for k, (t, d) in times.items()} == {
        (first.approval_id, 1): (proposed, ttl),
        (first.approval_id, 2): (proposed + 60, ttl),
    }


def test_a_live_approval_whose_deadline_was_edited_backward_is_not_erased(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    _set_deadline(store, pending.approval_id, clock.now() - 1)
    gate.flush()
    with pytest.raises(RedactionError, match="may still run"):
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure", now=clock.now())
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert not row.args_json.startswith('{"$redacted"')
