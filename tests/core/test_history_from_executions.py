"""A subject's history (what a `confirm` check and a card's subject view read) takes what ran
from the append-only executions, not from the approval's status column, which no seal covers:
an owner who edits an executed refund's status to 'denied' in the database does not free the
order for a second full refund, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Pending, Refused
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}  # the whole order
FINANCE = Approver("fiona", "finance")


def granted(gate: EffectGate, message: str) -> Grant:
    pending = gate.call("refund_order", REFUND, context(message))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def edit_status(gate: EffectGate, approval_id: str, status: str) -> None:
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :id"), {"s": status, "id": approval_id}
        )
        assert done.rowcount == 1


def second_refund(gate: EffectGate) -> Any:
    return gate.call("refund_order", REFUND, context("m-second"))


def test_an_executed_refund_edited_to_denied_still_refuses_a_second(shop_gate: ShopGate) -> None:
    """An executed refund whose status was edited to 'denied' is still in effect: the confirm
    check refuses a second full refund, and the card's subject view shows it executed."""
    shop, gate = shop_gate
    first = granted(gate, "m1")
    gate.execute(first.token)
    edit_status(gate, first.approval_id, "denied")
    out = second_refund(gate)
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"
    assert "only 0 is left to refund" in out.message
    assert shop.receiver.count("refund") == 1


def test_the_subject_view_shows_the_edited_refund_as_executed(shop_gate: ShopGate) -> None:
    """Beside the card of another refund of the order, the edited one is listed as executed and
    in effect, and the balance left to refund counts it."""
    gate = shop_gate.gate
    half = {**REFUND, "amount": 6000}
    first = gate.call("refund_order", half, context("m1"))
    assert isinstance(first, Pending)
    grant = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    second = gate.call("refund_order", half, context("m2"))
    assert isinstance(second, Pending), second
    edit_status(gate, first.approval_id, "denied")
    view = gate.subject_view(second.approval_id)
    assert [(e.approval_id, e.status, e.in_effect) for e in view.history] == [
        (first.approval_id, "executed", True)
    ]
    assert view.balance == {"refundable": 6000}


def test_an_unknown_outcome_edited_to_failed_still_refuses_a_second(shop_gate: ShopGate) -> None:
    """A refund whose outcome is unknown (its execution needs reconciliation) stays in effect when
    its status is edited to 'failed': the money may have moved."""
    shop, gate = shop_gate
    first = granted(gate, "m1")
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(first.token)
    edit_status(gate, first.approval_id, "failed")
    out = second_refund(gate)
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"


def test_a_refund_settled_as_not_happened_frees_the_order(shop_gate: ShopGate) -> None:
    """Settling an unknown outcome as 'did not happen' records a failed execution after it, so
    the order is free again: a new full refund is proposed, not refused."""
    shop, gate = shop_gate
    first = granted(gate, "m1")
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(first.token)
    gate.settle(first.approval_id, happened=False, by="fiona")
    assert [e.status for e in gate.store.executions(approval_id=first.approval_id)] == [
        "needs_reconciliation",
        "failed",
    ]
    assert gate.audit().findings == []  # the settlement is recorded under the approval's own row
    assert isinstance(second_refund(gate), Pending)


def test_an_untouched_history_is_unchanged(shop_gate: ShopGate) -> None:
    """Without edits, an executed refund refuses a second on its order and nothing on another."""
    gate = shop_gate.gate
    first = granted(gate, "m1")
    gate.execute(first.token)
    second = gate.call("refund_order", {**REFUND, "amount": 1}, context("m2"))
    assert isinstance(second, Refused)
    pending = gate.call("refund_order", {"order_id": "1043", "amount": 1, "currency": "GBP"}, context("m3"))
    assert isinstance(pending, Pending), pending
    assert gate.subject_view(pending.approval_id).history == ()


class WorkerDied(BaseException):
    """The worker's process ends mid-call: nothing after the tool call runs (no settlement)."""


def test_a_presented_grant_whose_worker_died_still_refuses_a_second(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant presented whose worker died before anything was settled (no execution recorded
    yet, the money may have moved) stays in effect when its status is edited to 'denied' and its
    token_used_at cleared: the grant's "token_used" event is in the chained log."""
    shop, gate = shop_gate
    first = granted(gate, "m1")

    def dies(**_: Any) -> Any:
        raise WorkerDied

    monkeypatch.setattr(shop.provider, "refund", dies)
    with pytest.raises(WorkerDied):
        gate.execute(first.token)
    assert gate.store.executions(approval_id=first.approval_id) == []
    edit_status(gate, first.approval_id, "denied")
    with gate.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_used_at = NULL WHERE id = :id"), {"id": first.approval_id}
        )
    out = second_refund(gate)
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"
