"""Review round 29, OpenAI Agents adapter. A `@function_tool(strict_mode=False)` has an open schema
(no `additionalProperties: false`), and the SDK's own argument model drops a name the function
does not take. The core's round 26 rule, an argument the function does not take is `Invalid`
before anything is stored, did not reach these tools: the gate's function for an SDK tool takes
`**kwargs`. A refund naming an argument the function ignores was proposed and shown to the
approver (who approved what does not run), and a write ran and stored it. And arguments the
schema admits that the SDK's model refuses (a validator, which the SDK runs only after approval):
the approved run, which never called the function, was an unknown outcome that paged a person to
reconcile it; it is a definite failure. Scripted models drive the SDK's real Runner, effects are
counted at the receiver, and every test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from agents import Agent, Runner, RunState, Tool, function_tool
from pydantic import AfterValidator

from effectgate import EffectGate, Keyring, money, write
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context
from .test_native_approvals import FINANCE, REFUND, Shop
from .test_round20_openai import _output


def _odd(value: int) -> int:
    if value % 2 == 0:
        raise ValueError("amount must be odd")
    return value


class Loose:
    """A gated agent whose tools have open schemas (`strict_mode=False`), on `store_url`."""

    def __init__(self, store_url: str, script: list[Any]) -> None:
        self.receiver = receiver = EffectRecorder()

        @function_tool(strict_mode=False)
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        @function_tool(strict_mode=False)
        def add_note(order_id: str, text: str = "") -> str:
            """Add a note to an order."""
            receiver.record("note", order_id=order_id, text=text)
            return f"noted on {order_id}"

        @function_tool(strict_mode=False)
        def credit(order_id: str, **extra: int) -> str:
            """Credit an order; extra amounts go in `extra`."""
            receiver.record("credit", order_id=order_id, extra=json.dumps(extra))
            return f"credited {order_id}"

        @function_tool
        def pay(order_id: str, amount: Annotated[int, AfterValidator(_odd)]) -> str:
            """Pay an odd amount on an order (a validator the schema does not show)."""
            receiver.record("pay", order_id=order_id, amount=amount)
            return f"paid {amount} on {order_id}"

        effects = {
            "refund_order": money("finance", subject="order_id"),
            "add_note": write(),
            "credit": money("finance", subject="order_id"),
            "pay": money("finance", subject="order_id"),
        }
        tools: list[Tool] = [refund_order, add_note, credit, pay]
        base = Agent(name="support", model=ScriptedModel(Script(script)), tools=tools)
        self.agent = gate_agent(base, effects=effects, db=store_url, keyring=Keyring.generate())
        self.gate: EffectGate = gate_of(self.agent)

    def run(self) -> Any:
        return Runner.run_sync(self.agent, "Please act on my order", context=context("m1"))


@pytest.fixture
def loose(store_url: str) -> Iterator[Any]:
    made: list[Loose] = []

    def make(script: list[Any]) -> Loose:
        made.append(Loose(store_url, script))
        return made[-1]

    yield make
    for shop in made:
        shop.gate.close()


def test_a_refund_naming_an_argument_its_function_does_not_take_is_invalid_not_proposed(loose: Any) -> None:
    """`reason` is no parameter of refund_order: the SDK would drop it, so an approver would
    approve arguments that do not run. It is Invalid: no pause, no approval, nothing runs."""
    shop = loose([call("refund_order", id="c1", order_id="1042", amount=500, reason="goodwill"), say("No.")])
    result = shop.run()
    assert result.interruptions == []
    assert pending_approvals(result) == []
    assert "'reason' is not an argument of refund_order" in _output(result, "c1")
    assert shop.gate.store.approvals() == []
    assert shop.receiver.count("refund") == 0


def test_a_write_naming_an_argument_its_function_does_not_take_is_invalid_and_not_run(loose: Any) -> None:
    shop = loose([call("add_note", id="c1", order_id="1042", text="late", urgent=True), say("No.")])
    result = shop.run()
    assert "'urgent' is not an argument of add_note" in _output(result, "c1")
    assert shop.gate.store.executions() == []
    assert shop.receiver.count("note") == 0


def test_a_flat_extra_of_a_kwargs_tool_is_invalid_not_approved_to_fail_unrun(loose: Any) -> None:
    """A pin (it held: the SDK closes a `**extra` tool's schema): a flat `amount` is Invalid
    before anything is stored, never approved to fail unrun as an unknown outcome."""
    shop = loose([call("credit", id="c1", order_id="1042", amount=500), say("No.")])
    result = shop.run()
    assert result.interruptions == []
    told = _output(result, "c1")
    assert told.startswith("Invalid arguments for credit")
    assert "'amount'" in told
    assert shop.gate.store.approvals() == []
    assert shop.receiver.count("credit") == 0


def test_the_arguments_the_function_takes_still_pause_and_run(loose: Any) -> None:
    """A pin: every name the function takes (its `**extra` as one object, a defaulted argument
    left out) is accepted as before."""
    shop = loose(
        [
            step(
                call("credit", id="c1", order_id="1042", extra={"amount": 500}),
                call("add_note", id="c2", order_id="1042"),
            ),
            say("Done."),
        ]
    )
    result = shop.run()
    [paused] = pending_approvals(result)
    assert paused.tool == "credit"
    [row] = shop.gate.store.approvals()
    assert row.status == "pending"
    assert shop.receiver.count("credit") == 0
    assert _output(result, "c2") == "noted on 1042"
    assert shop.receiver.count("note", order_id="1042", text="") == 1


def test_a_refund_whose_arguments_the_sdk_model_refuses_fails_definitely_not_unknown(loose: Any) -> None:
    """`amount` 500 fits the schema; pay's validator refuses it. As in the SDK, the validator runs
    only after approval, and the function never runs. Before: that run was recorded
    needs_reconciliation (a person paged to reconcile what cannot have happened, the grant lost to
    an unknown outcome). Now it is a definite failure: its execution failed, nothing ran."""
    shop = loose([call("pay", id="c1", order_id="1042", amount=500), say("No."), say("Could not pay.")])
    first = shop.run()
    state = asyncio.run(RunState.from_string(shop.agent, first.to_state().to_string()))
    [paused] = pending_approvals(state)
    approve_as(shop.gate, state, paused, FINANCE)
    done = Runner.run_sync(shop.agent, state)
    told = _output(done, "c1")
    assert "reconcil" not in told
    assert [(e.status, e.tool) for e in shop.gate.store.executions()] == [("failed", "pay")]
    [row] = shop.gate.store.approvals()
    assert row.status != "needs_reconciliation"
    assert shop.receiver.count("pay") == 0


def test_a_streamed_paused_turn_with_a_read_beside_its_refund_resumed_twice_runs_each_once(
    store_url: str,
) -> None:
    """A pin (it held): one response reads order 1042 and refunds it; the streamed run pauses on
    the refund (the read runs once). The snapshot, natively approved by the configured approver,
    is resumed twice, streamed: the refund runs once, the read never again."""
    shop = Shop(
        store_url,
        [step(call("get_order", id="c0", order_id="1042"), REFUND), say("Refunded."), say("Again.")],
        native_approver=FINANCE,
    )

    async def conversation() -> None:
        first = Runner.run_streamed(shop.agent, "Refund 1042", context=context("m1"))
        assert [e async for e in first.stream_events()]  # the stream, drained
        text = first.to_state().to_string()
        for _ in range(2):
            state = await RunState.from_string(shop.agent, text)
            state.approve(state.get_interruptions()[0])
            again = Runner.run_streamed(shop.agent, state)
            assert [e async for e in again.stream_events()]

    try:
        asyncio.run(conversation())
        assert shop.receiver.count("get_order") == 1
        assert shop.receiver.count("refund", order_id="1042", amount=500) == 1
        assert [e.status for e in shop.gate.store.executions()] == ["succeeded"]
        [row] = shop.gate.store.approvals()
        assert row.status == "executed"
    finally:
        shop.gate.close()
