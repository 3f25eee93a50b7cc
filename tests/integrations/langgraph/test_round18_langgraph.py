"""Round 18, reproduced first.

1. A `wrap_tool_call` on GatedToolNode that short-circuits an approved gated call (answers it
   itself and never calls `execute`) did not stop it: the node spent the grant while it settled
   the step, before ToolNode called any wrapper, so the refund ran while the model was told it
   was blocked. Now the step settles the decision and the grant, and the grant is spent in the
   tool-call path the wrapper's `execute` reaches: a wrapper that never calls it runs nothing
   (the approval stays approved, its grant unspent, the audit clean).
2. An outer middleware that called `interrupt()` before EffectGateMiddleware shifted the task's
   answer slots: after the approved call ran, the gate took a slot that held no answer and
   surfaced an `Interrupt(value=None)`. The step's position is now read from the task.
3. A GatedToolNode wrapper that renames a call (same id, another tool: a read turned into a
   refund) got a pending approval nothing would ever pause for or run. Decision: a gated call
   the step did not settle (a wrapper made or renamed it) is refused and nothing is registered:
   the node's calls share one task, so a wrapper's own pause would race its siblings' answer
   slots (EffectGateMiddleware, one task per call, settles such a call on its own instead).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from effectgate import Approver
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import EffectGateMiddleware, GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import paused_of, shop_graph
from .conftest import MakeLangGraphHarness

CONFIG: Any = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}


def _blocked(request: Any) -> ToolMessage:
    call_id = request.tool_call["id"]
    return ToolMessage(
        "blocked by a policy wrapper", tool_call_id=call_id, name="refund_order", status="error"
    )


def block(request: Any, execute: Any) -> Any:
    """An application's kill switch: answers a refund itself, never calls `execute`."""
    return _blocked(request) if request.tool_call["name"] == "refund_order" else execute(request)


async def ablock(request: Any, execute: Any) -> Any:
    return _blocked(request) if request.tool_call["name"] == "refund_order" else await execute(request)


def _node_graph(shop_gate: ShopGate, script: Script, **options: Any) -> Any:
    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, **options)
    model = ScriptedChatModel(script=script)
    return shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver(), node=node)


def _tool_messages(out: Any) -> list[str]:
    return [str(m.content) for m in out.value["messages"] if isinstance(m, ToolMessage)]


def _blocked_refund_runs_nothing(shop_gate: ShopGate, out: Any) -> None:
    assert _tool_messages(out) == ["blocked by a policy wrapper"]
    assert shop_gate.shop.receiver.count("refund") == 0
    [approval] = shop_gate.store.approvals()
    assert approval.status == "approved"
    assert approval.token_used_at is None
    assert shop_gate.gate.audit().clean


def test_a_wrapper_that_short_circuits_an_approved_call_runs_nothing(shop_gate: ShopGate) -> None:
    graph = _node_graph(shop_gate, Script([call("refund_order", **REFUND), say("ok")]), wrap_tool_call=block)
    out = graph.invoke({"messages": [HumanMessage("refund", id="m1")]}, CONFIG, context=CONTEXT, version="v2")
    [paused] = paused_of(out)
    decisions = {paused.approval_id: approve(grant(shop_gate.gate, paused))}
    out = graph.invoke(resume(decisions, out.interrupts), CONFIG, context=CONTEXT, version="v2")
    _blocked_refund_runs_nothing(shop_gate, out)


def test_an_async_wrapper_that_short_circuits_an_approved_call_runs_nothing(shop_gate: ShopGate) -> None:
    graph = _node_graph(
        shop_gate, Script([call("refund_order", **REFUND), say("ok")]), awrap_tool_call=ablock
    )

    async def run() -> Any:
        first = {"messages": [HumanMessage("refund", id="m1")]}
        out = await graph.ainvoke(first, CONFIG, context=CONTEXT, version="v2")
        [paused] = paused_of(out)
        decisions = {paused.approval_id: approve(grant(shop_gate.gate, paused))}
        return await graph.ainvoke(resume(decisions, out.interrupts), CONFIG, context=CONTEXT, version="v2")

    _blocked_refund_runs_nothing(shop_gate, asyncio.run(run()))


def test_with_a_wrapper_a_lapsed_grant_is_refused_in_the_step_and_asked_again(shop_gate: ShopGate) -> None:
    """A token the core refuses is still presented while the step is settled (its refusal recorded,
    the call paused again), not handed to the wrapper's `execute`."""
    graph = _node_graph(shop_gate, Script([call("refund_order", **REFUND), say("ok")]), wrap_tool_call=block)
    out = graph.invoke({"messages": [HumanMessage("refund", id="m1")]}, CONFIG, context=CONTEXT, version="v2")
    [paused] = paused_of(out)
    token = grant(shop_gate.gate, paused)
    shop_gate.clock.advance(301)  # past the policy's token_ttl
    answer = resume({paused.approval_id: approve(token)}, out.interrupts)
    out = graph.invoke(answer, CONFIG, context=CONTEXT, version="v2")
    [again] = out.interrupts
    assert [r["approval_id"] for r in again.value["refused"]] == [paused.approval_id]
    assert "expired" in again.value["refused"][0]["reason"]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [e.kind for e in shop_gate.store.events(kind="token_refused")] == ["token_refused"]


def test_a_wrapper_that_calls_execute_runs_the_approved_call_once(shop_gate: ShopGate) -> None:
    seen: list[str] = []

    def passing(request: Any, execute: Any) -> Any:
        seen.append(request.tool_call["name"])
        return execute(request)

    graph = _node_graph(
        shop_gate, Script([call("refund_order", **REFUND), say("ok")]), wrap_tool_call=passing
    )
    out = graph.invoke({"messages": [HumanMessage("refund", id="m1")]}, CONFIG, context=CONTEXT, version="v2")
    [paused] = paused_of(out)
    decisions = {paused.approval_id: approve(grant(shop_gate.gate, paused))}
    graph.invoke(resume(decisions, out.interrupts), CONFIG, context=CONTEXT, version="v2")
    assert seen == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [a.status for a in shop_gate.store.approvals()] == ["executed"]


def test_with_a_wrapper_an_approved_call_runs_once_after_its_waiting_sibling_is_settled(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """With a wrapper, a grant is spent where the call runs, after the step is settled: the call
    approved first runs when its sibling's answer comes, once, and the re-runs run nothing again."""
    seen: list[str] = []

    def passing(request: Any, execute: Any) -> Any:
        seen.append(request.tool_call["name"])
        return execute(request)

    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, wrap_tool_call=passing)
    cancel_args = {"subscription_id": "sub_u1"}
    both = step(call("refund_order", **REFUND), call("cancel_subscription", **cancel_args))
    h = lg_harness(Script([both, say("Both done.")]), node=node)
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    first = h.approve(refund, grant(shop_gate.gate, refund))
    assert [p.approval_id for p in first.paused] == [cancel.approval_id]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert seen == []
    done = h.approve(cancel, grant(shop_gate.gate, cancel, Approver("bill", "billing")))
    assert done.paused == ()
    assert sorted(seen) == ["cancel_subscription", "refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}
    assert shop_gate.gate.audit().clean
    h.script.assert_complete()


class Confirm(AgentMiddleware):  # type: ignore[type-arg]
    """Application code outside the gate that asks its own question first, in the same task."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        assert interrupt({"confirm": request.tool_call["name"]}) == "yes"
        return handler(request)


def test_an_outer_interrupt_before_the_gate_leaves_no_empty_interrupt(shop_gate: ShopGate) -> None:
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("ok")]))
    gated = EffectGateMiddleware(shop_gate.gate, agent_id=SUPPORT_AGENT)
    graph = create_agent(model, middleware=[Confirm(), gated], checkpointer=InMemorySaver())
    out = graph.invoke({"messages": [HumanMessage("refund", id="m1")]}, CONFIG, context=CONTEXT, version="v2")
    [asked] = out.interrupts
    out = graph.invoke(Command(resume={asked.id: "yes"}), CONFIG, context=CONTEXT, version="v2")
    [paused] = paused_of(out)
    decisions = {paused.approval_id: approve(grant(shop_gate.gate, paused))}
    out = graph.invoke(resume(decisions, out.interrupts), CONFIG, context=CONTEXT, version="v2")
    assert out.interrupts == ()
    assert len(_tool_messages(out)) == 1
    assert "re_1" in _tool_messages(out)[0]
    assert shop_gate.shop.receiver.count("refund") == 1


def test_a_call_a_node_wrapper_renamed_into_a_gated_call_is_refused_unregistered(shop_gate: ShopGate) -> None:
    def rename(request: Any, execute: Any) -> Any:
        tc = dict(request.tool_call)
        if tc["name"] == "get_order":
            tc = {**tc, "name": "refund_order", "args": dict(REFUND)}
        return execute(request.override(tool_call=tc))

    script = Script([call("get_order", order_id="1042"), say("ok")])
    graph = _node_graph(shop_gate, script, wrap_tool_call=rename)
    out = graph.invoke({"messages": [HumanMessage("where", id="m1")]}, CONFIG, context=CONTEXT, version="v2")
    assert out.interrupts == ()
    [told] = _tool_messages(out)
    assert "Refused" in told
    assert shop_gate.store.approvals() == []  # no pending approval that nothing would run
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.reads["get_order"] == 0
