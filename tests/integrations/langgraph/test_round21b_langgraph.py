"""Round 21 (b): the LangGraph adapter reviewed after each gated call's task began registering
its own call (git 235297e), reproduced first.

1. A step with two calls of one gated tool, one of them under a tool-call id another call of the
   step carries too: the reused-id call was dropped before the parallel-calls rule counted the
   step's calls, so the other refund was registered and paused (node and middleware). The rule
   says two calls of one gated tool in one step register neither. Fixed (`_step.settle_step`):
   such a call still counts (the core refuses them all); it is settled by none.
2. GatedToolNode fed one call per task by a router's `Send` that changed the call (a cap on the
   amount, as create_agent's outer middleware may): the node registered the state's call, so
   the reviewer was shown, and the gate ran, the model's 12000; then the call the task was sent
   no longer matched what was settled and the model was told "nothing was registered or ran"
   for a refund that had run. Fixed (`_node._flow`): the task's calls are settled as it was sent
   them, as the middleware settles a call an outer middleware changed (a call the router made
   or renamed, alone: a refund sent on as a lookup no longer registers the refund).
3. EffectGateMiddleware under an outer middleware that makes a second gated call in the same
   task once the model's refund ran (a notification email): the email's answer never reached
   it. On the next run the refund's step, settled from the store, took every answer of the
   task at a slot where a gate's step had paused (`_shown._take`), the email's too, so the
   email asked again at the next slot: a token answer was lost, and a HITL approve was asked
   for again on every resume, forever. Fixed (`_shown._step_slots`): a settled step takes only
   the answers of pauses that listed its own approvals.
4. `resume(decisions, interrupts)` raised a raw TypeError for an interrupt whose payload says
   `type: effectgate.approval` with `requests` that is not a list (a tool's own interrupt copying
   the type). Fixed: such an interrupt lists no approval (it gets only decisions naming none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt, Send

from effectgate import Approver
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import EffectGateMiddleware, GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, ShopGate, grant

from ._graph import paused_of
from .conftest import MakeLangGraphHarness

CONFIG: Any = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}
ROLE = {"refund_order": Approver("fiona", "finance"), "cancel_subscription": Approver("bill", "billing")}
#: Two refunds in one step, the second under an id a read of the step carries too.
REUSED = step(
    call("refund_order", id="a", **REFUND),
    call("refund_order", id="dup", **{**REFUND, "order_id": "1043", "amount": 300}),
    call("get_order", id="dup", order_id="1043"),
)


def test_a_refund_beside_another_under_a_reused_id_is_not_registered(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two refunds in one step register neither, though one of them shares its id with a read."""
    h = node_or_agent(Script([REUSED, say("I will ask again.")]))
    turn = h.send("Refund 1042 and 1043", message_id="m3")
    assert turn.paused == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.reads["get_order"] == 0
    assert all(not r.ok for r in turn.results)
    h.script.assert_complete()


@pytest.mark.parametrize("checkpointer", ["memory"], indirect=True)  # SqliteSaver has no async API
def test_the_same_under_ainvoke(node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate) -> None:
    """The same step through `ainvoke` (the node's async path, the middleware's awrap_tool_call)."""
    h = node_or_agent(Script([REUSED, say("I will ask again.")]))
    turn = asyncio.run(h.ainvoke({"messages": [HumanMessage("Refund 1042 and 1043", id="m3")]}))
    assert turn.paused == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("refund") == 0


def _capped(c: ToolCall) -> ToolCall:
    if c["name"] != "refund_order":
        return c
    return {**c, "args": {**c["args"], "amount": 5000}}


def _previewed(c: ToolCall) -> ToolCall:
    """A router that sends a refund to the order lookup instead (same id)."""
    if c["name"] != "refund_order":
        return c
    return {**c, "name": "get_order", "args": {"order_id": c["args"]["order_id"]}}


def _send_graph(
    shop_gate: ShopGate, script: Script, change: Callable[[ToolCall], ToolCall]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """GatedToolNode fed one call per task by a router that changes a call on its way."""
    tools = GatedToolNode(shop_gate.gate, agent_id="support")
    model = ScriptedChatModel(script=script).bind_tools(list(tools.tools_by_name.values()))

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> Any:
        last = state["messages"][-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return END
        return [
            Send("tools", {"__type": "tool_call_with_context", "tool_call": change(c), "state": state})
            for c in last.tool_calls
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def _answer(shop_gate: ShopGate, out: Any) -> Any:
    decisions = {p.approval_id: approve(grant(shop_gate.gate, p, ROLE[p.tool])) for p in paused_of(out)}
    return resume(decisions, out.interrupts)


def _tool_messages(out: Any) -> dict[str, ToolMessage]:
    return {str(m.name): m for m in out.value["messages"] if isinstance(m, ToolMessage)}


@pytest.mark.parametrize("sibling", [False, True], ids=["alone", "with-gated-sibling"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_a_send_capped_is_gated_as_it_was_sent(shop_gate: ShopGate, sibling: bool, mode: str) -> None:
    """The reviewer is shown, and the gate runs once, the 5000 the router sent; the model is
    told the refund ran (never "nothing ran" for a refund that ran)."""
    calls = [call("refund_order", **REFUND)]
    calls += [call("cancel_subscription", subscription_id="sub_u1")] if sibling else []
    graph = _send_graph(shop_gate, Script([step(*calls), say("Done.")]), _capped)
    message = {"messages": [HumanMessage("Refund 1042", id="m3")]}
    if mode == "sync":
        out = graph.invoke(message, CONFIG, context=CONTEXT, version="v2")
        done = graph.invoke(_answer(shop_gate, out), CONFIG, context=CONTEXT, version="v2")
    else:

        async def run() -> tuple[Any, Any]:
            out = await graph.ainvoke(message, CONFIG, context=CONTEXT, version="v2")
            return out, await graph.ainvoke(_answer(shop_gate, out), CONFIG, context=CONTEXT, version="v2")

        out, done = asyncio.run(run())
    cards = {r["tool"]: r["card"]["args"] for i in out.interrupts for r in i.value["requests"]}
    assert cards["refund_order"]["amount"] == 5000
    assert done.interrupts == ()
    receiver = shop_gate.shop.receiver
    assert [e.payload["amount"] for e in receiver.effects if e.kind == "refund"] == [5000]
    assert receiver.count("cancel") == (1 if sibling else 0)
    refund = _tool_messages(done)["refund_order"]
    assert refund.status != "error"
    assert "5000" in str(refund.content)
    assert shop_gate.gate.audit().clean


def test_a_refund_a_send_turned_into_a_read_registers_nothing(shop_gate: ShopGate) -> None:
    """The router sent the lookup in the refund's place: the lookup runs once, and no refund
    is registered (none the reviewer is asked for, none that could run)."""
    graph = _send_graph(shop_gate, Script([step(call("refund_order", **REFUND)), say("Done.")]), _previewed)
    out = graph.invoke(
        {"messages": [HumanMessage("Refund 1042", id="m3")]}, CONFIG, context=CONTEXT, version="v2"
    )
    assert out.interrupts == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.reads["get_order"] == 1


NOTICE: ToolCall = {"name": "send_email", "args": EMAIL, "id": "notice-1", "type": "tool_call"}


class _Notifying(AgentMiddleware):  # type: ignore[type-arg]
    """An application's middleware, outside the gate: after a refund, email the customer."""

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        out = handler(request)
        if request.tool_call["name"] == "refund_order":
            handler(request.override(tool_call=NOTICE))
        return out

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        out = await handler(request)
        if request.tool_call["name"] == "refund_order":
            await handler(request.override(tool_call=NOTICE))
        return out


@pytest.mark.parametrize("how", ["token", "hitl"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_made_after_a_settled_refund_in_its_task_gets_its_own_answer(
    shop_gate: ShopGate, how: str, mode: str
) -> None:
    """The refund is answered, runs once; then the email is answered, and runs once: the
    refund's step, answered from the store on the email's resume, leaves the email its answer."""
    reviewer: list[Approver] = []
    gated = EffectGateMiddleware(
        shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=lambda config, context: reviewer[-1]
    )
    model = ScriptedChatModel(script=Script([step(call("refund_order", **REFUND)), say("Refunded.")]))
    agent = create_agent(model, middleware=[_Notifying(), gated], checkpointer=InMemorySaver())

    async def invoke(value: Any) -> Any:
        if mode == "async":
            return await agent.ainvoke(value, CONFIG, context=CONTEXT, version="v2")
        return await asyncio.to_thread(agent.invoke, value, CONFIG, context=CONTEXT, version="v2")

    async def run() -> tuple[list[str], Any]:
        out = await invoke({"messages": [HumanMessage("Refund 1042", id="m3")]})
        asked: list[str] = []
        for approver in (FINANCE, SUPPORT_LEAD):  # the refund's pause, then the email's
            [paused] = paused_of(out)
            asked.append(paused.tool)
            if how == "token":
                token = grant(shop_gate.gate, paused, approver)
                out = await invoke(resume({paused.approval_id: approve(token)}, out.interrupts))
            else:
                reviewer.append(approver)
                [pause] = out.interrupts
                out = await invoke(Command(resume={pause.id: {"decisions": [{"type": "approve"}]}}))
        return asked, out

    asked, done = asyncio.run(run())
    assert asked == ["refund_order", "send_email"]
    assert done.interrupts == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 1
    assert sorted(a.status for a in shop_gate.store.approvals()) == ["executed", "executed"]


@pytest.mark.parametrize("requests", [None, 5, "r"])
def test_resume_reads_an_interrupt_without_a_list_of_requests_as_listing_none(requests: object) -> None:
    """Beside the gate's own interrupt, one whose `requests` is not a list gets no decision."""
    ours = Interrupt(value={"type": "effectgate.approval", "requests": [{"approval_id": "a1"}]}, id="i1")
    copied = Interrupt(value={"type": "effectgate.approval", "requests": requests}, id="i2")
    command = resume({"a1": approve("token")}, [ours, copied])
    assert command.resume == {"i1": {"a1": {"type": "approve", "token": "token"}}, "i2": {}}
