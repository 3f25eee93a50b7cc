"""Review round 30, OpenAI Agents adapter. Round 29 made arguments the SDK's model refuses after
approval a definite failure, but only where pydantic turned the refusal into a `ValidationError`
(a validator raising `ValueError` or `AssertionError`). A validator raising anything else (a
`TypeError`, a `KeyError`, an error of its own) escapes pydantic as itself, before the function
runs: the approved run was recorded an unknown outcome and paged a person to reconcile what cannot
have happened. Scripted models drive the SDK's real Runner, effects are counted at the receiver,
and every test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from agents import Agent, Runner, RunState, function_tool
from pydantic import AfterValidator

from effectgate import EffectGate, Keyring, money
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context
from .test_native_approvals import FINANCE
from .test_round20_openai import _output


class LimitLookupFailed(Exception):
    """A validator's own error: not one pydantic turns into a ValidationError."""


def _within_limit(value: int) -> int:
    if value > 100:
        raise LimitLookupFailed("the limit service could not be read")
    return value


def _typed(value: int) -> int:
    if value == 7:
        raise TypeError("seven is not a payable amount")
    return value


class Validated:
    """A gated agent whose money tools run validators that raise errors pydantic does not wrap."""

    def __init__(self, store_url: str, script: list[Any]) -> None:
        self.receiver = receiver = EffectRecorder()

        @function_tool
        def pay(order_id: str, amount: Annotated[int, AfterValidator(_within_limit)]) -> str:
            """Pay an amount on an order (a validator the schema does not show)."""
            receiver.record("pay", order_id=order_id, amount=amount)
            return f"paid {amount} on {order_id}"

        @function_tool
        def tip(order_id: str, amount: Annotated[int, AfterValidator(_typed)]) -> str:
            """Tip on an order (a validator the schema does not show)."""
            receiver.record("tip", order_id=order_id, amount=amount)
            return f"tipped {amount} on {order_id}"

        effects = {"pay": money("finance", subject="order_id"), "tip": money("finance", subject="order_id")}
        base = Agent(name="support", model=ScriptedModel(Script(script)), tools=[pay, tip])
        self.agent = gate_agent(base, effects=effects, db=store_url, keyring=Keyring.generate())
        self.gate: EffectGate = gate_of(self.agent)

    def approve_and_resume(self) -> Any:
        first = Runner.run_sync(self.agent, "Please act on my order", context=context("m1"))
        state = asyncio.run(RunState.from_string(self.agent, first.to_state().to_string()))
        [paused] = pending_approvals(state)
        approve_as(self.gate, state, paused, FINANCE)
        return Runner.run_sync(self.agent, state)


@pytest.fixture
def validated(store_url: str) -> Iterator[Any]:
    made: list[Validated] = []

    def make(script: list[Any]) -> Validated:
        made.append(Validated(store_url, script))
        return made[-1]

    yield make
    for shop in made:
        shop.gate.close()


@pytest.mark.parametrize(("tool", "amount"), [("pay", 500), ("tip", 7)])
def test_a_validator_raising_an_error_pydantic_does_not_wrap_fails_definitely_not_unknown(
    validated: Any, tool: str, amount: int
) -> None:
    """The validator runs after approval, as the SDK runs it, and the function never runs. Before:
    the run was recorded needs_reconciliation (a person paged, the grant lost to an unknown
    outcome). Now it is a definite failure, and the model is told the call failed."""
    shop = validated([call(tool, id="c1", order_id="1042", amount=amount), say("No."), say("Could not.")])
    done = shop.approve_and_resume()
    assert "reconcil" not in _output(done, "c1")
    assert [(e.status, e.tool) for e in shop.gate.store.executions()] == [("failed", tool)]
    [row] = shop.gate.store.approvals()
    assert row.status == "failed"
    [record] = shop.gate.store.idempotency_records()
    assert record.status == "failed"
    assert shop.receiver.count(tool) == 0


def test_arguments_its_validators_accept_still_run_once(validated: Any) -> None:
    shop = validated([call("pay", id="c1", order_id="1042", amount=40), say("Paying."), say("Paid.")])
    done = shop.approve_and_resume()
    assert _output(done, "c1") == "paid 40 on 1042"
    assert [(e.status, e.tool) for e in shop.gate.store.executions()] == [("succeeded", "pay")]
    assert shop.receiver.count("pay") == 1
