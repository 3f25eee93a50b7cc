"""Round 21: EffectGateMiddleware under an outer middleware that changes a gated call's arguments.

Each gated call's task registers its own call, as the outer middleware passed it on, and the
step's other calls of the same tool (the parallel-calls rule); it no longer registers its
siblings from the state, where the model's arguments are. Before, the reviewer was shown, and
the gate ran, the model's 12000 in place of the capped 5000 (round 20, strict xfail); settling
the changed call alone would have raced a gated sibling's task, which registered the step from
the state and amended the refund back to 12000.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Approver
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import EffectGateMiddleware, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import paused_of

BILL = Approver("bill", "billing")
CONTEXT = {"user_id": "u1"}
CONFIG: Any = {"configurable": {"thread_id": "s-ada"}}
BOTH = step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1"))


class _Capping(AgentMiddleware):  # type: ignore[type-arg]
    """An application's own middleware, outside the gate: no refund above 5000."""

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(_capped(request))

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(_capped(request))


def _capped(request: Any) -> Any:
    if request.tool_call["name"] != "refund_order":
        return request
    return request.override(
        tool_call={**request.tool_call, "args": {**request.tool_call["args"], "amount": 5000}}
    )


def _agent(shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], script: Script) -> Any:
    model = ScriptedChatModel(script=script)
    gated = EffectGateMiddleware(shop_gate.gate, agent_id=SUPPORT_AGENT)
    return create_agent(model, middleware=[_Capping(), gated], checkpointer=checkpointer)


def _answer(shop_gate: ShopGate, out: Any) -> Command[Any]:
    decisions = {}
    for p in paused_of(out):
        approver = BILL if p.tool == "cancel_subscription" else None
        token = grant(shop_gate.gate, p, approver) if approver else grant(shop_gate.gate, p)
        decisions[p.approval_id] = approve(token)
    return resume(decisions, out.interrupts)


def _check(shop_gate: ShopGate, out: Any, done: Any) -> None:
    cards = {r["tool"]: r["card"]["args"] for i in out.interrupts for r in i.value["requests"]}
    assert cards["refund_order"]["amount"] == 5000  # the reviewer is shown what runs
    assert done.interrupts == ()
    receiver = shop_gate.shop.receiver
    assert [e.payload["amount"] for e in receiver.effects if e.kind == "refund"] == [5000]
    assert receiver.count("cancel") == 1
    refund = next(a for a in shop_gate.store.approvals() if a.tool == "refund_order")
    assert (refund.status, refund.version) == ("executed", 1)  # never amended back and forth
    assert shop_gate.gate.audit().clean


@pytest.mark.parametrize("attempt", range(3))  # the two tasks register in either order
def test_a_capped_refund_beside_a_gated_sibling_runs_capped(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], attempt: int
) -> None:
    agent = _agent(shop_gate, checkpointer, Script([BOTH, say("Both done.")]))
    message = {"messages": [HumanMessage("Refund 1042 and cancel my subscription", id="m3")]}
    out = agent.invoke(message, CONFIG, context=CONTEXT, version="v2")
    assert len(paused_of(out)) == 2
    done = agent.invoke(_answer(shop_gate, out), CONFIG, context=CONTEXT, version="v2")
    _check(shop_gate, out, done)


def test_the_same_under_ainvoke(shop_gate: ShopGate) -> None:
    agent = _agent(shop_gate, InMemorySaver(), Script([BOTH, say("Both done.")]))
    message = {"messages": [HumanMessage("Refund 1042 and cancel my subscription", id="m3")]}

    async def run() -> tuple[Any, Any]:
        out = await agent.ainvoke(message, CONFIG, context=CONTEXT, version="v2")
        done = await agent.ainvoke(_answer(shop_gate, out), CONFIG, context=CONTEXT, version="v2")
        return out, done

    out, done = asyncio.run(run())
    _check(shop_gate, out, done)


def test_two_refunds_in_one_step_are_still_refused_together(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    two = step(call("refund_order", **REFUND), call("refund_order", **{**REFUND, "amount": 300}))
    agent = _agent(shop_gate, checkpointer, Script([two, say("I could not.")]))
    out = agent.invoke(
        {"messages": [HumanMessage("Refund 1042", id="m3")]}, CONFIG, context=CONTEXT, version="v2"
    )
    assert out.interrupts == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("refund") == 0
