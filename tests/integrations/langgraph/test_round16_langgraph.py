"""Round 16: an approved call whose run's outcome is unknown, met again by a re-run of its step
(a sibling's answer, a fork from the paused checkpoint), plus guards for subgraphs, `Send` into
subgraphs, streaming and an async checkpointer with a pause.

The core answers a call whose approval is "approved" with `Pending`, also after its grant was
presented and the run ended `needs_reconciliation`. Before the fix the step listed that call as
waiting again: a HITL answer was refused ("it showed other calls"), a deny was refused (the
approval is executing) and the step never settled.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Send

from effectgate import Approver, Pending, Refused
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant
from tests.conformance.adapters import Paused as AdapterPaused

from ._graph import paused_of, shop_graph
from .test_hitl_decisions import decisions_of, reviewer

CFG: Any = {"configurable": {"thread_id": "s-ada"}}
CTX = {"user_id": "u1"}
BILL = Approver("bill", "billing")
HITL_APPROVE: dict[str, Any] = {"type": "approve"}


def hitl(*decisions: dict[str, Any]) -> Command[Any]:
    return Command(resume={"decisions": list(decisions)})


def tool_messages(out: Any) -> dict[str, ToolMessage]:
    return {str(m.name): m for m in out.value["messages"] if isinstance(m, ToolMessage)}


def statuses(shop_gate: ShopGate) -> dict[str, str]:
    return {a.tool: a.status for a in shop_gate.store.approvals()}


def graph(shop_gate: ShopGate, script: Script, checkpointer: BaseCheckpointSaver[Any]) -> Any:
    return shop_graph(
        shop_gate.gate, ScriptedChatModel(script=script), checkpointer=checkpointer, native_approver=FINANCE
    )


def test_an_unknown_outcome_is_not_asked_again_when_a_sibling_is_answered(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """A refund whose run timed out (it happened, unknown to the gate) while its sibling waits
    stays settled: the sibling's HITL answer applies, the step ends, the refund ran once and the
    model is told its outcome is unknown, not asked about it again."""
    shop_gate.shop.provider.timeouts_to_inject = 1
    script = Script(
        [
            step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1")),
            say("ok"),
        ]
    )
    g = graph(shop_gate, script, checkpointer)
    out = g.invoke({"messages": [HumanMessage("refund, cancel", id="m1")]}, CFG, context=CTX, version="v2")
    assert [r["tool"] for r in out.interrupts[0].value["requests"]] == ["refund_order", "cancel_subscription"]
    # fiona (finance) approves both: the refund runs (its reply is lost), the cancel is refused her
    out = g.invoke(hitl(HITL_APPROVE, HITL_APPROVE), CFG, context=CTX, version="v2")
    assert [r["tool"] for r in out.interrupts[0].value["requests"]] == ["cancel_subscription"]
    assert shop_gate.shop.receiver.count("refund") == 1

    out = g.invoke(hitl({"type": "reject", "message": "keep it"}), CFG, context=CTX, version="v2")
    assert out.interrupts == ()
    answers = tool_messages(out)
    assert answers["refund_order"].status == "error"
    assert "outcome is unknown" in str(answers["refund_order"].content)
    assert "keep it" in str(answers["cancel_subscription"].content)
    assert statuses(shop_gate) == {"refund_order": "approved", "cancel_subscription": "denied"}
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 0
    [execution] = shop_gate.store.executions()
    assert execution.status == "needs_reconciliation"
    script.assert_complete()


def test_a_fork_from_the_pause_after_an_unknown_outcome_asks_no_one(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """Time travel to the paused checkpoint after the approved refund's outcome became unknown:
    the re-run does not pause again for a call that may have run; it is told the outcome is
    unknown, nothing runs twice and no decision is recorded."""
    shop_gate.shop.provider.timeouts_to_inject = 1
    script = Script([call("refund_order", **REFUND), say("Unknown."), say("Still unknown.")])
    g = graph(shop_gate, script, checkpointer)
    out = g.invoke({"messages": [HumanMessage("refund", id="m1")]}, CFG, context=CTX, version="v2")
    [paused] = paused_of(out)
    [at_pause] = [s for s in g.get_state_history(CFG) if s.next == ("tools",)]
    g.invoke(
        resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, out.interrupts),
        CFG,
        context=CTX,
        version="v2",
    )

    fork = g.invoke(None, at_pause.config, context=CTX, version="v2")
    assert fork.interrupts == ()
    refund = tool_messages(fork)["refund_order"]
    assert refund.status == "error"
    assert "outcome is unknown" in str(refund.content)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert statuses(shop_gate) == {"refund_order": "approved"}
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [("fiona", "finance", "approve")]
    script.assert_complete()


def test_an_approval_answered_through_the_parent_of_a_subgraph_runs_once(shop_gate: ShopGate) -> None:
    """A gated node inside a subgraph pauses the parent; the answer by approval id (and a HITL
    answer addressed by the interrupt's id) reaches it through the parent, and the refund runs
    once, also when the parent is resumed again."""
    inner = shop_graph(
        shop_gate.gate,
        ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("Refunded.")])),
        checkpointer=None,
        native_approver=FINANCE,
    )
    builder = StateGraph(MessagesState)
    builder.add_node("inner", inner)
    builder.add_edge(START, "inner")
    g = builder.compile(checkpointer=InMemorySaver())
    out = g.invoke({"messages": [HumanMessage("refund", id="m1")]}, CFG, context=CTX, version="v2")
    assert len(out.interrupts) == 1
    plain = g.invoke(hitl(HITL_APPROVE), CFG, context=CTX, version="v2")  # nested: refused, how to answer
    [pause] = plain.interrupts
    assert "interrupt id" in str(pause.value["refused"])
    assert shop_gate.shop.receiver.count("refund") == 0
    done = g.invoke(Command(resume={pause.id: {"decisions": [HITL_APPROVE]}}), CFG, context=CTX, version="v2")
    assert done.interrupts == ()
    assert tool_messages(done)["refund_order"].status == "success"
    g.invoke(None, CFG, context=CTX, version="v2")
    assert shop_gate.shop.receiver.count("refund") == 1
    assert statuses(shop_gate) == {"refund_order": "executed"}


def _branch(shop_gate: ShopGate, script: Script) -> CompiledStateGraph[Any, Any, Any, Any]:
    node = GatedToolNode(shop_gate.gate, agent_id="support")
    return shop_graph(shop_gate.gate, ScriptedChatModel(script=script), checkpointer=None, node=node)


def test_send_fan_out_to_two_gated_subgraphs_runs_each_once(shop_gate: ShopGate) -> None:
    """`Send` fans out to two subgraphs, each pausing on its own gated call: one resume answers
    both by approval id, and each runs once."""
    builder = StateGraph(MessagesState)
    builder.add_node("a", _branch(shop_gate, Script([call("refund_order", **REFUND), say("A.")])))
    builder.add_node(
        "b", _branch(shop_gate, Script([call("cancel_subscription", subscription_id="sub_u1"), say("B.")]))
    )
    builder.add_conditional_edges(
        START,
        lambda s: [Send("a", {"messages": s["messages"]}), Send("b", {"messages": s["messages"]})],
        ["a", "b"],
    )
    g = builder.compile(checkpointer=InMemorySaver())
    out = g.invoke({"messages": [HumanMessage("both", id="m1")]}, CFG, context=CTX, version="v2")
    paused = paused_of(out)
    assert sorted(p.tool for p in paused) == ["cancel_subscription", "refund_order"]
    role = {"refund_order": FINANCE, "cancel_subscription": BILL}
    decisions = {p.approval_id: approve(grant(shop_gate.gate, p, role[p.tool])) for p in paused}
    done = g.invoke(resume(decisions, out.interrupts), CFG, context=CTX, version="v2")
    assert done.interrupts == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1


def test_a_hitl_answer_through_stream_is_applied_once(shop_gate: ShopGate) -> None:
    """Paused and resumed through `stream` (updates and messages), a plain HITL approve is this
    invoke's answer: the refund runs once."""
    g = graph(shop_gate, Script([call("refund_order", **REFUND), say("Refunded.")]), InMemorySaver())
    first = list(
        g.stream({"messages": [HumanMessage("refund", id="m1")]}, CFG, context=CTX, stream_mode="updates")
    )
    assert "__interrupt__" in first[-1]
    list(g.stream(hitl(HITL_APPROVE), CFG, context=CTX, stream_mode=["updates", "messages"]))
    assert g.get_state(CFG).next == ()
    assert shop_gate.shop.receiver.count("refund") == 1


def test_two_native_reviewers_under_ainvoke_and_an_async_sqlite_saver(
    shop_gate: ShopGate, tmp_path: Path
) -> None:
    """On AsyncSqliteSaver, pia's approve replayed when pat's reject resumes the step is not
    applied again as pat's: the deletion is denied and nothing runs."""
    aiosqlite = pytest.importorskip("aiosqlite")
    calls = "is_alive" in inspect.getsource(AsyncSqliteSaver.setup)  # langgraph-checkpoint-sqlite 3.0
    if calls and not hasattr(aiosqlite.Connection, "is_alive"):  # which aiosqlite 0.22 dropped
        pytest.skip("this aiosqlite and langgraph-checkpoint-sqlite do not work together (is_alive)")

    async def run() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
            node = GatedToolNode(shop_gate.gate, agent_id="support", native_approver=reviewer)
            script = Script([call("delete_customer_data", customer_id="u1"), say("Not deleted.")])
            g = shop_graph(shop_gate.gate, ScriptedChatModel(script=script), checkpointer=saver, node=node)
            await g.ainvoke({"messages": [HumanMessage("delete", id="m3")]}, CFG, context=CTX, version="v2")
            for name, decision in (("pia", HITL_APPROVE), ("pat", {"type": "reject", "message": "keep"})):
                as_reviewer = {"configurable": {"thread_id": "s-ada", "reviewer": name}}
                out = await g.ainvoke(hitl(decision), as_reviewer, context=CTX, version="v2")
            assert out.interrupts == ()

    asyncio.run(run())
    assert shop_gate.shop.receiver.count("delete") == 0
    assert statuses(shop_gate) == {"delete_customer_data": "denied"}


def test_the_core_answers_a_call_of_unknown_outcome_as_unknown(shop_gate: ShopGate) -> None:
    """The same call again, after its approved run's outcome became unknown, is not Pending."""
    shop_gate.shop.provider.timeouts_to_inject = 1
    ctx = context("m1")
    pending = shop_gate.gate.call("refund_order", REFUND, ctx)
    assert isinstance(pending, Pending)
    token = grant(
        shop_gate.gate, AdapterPaused(pending.approval_id, 1, pending.card.args_hash, "refund_order")
    )
    with pytest.raises(NeedsReconciliation):
        shop_gate.gate.execute(token)
    again = shop_gate.gate.call("refund_order", REFUND, ctx)
    assert isinstance(again, Refused), again
    assert again.code == "needs_reconciliation"
    assert shop_gate.shop.receiver.count("refund") == 1
