"""Round 24: a deny on an approval whose status column (which no seal covers) was edited to
'denied' with no sealed denial behind it is recorded, sealed; it was refused as already decided,
so the reviewer's denial was lost, and once the column was edited back the call could be approved
and run."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, Pending
from effectgate.errors import AlreadyDecided
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}
FIONA = Approver("fiona", "finance")


def _status(store: SQLStore, approval_id: str, status: str) -> None:
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :i"), {"s": status, "i": approval_id}
        )


def test_a_denial_behind_an_edited_denied_column_is_recorded_and_holds(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    _status(store, out.approval_id, "denied")  # edited outside effectgate: no sealed denial
    gate.deny(out.approval_id, approver=FIONA, reason="not this one")
    assert [d.decision for d in store.all_decisions()] == ["deny"]
    _status(store, out.approval_id, "pending")  # edited back: the sealed denial still decides
    with pytest.raises(AlreadyDecided):
        gate.approve(out.approval_id, version=1, approver=FIONA)
    assert shop.receiver.count("refund") == 0


def test_a_second_denial_of_a_sealed_denied_version_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    gate.deny(out.approval_id, approver=FIONA, reason="no")
    with pytest.raises(AlreadyDecided):
        gate.deny(out.approval_id, approver=FIONA, reason="no again")
    assert [d.decision for d in store.all_decisions()] == ["deny"]
