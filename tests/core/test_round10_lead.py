"""Round 10 (lead): ids no database can hold reach no query, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from effectgate import Approver
from effectgate.errors import StoreError, UnknownApproval
from effectgate.examples.shop import context

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


def test_close_stops_the_lease_renewal_even_when_the_last_reads_cannot_be_written(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gate.close()` wrote the buffered reads first and stopped the lease keeper after: a write
    that failed (the database gone) raised out of close and left the keeper's thread running. The
    reads stay buffered (a later flush writes them) and the error still reaches the caller."""
    gate = shop_gate.gate
    keeper = gate._settlement.leases
    keeper.hold("k", "owner")  # a lease being renewed: the keeper's thread runs
    assert keeper._thread is not None
    keeper.release("k", "owner")
    gate.call("get_order", {"order_id": "1042"}, context("m1"))  # a read, buffered

    def down(*_args: object, **_kwargs: object) -> None:
        raise StoreError("the database is unreachable")

    monkeypatch.setattr(gate.store, "append_reads", down)
    with pytest.raises(StoreError):
        gate.close()
    assert keeper._thread is None
    monkeypatch.undo()
    gate.flush()
    assert len(gate.store.events(kind="read")) == 1
