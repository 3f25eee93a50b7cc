"""Round 10: model text on the cards people print and decide from. `Card.render()` (what README's
first example and the notebooks print) writes out terminal controls and line breaks of model-written
text as the notebook's text card does; the notebook card refuses, when it is made, an approver or a
pending call it cannot decide with, instead of a raw AttributeError when its button is pressed."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.testing import Call, Say, Script, Step, call, say

from ..core.conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
# A model-written key that sets the terminal's title and then starts a line of its own.
KEY = "k\x1b]0;pwned\x07\nstatus: approved"
# A model-written value the tool's exception quotes: erase the line, back to its start, overwrite.
PAYEE = "x\x1b[2K\r\x1b[32mExecuted: refund sent\x1b[0m \u202eevil"


def raw_controls(text: str) -> set[str]:
    """The characters of `text` that drive a terminal, reorder it or break a line, but newline."""
    return {c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c not in "\n\t"}


def pay_gate(make_gate: MakeGate, calls: list[str]) -> Any:
    def pay(payee: str, amount: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Pay someone."""
        calls.append(payee)
        raise ValueError(f"unknown payee {payee}")

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", definite_failures=(ValueError,)
    )
    table = EffectTable([spec])
    table.allow_all("agent")
    return make_gate(table)


def test_card_render_never_prints_model_controls_or_extra_lines(make_gate: MakeGate) -> None:
    """`Card.render()` of a pending card whose arguments hold a key with terminal controls and a
    line break (named in its warning), and of the failed card whose reason quotes the tool's
    exception: every control written out, and no line the model wrote passes for a field."""
    calls: list[str] = []
    gate = pay_gate(make_gate, calls)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent", run_id="r")
    out = gate.call("pay", {"payee": PAYEE, "amount": 5, "meta": {KEY: "v"}}, ctx)
    assert isinstance(out, Pending), out
    pending = out.card.render()
    assert raw_controls(pending) == set(), repr(pending)
    assert not any(line.startswith("status: approved") for line in pending.splitlines())
    grant = gate.approve(out.approval_id, version=out.version, approver=FINANCE)
    with pytest.raises(ValueError, match="unknown payee"):
        gate.execute(grant.token)
    assert calls == [PAYEE]
    failed = gate.card(out.approval_id)
    assert failed.status == "failed"
    shown = failed.render()
    assert raw_controls(shown) == set(), repr(shown)
    assert "reason: ValueError: unknown payee x<U+001B>[2K<U+000D><U+001B>[32mExecuted" in shown
    assert not any(line.startswith("status: approved") for line in shown.splitlines())


def test_the_card_message_a_notebook_prints_holds_no_terminal_control(make_gate: MakeGate) -> None:
    """`card.message` (which the quick-start notebook prints) after a tool whose outcome is unknown
    raised quoting a model-written argument: erase-line and carriage return written out, so the
    printed message cannot overwrite itself with a line the model wrote (Jupyter's output area
    honours both); the tool ran once and the call awaits reconciliation."""
    calls: list[str] = []

    def pay(payee: str, amount: int) -> dict[str, Any]:
        """Pay someone."""
        calls.append(payee)
        raise ConnectionError(f"reset while paying {payee}")

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow_all("agent")
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent", run_id="r")
    out = gate.call("pay", {"payee": PAYEE, "amount": 5}, ctx)
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, widgets=False, on_grant=lambda g: gate.execute(g.token))
    card.approve()
    assert calls == [PAYEE]
    assert [r.key for r in gate.store.idempotency_records(status="needs_reconciliation")] != []
    assert "could not use the grant" in card.message
    assert raw_controls(card.message) == set(), repr(card.message)
    assert "x<U+001B>[2K<U+000D><U+001B>[32mExecuted" in card.message


@pytest.mark.parametrize("approver", ["fiona", ("fiona", "finance")])
def test_a_card_refuses_an_approver_that_is_not_an_approver(shop_gate: ShopGate, approver: Any) -> None:
    """An approver given as text or a tuple is refused when the card is made (a TypeError naming
    Approver), not by a raw AttributeError once Approve is pressed; nothing is decided."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 100, "currency": "GBP"}, context("m3"))
    assert isinstance(out, Pending), out
    with pytest.raises(TypeError, match="Approver"):
        approval_card(gate, out, approver=approver, widgets=False)
    assert gate.card(out.approval_id).status == "pending"


@pytest.mark.parametrize("pending", [None, 42, ["x"]])
def test_a_card_refuses_what_is_not_a_pending_call(shop_gate: ShopGate, pending: Any) -> None:
    """What is not a Pending, a Card or an approval id is refused with a TypeError that says what
    the card takes, not a raw AttributeError."""
    _, gate = shop_gate
    with pytest.raises(TypeError, match="approval id"):
        approval_card(gate, pending, approver=FINANCE, widgets=False)


@pytest.mark.parametrize(
    "turn",
    [
        Say(None),  # type: ignore[arg-type]
        Call("refund_order", ["1042", 500]),  # type: ignore[arg-type]
        Call(5, {}),  # type: ignore[arg-type]
        Call("refund_order", {"order_id": "1042"}, id=None),  # type: ignore[arg-type]
        Call("refund_order", {1: "1042"}),
        Step(5),  # type: ignore[arg-type]
    ],
    ids=["say-none", "args-list", "name-int", "id-none", "key-int", "step-of-a-number"],
)
def test_a_malformed_script_is_refused_when_written(turn: Any) -> None:
    """A turn that no adapter can replay as written (text that is not text, arguments that are not
    a mapping of text keys, a call without a text name or id) is refused by `Script` itself, with
    the turn named, not when a fake model first replays it (or replays something else)."""
    with pytest.raises(TypeError, match="turn 2 is"):
        Script([say("hi"), turn])


@pytest.mark.xfail(
    strict=True,
    reason="design: call()'s keyword `id` is the tool-call id, so a tool argument named `id` "
    "(get_user(id=...)) is silently taken as the call id; needs a renamed keyword (e.g. call_id=), "
    "which every suite's call(..., id=...) uses",
)
def test_a_tool_argument_named_id_is_scripted_as_an_argument() -> None:
    """`call("get_user", id="42")` reads as a call of get_user with id 42; the call it makes has no
    arguments at all (the tool then runs without its id, or is told it is missing)."""
    assert call("get_user", id="42").args == {"id": "42"}
