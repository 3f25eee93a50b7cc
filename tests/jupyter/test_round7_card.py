"""Round 7 of the notebook card: what the application's callback returns or raises is shown on the
card, never a raw traceback, and the card shows the record as it is once the tool ran."""

from __future__ import annotations

from typing import Any

import ipywidgets.widgets.widget as widget_module  # type: ignore[import-untyped]
import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Grant, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card

from ..core.conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
# a tool's exception quoting a model-written argument: erase the line, print a fake green line
SPOOF = "x\x1b[2K\r\x1b[32mExecuted: refund sent\x1b[0m"


class Shell:
    """What ipywidgets calls for a callback's exception in a notebook: `showtraceback()`, the raw
    traceback printed under the cell."""

    def __init__(self) -> None:
        self.tracebacks = 0

    def showtraceback(self, *args: Any, **kwargs: Any) -> None:
        self.tracebacks += 1


def test_a_result_json_cannot_write_is_shown_after_the_tool_ran(shop_gate: ShopGate) -> None:
    """An on_grant that runs the refund and returns a value JSON cannot write (a mapping keyed by
    tuples): the refund ran once, the card returns the grant and shows the record as executed,
    its buttons disabled, instead of raising TypeError with the card still showing 'pending' and
    live buttons."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending), out

    def resume(grant: Grant) -> Any:
        gate.execute(grant.token)
        return {("1042", "GBP"): "refunded"}

    card = approval_card(gate, out, approver=FINANCE, on_grant=resume)
    assert isinstance(card.approve(), Grant)
    assert shop.receiver.count("refund", order_id="1042") == 1
    assert gate.card(out.approval_id).status == "executed"
    assert card.card.status == "executed"
    assert card.approve_button.disabled
    assert card.deny_button.disabled


def test_a_tool_raising_under_the_button_prints_no_raw_traceback(
    make_gate: MakeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approve pressed on a payment whose tool raises an exception quoting the model's argument
    (terminal control sequences): the card records and shows the failure (its controls written
    out); the button's handler does not hand the exception to the notebook, which would print it
    as a raw traceback (the control sequences live) under the cell."""
    ran: list[str] = []

    def pay(payee: str, amount: int) -> dict[str, Any]:
        """Pay someone."""
        ran.append(payee)
        raise ValueError(f"unknown payee {payee}")

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", definite_failures=(ValueError,)
    )
    table = EffectTable([spec])
    table.allow_all("agent")
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent", run_id="r")
    out = gate.call("pay", {"payee": SPOOF, "amount": 5}, ctx)
    assert isinstance(out, Pending), out
    shell = Shell()
    monkeypatch.setattr(widget_module, "get_ipython", lambda: shell)
    card = approval_card(gate, out, approver=FINANCE, on_grant=lambda g: gate.execute(g.token))
    card.approve_button.click()
    assert ran == [SPOOF]
    assert gate.card(out.approval_id).status == "failed"
    assert shell.tracebacks == 0
    assert "Running it raised ValueError" in card.message
    assert "\x1b" not in card._status.value
    assert card.approve_button.disabled


def test_a_balance_json_cannot_write_does_not_take_the_text_card_down(make_gate: MakeGate) -> None:
    """A `balance` (display only) keyed by tuples: the HTML card shows it, and so does the text
    card, instead of raising TypeError; Approve still decides and the tool runs once."""
    ran: list[str] = []

    def pay(payee: str, amount: int) -> str:
        """Pay someone."""
        ran.append(payee)
        return "paid"

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        subject=("payee",),
        balance=lambda args, confirmation: {("GBP", "a1"): 100},
    )
    table = EffectTable([spec])
    table.allow_all("agent")
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent", run_id="r")
    out = gate.call("pay", {"payee": "ada", "amount": 5}, ctx)
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, widgets=False, on_grant=lambda g: gate.execute(g.token))
    assert "subject balance" in card.html()
    assert any(line.startswith("subject balance: ") and "a1" in line for line in card.text().splitlines())
    card.approve()
    assert ran == ["ada"]
    assert gate.card(out.approval_id).status == "executed"
