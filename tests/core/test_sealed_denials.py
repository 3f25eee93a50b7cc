"""A denial is final for its version, and the approval's status column (which no seal covers) is
not what says so: the sealed deny decision is. An owner of the database who edits a revoked
grant's status from 'denied' back to 'approved' (or 'pending') does not revive it: execute
refuses the grant as revoked and approve refuses a second decision, nothing runs, on SQLite and
PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Pending, Refused
from effectgate.errors import AlreadyDecided, TokenError
from effectgate.examples.shop import context

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
OTHER = Approver("frank", "finance")


def edit_status(gate: EffectGate, approval_id: str, status: str) -> None:
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :id"), {"s": status, "id": approval_id}
        )
        assert done.rowcount == 1


def revoked_grant(gate: EffectGate) -> Grant:
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    denied = gate.deny(grant.approval_id, approver=OTHER, reason="wrong customer")
    assert isinstance(denied, Refused)
    assert denied.code == "denied"
    return grant


def test_a_revoked_grant_edited_back_to_approved_does_not_run(shop_gate: ShopGate) -> None:
    shop, gate = shop_gate
    grant = revoked_grant(gate)
    edit_status(gate, grant.approval_id, "approved")
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "revoked"
    assert shop.receiver.count("refund") == 0
    [approval] = [a for a in gate.store.approvals() if a.id == grant.approval_id]
    assert approval.token_used_at is None  # the grant was not spent either
    assert gate.store.get(f"eg_{grant.approval_id}_v{grant.version}") is None


def test_a_denial_edited_back_to_pending_cannot_be_approved_again(shop_gate: ShopGate) -> None:
    shop, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    gate.deny(pending.approval_id, approver=OTHER, reason="wrong customer")
    edit_status(gate, pending.approval_id, "pending")
    with pytest.raises(AlreadyDecided):
        gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    with gate.store.reading() as conn:
        decisions = gate.store.decisions(conn, pending.approval_id, pending.version)
    assert [d.decision for d in decisions] == ["deny"]  # nothing was recorded for the refused one
    assert shop.receiver.count("refund") == 0


def test_an_untouched_grant_still_runs(shop_gate: ShopGate) -> None:
    """The check costs nothing to an approval no one denied (the decisions are read anyway)."""
    shop, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop.receiver.count("refund") == 1
