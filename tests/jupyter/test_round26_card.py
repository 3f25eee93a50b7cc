"""Round 26: the notebook card's one-line form (its repr, what a list of cards or a console
prints) read the status column, which no seal covers: a refund that never ran, its column
edited to 'executed', printed as executed (and one that ran, edited to 'denied', as denied),
while the card itself says what the executions and sealed decisions say."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, Pending
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.stores import SQLStore

from ..core.conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def _edit_status(store: SQLStore, approval_id: str, status: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :v WHERE id = :i"), {"v": status, "i": approval_id}
        )


@pytest.mark.parametrize(
    ("ran", "column", "said"), [(False, "executed", "pending"), (True, "denied", "executed")]
)
def test_a_cards_repr_says_the_status_the_executions_say(
    shop_gate: ShopGate, store: SQLStore, ran: bool, column: str, said: str
) -> None:
    """A refund left pending with its column edited to 'executed', and one approved and run with
    its column edited to 'denied': the card's repr says pending and executed, as the card does."""
    shop, gate = shop_gate
    p = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(p, Pending), p
    card = approval_card(gate, p, approver=FINANCE, on_grant=lambda g: gate.execute(g.token), widgets=False)
    if ran:
        card.approve()
    _edit_status(store, card.approval_id, column)
    card.refresh()
    assert repr(card).endswith(f" v1 {said}>")
    assert shop.receiver.count("refund") == (1 if ran else 0)
