"""Round 10 (lead): ids no database can hold reach no query, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from effectgate import Approver
from effectgate.errors import UnknownApproval

from .conftest import ShopGate


@pytest.mark.parametrize("key", ["w_refund_order_\x00", "w_refund_order_\ud800"])
def test_reconciling_a_write_key_no_database_can_hold_is_unknown(shop_gate: ShopGate, key: str) -> None:
    """`gate.reconcile` of a write-shaped id holding a NUL or a lone surrogate (typed into the CLI
    or the inbox) raised PostgreSQL's refusal of the query (SQLite's for a surrogate): no record
    can have that key, so it is an unknown approval, and nothing is written."""
    gate = shop_gate.gate
    before = len(gate.store.events())
    with pytest.raises(UnknownApproval):
        gate.reconcile(key, approver=Approver("fiona", "finance"))
    assert len(gate.store.events()) == before
