"""A newcomer's first hour (round 13): the notebook card of a refund whose order id hides a
character that renders as nothing.

The card promises to write out every character that renders as nothing and to warn about
invisible characters. Unicode's default-ignorable code points render as nothing whatever their
category: besides the format characters (Cf) the card already catches, the Khmer inherent vowels
(U+17B4, U+17B5), the Mongolian free variation selectors (U+180B-U+180D, U+180F) and the
unassigned ones reserved as ignorable (U+2065, U+FFF0-U+FFF8, the rest of plane 14).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.jupyter import approval_card
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")
IGNORABLE = ["\u17b4", "\u17b5", "\u180b", "\u180c", "\u180d", "\u180f", "\u2065", "\ufff0", "\U000e0080"]


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock) -> Iterator[EffectGate]:
    def refund_order(order_id: str, amount: int) -> dict[str, Any]:
        return {"order_id": order_id, "amount": amount}

    table = EffectTable(
        [
            ToolSpec(
                name="refund_order",
                effect=Effect.MONEY,
                fn=refund_order,
                approver_role="finance",
                subject=("order_id",),
            )
        ]
    )
    table.allow("support", ["refund_order"])
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as made:
        yield made


@pytest.mark.parametrize("ch", IGNORABLE, ids=[f"U+{ord(c):04X}" for c in IGNORABLE])
def test_a_default_ignorable_character_is_warned_about_and_written_out(gate: EffectGate, ch: str) -> None:
    """`10<hidden>42` looks like order 1042 on the card: the card warns, and the HTML card
    shows a copy with it written out."""
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")
    out = gate.call("refund_order", {"order_id": f"10{ch}42", "amount": 12000}, ctx)
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, widgets=False)
    written = f"<U+{ord(ch):04X}>"
    assert any(written[1:-1] in w for w in card.card.warnings), card.card.warnings
    assert ch not in card.text()  # the text card prints the arguments as ASCII JSON
    assert html.escape(f"10{written}42") in card.html()
