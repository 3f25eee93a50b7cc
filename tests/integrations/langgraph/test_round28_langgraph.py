"""Round 28: the LangGraph adapter probed with the real runtime and scripted models.

No new defect was found; these guard the paths the earlier rounds did not cover:

1. Time travel across an amend: a fork from the checkpoint paused on version 1 (the old
   arguments), resumed with version 2's grant, runs nothing (its call no longer matches the
   approval) and does not amend the approval back; the grant is not spent, and the live branch
   resumed with it runs version 2 once.
2. `handle_tool_errors` (True, or a handler whose text invites the model to try another amount)
   never turns an unknown outcome into a tool error the model can correct around: the model's
   retries (another amount, the same call under a new id) are told the outcome is unknown, and
   the refund reached the provider once.
3. `astream` closed by its consumer mid-resume (before or after the tools step), then resumed
   again with the same HITL approve: the refund runs once and its execution succeeded.
4. `Send` fan-out to two gated subgraphs that make the same refund (same session, message and
   subject: one approval) in one super-step, both answered at once (HITL approve to each
   interrupt, or one grant token to both): the branches race for one grant, and the refund
   reaches the provider once; both branches are told its result.
5. A fork from the paused checkpoint after a HITL reject, resumed: the sealed denial stands,
   nothing runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, Send

from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant

from ._graph import paused_of, shop_graph
from .conftest import MakeLangGraphHarness

CFG: Any = {"configurable": {"thread_id": "s-ada"}}
CTX = {"user_id": "u1"}
HITL_APPROVE = Command(resume={"decisions": [{"type": "approve"}]})


def _node(shop_gate: ShopGate, **options: Any) -> GatedToolNode:
    return GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=FINANCE, **options)


def test_a_fork_from_before_an_amend_runs_nothing_and_leaves_the_grant_to_the_live_branch(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    lower = {**REFUND, "amount": 11000}
    h = lg_harness(Script([call("refund_order", **REFUND), call("refund_order", **lower), say("Done.")]))
    [v1] = h.send("Please refund order 1042", message_id="m1").paused
    [v2] = h.send("Actually refund 110 only", message_id="m2").paused
    assert (v2.approval_id, v2.version) == (v1.approval_id, 2)
    token = grant(shop_gate.gate, v2)
    live = h.graph.get_state(h.config).config
    [old] = [
        s
        for s in h.graph.get_state_history(h.config)
        if s.next == ("tools",) and s.values["messages"][-1].tool_calls[0]["args"]["amount"] == 12000
    ]
    fork = h.graph.update_state(old.config, None)
    answer = resume({v2.approval_id: approve(token)}, h.last.interrupts if h.last else ())
    out = h.graph.invoke(answer, fork, context=h.context, version="v2")
    assert [(p.approval_id, p.version) for p in paused_of(out)] == [(v2.approval_id, 2)]
    assert out.interrupts[0].value["refused"]
    assert shop_gate.shop.receiver.count("refund") == 0
    [row] = shop_gate.store.approvals()
    assert (row.version, row.status, row.token_used_at) == (2, "approved", None)
    out = h.graph.invoke(answer, live, context=h.context, version="v2")
    assert out.interrupts == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("refund", amount=11000) == 1
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]


@pytest.mark.parametrize("errors", ["true", "handler"])
def test_handle_tool_errors_never_lets_the_model_correct_around_an_unknown_outcome(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], errors: str
) -> None:
    shop_gate.shop.provider.timeouts_to_inject = 1
    handler: Any = True if errors == "true" else (lambda e: f"error {e}; try another amount")
    script = Script(
        [
            call("refund_order", **REFUND),
            call("refund_order", **{**REFUND, "amount": 11999}),
            call("refund_order", id="again", **REFUND),
            say("done"),
        ]
    )
    model = ScriptedChatModel(script=script)
    g = shop_graph(
        shop_gate.gate, model, checkpointer=checkpointer, node=_node(shop_gate, handle_tool_errors=handler)
    )
    out = g.invoke({"messages": [HumanMessage("refund 1042", id="m1")]}, CFG, context=CTX, version="v2")
    assert len(out.interrupts) == 1
    out = g.invoke(HITL_APPROVE, CFG, context=CTX, version="v2")
    assert out.interrupts == ()
    told = [str(m.content) for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert len(told) == 3
    assert all("outcome is unknown" in t and "another amount" not in t for t in told)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.approvals()) == 1
    script.assert_complete()


@pytest.mark.parametrize("mode", ["updates", "values"])
@pytest.mark.parametrize("after", [0, 1])
def test_astream_closed_mid_resume_then_resumed_again_refunds_once(
    shop_gate: ShopGate, mode: str, after: int
) -> None:
    script = Script([call("refund_order", **REFUND), say("done"), say("again")])
    model = ScriptedChatModel(script=script)
    g = shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver(), node=_node(shop_gate))

    async def run() -> None:
        out = await g.ainvoke(
            {"messages": [HumanMessage("refund 1042", id="m1")]}, CFG, context=CTX, version="v2"
        )
        assert out.interrupts
        stream = g.astream(HITL_APPROVE, CFG, context=CTX, stream_mode=mode)
        seen = 0
        async for _ in stream:
            if seen == after:
                break
            seen += 1
        await stream.aclose()
        if g.get_state(CFG).next:
            out = await g.ainvoke(HITL_APPROVE, CFG, context=CTX, version="v2")
            assert out.interrupts == ()

    asyncio.run(run())
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]
    assert [a.status for a in shop_gate.store.approvals()] == ["executed"]


def _branch(shop_gate: ShopGate, native: bool) -> Any:
    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=FINANCE if native else None)
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("Done.")]))
    return shop_graph(shop_gate.gate, model, checkpointer=None, node=node)


@pytest.mark.parametrize(("how", "mode"), [("hitl", "sync"), ("token", "sync"), ("hitl", "async")])
def test_two_send_branches_making_the_same_refund_in_one_super_step_refund_once(
    shop_gate: ShopGate, how: str, mode: str
) -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("a", _branch(shop_gate, how == "hitl"))
    builder.add_node("b", _branch(shop_gate, how == "hitl"))
    builder.add_conditional_edges(
        START,
        lambda s: [Send("a", {"messages": s["messages"]}), Send("b", {"messages": s["messages"]})],
        ["a", "b"],
    )
    g = builder.compile(checkpointer=InMemorySaver())

    def invoke(value: Any) -> Any:
        if mode == "sync":
            return g.invoke(value, CFG, context=CTX, version="v2")
        return asyncio.run(g.ainvoke(value, CFG, context=CTX, version="v2"))

    out = invoke({"messages": [HumanMessage("refund 1042", id="m1")]})
    paused = paused_of(out)
    assert len(paused) == 2
    assert len({p.approval_id for p in paused}) == 1
    if how == "token":
        answer = resume({paused[0].approval_id: approve(grant(shop_gate.gate, paused[0]))}, out.interrupts)
    for _ in range(3):  # the branch that lost the race is asked again, and then told the result
        if how == "hitl":
            answer = Command(resume={i.id: {"decisions": [{"type": "approve"}]} for i in out.interrupts})
        out = invoke(answer)
        if not out.interrupts:
            break
        if how == "token":
            answer = resume({}, out.interrupts)
    assert out.interrupts == ()
    told = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in told] == ["success", "success"]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]
    assert [(a.version, a.status, a.grants) for a in shop_gate.store.approvals()] == [(1, "executed", 1)]


def test_a_fork_from_the_pause_after_a_hitl_reject_runs_nothing(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    h = node_or_agent(
        Script([call("refund_order", **REFUND), say("No."), say("Still no.")]), native_approver=FINANCE
    )
    h.send("Please refund order 1042", message_id="m1")
    h.invoke(Command(resume={"decisions": [{"type": "reject", "message": "no"}]}))
    [at] = [s for s in h.graph.get_state_history(h.config) if s.interrupts][:1]
    turn = h.invoke(None, h.graph.update_state(at.config, None))
    if turn.paused:  # asked again: approved now, still nothing runs
        turn = h.invoke(HITL_APPROVE)
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False)]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["denied"]
    assert shop_gate.store.executions() == []
