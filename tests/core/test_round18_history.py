"""A subject's history (what a `confirm` balance check, the card's subject view and its "In
flight" read) says whether a past approval is in effect from what verifies: its recorded
executions, its sealed count of grants, the sealed denial of its version and the time of the
sealed decisions that granted it, never from the unsealed `status` or `token_expires_at` columns
alone. On SQLite and PostgreSQL (`store`, through `shop_gate`)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Pending, Refused
from effectgate._display import card_view
from effectgate.examples.shop import context
from effectgate.testing import FakeClock

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}  # the whole order
HALF = {**REFUND, "amount": 6000}
FIONA = Approver("fiona", "finance")
FRANK = Approver("frank", "finance")


def granted(gate: EffectGate, args: dict[str, Any], message: str, **ctx: str) -> Grant:
    pending = gate.call("refund_order", args, context(message, **ctx))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FIONA)
    assert isinstance(grant, Grant), grant
    return grant


def edit(gate: EffectGate, approval_id: str, column: str, value: object) -> None:
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text(f"UPDATE eg_approvals SET {column} = :v WHERE id = :id"), {"v": value, "id": approval_id}
        )
        assert done.rowcount == 1


HIDING = [("status", "expired"), ("status", "denied"), ("status", "failed"), ("token_expires_at", 1.0)]


@pytest.mark.parametrize(("column", "value"), HIDING)
def test_a_live_grant_hidden_by_an_unsealed_column_still_counts(
    shop_gate: ShopGate, column: str, value: object
) -> None:
    """An unused grant for the whole order, its status edited to expired/denied/failed (or its
    stored expiry moved into the past): a second full refund from another session is refused by
    the balance check, and once the column is put back only the first grant runs."""
    shop, gate = shop_gate
    first = granted(gate, REFUND, "m1")
    with gate.store.engine.connect() as conn:
        before = conn.execute(
            sa.text(f"SELECT {column} FROM eg_approvals WHERE id = :id"), {"id": first.approval_id}
        ).scalar()
    edit(gate, first.approval_id, column, value)
    out = gate.call("refund_order", REFUND, context("m9", session_id="s-other"))
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"
    assert "only 0 is left" in out.message
    edit(gate, first.approval_id, column, before)
    gate.execute(first.token)
    assert [e.payload["amount"] for e in shop.receiver.effects] == [12000]


def test_a_sealed_denial_edited_to_executed_blocks_nothing(shop_gate: ShopGate) -> None:
    """A denied full refund whose status column says 'executed' (no execution recorded, its
    version's denial sealed) is not in effect: a legitimate refund is proposed, the sidebar shows
    the denial and the whole balance."""
    shop, gate = shop_gate
    first = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(first, Pending)
    gate.deny(first.approval_id, version=1, approver=FIONA, reason="no")
    edit(gate, first.approval_id, "status", "executed")
    out = gate.call("refund_order", {**REFUND, "amount": 5000}, context("m9"))
    assert isinstance(out, Pending), out
    view = gate.subject_view(out.approval_id)
    assert [(e.approval_id, e.status, e.in_effect) for e in view.history] == [
        (first.approval_id, "denied", False)
    ]
    assert view.balance == {"refundable": 12000}
    assert shop.receiver.count("refund") == 0


def test_the_sidebar_and_in_flight_show_a_hidden_live_grant(shop_gate: ShopGate) -> None:
    """Beside another half refund's card, a live grant whose status was edited to 'expired' is
    listed as approved and in effect, in flight, and counted in the balance."""
    gate = shop_gate.gate
    first = granted(gate, HALF, "m1")
    edit(gate, first.approval_id, "status", "expired")
    edit(gate, first.approval_id, "token_expires_at", 1.0)
    second = gate.call("refund_order", HALF, context("m2", session_id="s-other"))
    assert isinstance(second, Pending), second
    view = card_view(gate, second.approval_id)
    assert [(e.approval_id, e.status, e.in_effect) for e in view["view"].history] == [
        (first.approval_id, "approved", True)
    ]
    assert [e.approval_id for e in view["in_flight"]] == [first.approval_id]
    assert view["view"].balance == {"refundable": 6000}


def test_a_grant_that_lapsed_unused_frees_the_order(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Past the sealed grant's latest possible expiry (its granting decision's time plus the
    policy's grant lifetime) an unused grant commits nothing, whatever its status column says."""
    gate = shop_gate.gate
    first = granted(gate, REFUND, "m1")
    clock.advance(gate.policy.token_ttl + 1)
    out = gate.call("refund_order", REFUND, context("m9", session_id="s-other"))
    assert isinstance(out, Pending), out
    [entry] = gate.subject_view(out.approval_id).history
    assert (entry.approval_id, entry.in_effect) == (first.approval_id, False)


@pytest.mark.parametrize(("column", "value"), [("grants", 0), ("approver_role", "support"), ("version", 7)])
def test_a_granted_row_whose_seal_was_broken_counts_and_refuses(
    shop_gate: ShopGate, column: str, value: object
) -> None:
    """An unused grant whose row's sealed field was edited (so it no longer verifies) is not
    dropped from the history: it may be put back and run, so the balance check refuses a second
    refund (its stored amount is not trusted either), reporting the record that does not verify."""
    shop, gate = shop_gate
    first = granted(gate, REFUND, "m1")
    with gate.store.engine.connect() as conn:
        before = conn.execute(
            sa.text(f"SELECT {column} FROM eg_approvals WHERE id = :id"), {"id": first.approval_id}
        ).scalar()
    edit(gate, first.approval_id, column, value)
    edit(gate, first.approval_id, "status", "expired")  # past the subject's in-flight guard too
    out = gate.call("refund_order", {**REFUND, "amount": 1}, context("m9", session_id="s-other"))
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"
    assert "does not verify" in out.message
    edit(gate, first.approval_id, column, before)
    edit(gate, first.approval_id, "status", "approved")
    gate.execute(first.token)
    assert shop.receiver.count("refund") == 1


def test_a_forged_row_with_no_sealed_decision_is_no_history(shop_gate: ShopGate) -> None:
    """A row inserted in the database (a copy of a real one under a new id, said executed and
    granted: it does not verify, and no decision's seal names it) blocks nothing and is not listed:
    only a row the gate's sealed decisions name counts."""
    gate = shop_gate.gate
    first = gate.call("refund_order", HALF, context("m1"))
    assert isinstance(first, Pending)
    gate.deny(first.approval_id, version=1, approver=FIONA, reason="no")
    with gate.store.engine.begin() as conn:
        row = dict(
            conn.execute(sa.text("SELECT * FROM eg_approvals WHERE id = :id"), {"id": first.approval_id})
            .mappings()
            .one()
        )
        row.update(id="f" * 32, status="executed", grants=1)
        cols = ", ".join(row)
        conn.execute(
            sa.text(f"INSERT INTO eg_approvals ({cols}) VALUES ({', '.join(':' + c for c in row)})"), row
        )
    out = gate.call("refund_order", HALF, context("m9", session_id="s-other"))
    assert isinstance(out, Pending), out
    assert [e.approval_id for e in gate.subject_view(out.approval_id).history] == [first.approval_id]


def test_the_history_reads_a_flat_number_of_statements(shop_gate: ShopGate, clock: FakeClock) -> None:
    """However many lapsed grants a subject has, its history is read in the same few statements
    (no query per approval: `confirm` is on the money path)."""
    gate = shop_gate.gate
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(args[2])

    counts = []
    for n in range(3):
        grant = granted(gate, {**REFUND, "amount": 100 + n}, f"m{n}", session_id=f"s{n}")
        clock.advance(gate.policy.token_ttl + 1)
        row = gate.store.get_approval(grant.approval_id)
        assert row is not None
        seen.clear()
        sa.event.listen(gate.store.engine, "before_cursor_execute", count)
        try:
            with gate.store.reading() as conn:
                history = gate._ledger.history(conn, "refund_order", row.subject_key, None)
        finally:
            sa.event.remove(gate.store.engine, "before_cursor_execute", count)
        assert len(history) == n + 1
        assert not any(e.in_effect for e in history)
        counts.append(len([s for s in seen if s.lstrip().upper().startswith("SELECT")]))
    assert counts[0] == counts[1] == counts[2] <= 4, counts


def test_the_card_flags_a_history_record_that_does_not_verify(shop_gate: ShopGate) -> None:
    """Beside another call's card, a live grant whose seal was broken is listed in flight and in
    the history as approved, in effect, and flagged; the balance is not computed from it."""
    gate = shop_gate.gate
    first = granted(gate, HALF, "m1")
    second = gate.call("refund_order", HALF, context("m2"))  # the same session: not busy
    assert isinstance(second, Pending), second
    edit(gate, first.approval_id, "grants", 0)
    view = card_view(gate, second.approval_id)
    assert [(e.approval_id, e.status, e.in_effect, e.intact) for e in view["view"].history] == [
        (first.approval_id, "approved", True, False)
    ]
    assert [e.approval_id for e in view["in_flight"]] == [first.approval_id]
    assert view["view"].balance == "unavailable (a record on this subject does not verify)"
