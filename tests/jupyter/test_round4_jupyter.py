"""Review round 4 of the notebook card: a record that does not verify offers no live button."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, Pending
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.outcomes import TAMPERED_WARNING
from effectgate.stores import SQLStore

from ..core.conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def _state(store: SQLStore, shop_gate: ShopGate) -> object:
    return (
        [(a.id, a.status, a.version, a.token_hash) for a in store.approvals()],
        [d.model_dump() for d in store.all_decisions()],
        [e.model_dump() for e in store.executions()],
        shop_gate.shop.receiver.effects,
    )


def _edit(store: SQLStore, approval_id: str, column: str, value: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE eg_approvals SET {column} = :v WHERE id = :i"), {"v": value, "i": approval_id}
        )


@pytest.mark.parametrize("edited", ["args", "status"])
def test_a_record_that_does_not_verify_has_no_live_button(
    shop_gate: ShopGate, store: SQLStore, edited: str
) -> None:
    """A refund whose stored amount was edited in the database (its arguments no longer hash to
    the sealed value), or one approved and run whose status was edited back to 'pending': the
    card says the record does not verify, as the inbox does, and, as the inbox offers no form,
    its Approve and Deny buttons are disabled; pressing them changes nothing."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending), out
    if edited == "args":
        _edit(store, out.approval_id, "args_json", '{"amount":1,"currency":"GBP","order_id":"1042"}')
    else:
        gate.execute(gate.approve(out.approval_id, version=out.version, approver=FINANCE).token)  # type: ignore[union-attr]
        _edit(store, out.approval_id, "status", "pending")
    card = approval_card(gate, out.approval_id, approver=FINANCE, on_grant=lambda g: gate.execute(g.token))
    assert TAMPERED_WARNING in card.card.warnings
    before = _state(store, shop_gate)
    assert card.approve_button.disabled
    assert card.deny_button.disabled
    card.approve_button.click()  # a disabled button in a live notebook; here the handler still runs
    card.deny("no")
    assert _state(store, shop_gate) == before
    assert shop.receiver.count("refund") == (0 if edited == "args" else 1)
