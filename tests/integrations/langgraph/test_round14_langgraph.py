"""Review round 14 of the LangGraph adapter (node, middleware, step). Effects are counted at the
receiver (the tool), and records are read back from the gate's store."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver

from effectgate import Approver, EffectGate, Grant, money
from effectgate.adapter import MissingIdentity
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, GatedToolNode, approve, gated_middleware, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import shop_graph

FIONA = Approver("fiona", "finance")
CONTEXT = {"user_id": "u1"}
CFG: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}


def _refund_graph(
    surface: str, db: str, gates: list[EffectGate], cp: BaseCheckpointSaver[Any], turns: list[Any]
) -> tuple[EffectGate, Any, EffectRecorder]:
    receiver = EffectRecorder()

    @tool
    def refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    effects = {"refund": money("finance", subject="order_id")}
    model = ScriptedChatModel(script=Script(turns))
    if surface == "node":
        node = gated_node([refund], effects, db=db)
        gates.append(node.gate)
        return node.gate, shop_graph(node.gate, model, checkpointer=cp, node=node), receiver
    middleware = gated_middleware([refund], effects, db=db)
    gates.append(middleware.gate)
    return middleware.gate, create_agent(model, middleware=[middleware], checkpointer=cp), receiver


def _refund_messages(out: Any) -> list[ToolMessage]:
    return [m for m in out.value["messages"] if isinstance(m, ToolMessage) and m.name == "refund"]


@pytest.mark.parametrize("surface", ["node", "agent"])
def test_a_forked_checkpoint_whose_call_was_edited_after_it_ran_is_not_answered_as_run(
    surface: str, keyed_db: str, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """The refund of 5 is approved and runs. Then the thread is forked from the paused
    checkpoint (time travel) with the paused call's amount edited to 999. Nothing runs again
    (the core replays), but the forked call for 999 was answered as a success carrying the
    refund of 5's result: the conversation recorded a 999 refund that never happened. A
    checkpoint call that is not what its approval ran (nor a reviewer's edit of it) must be
    answered as not run, as it is while the approval waits."""
    gate, graph, receiver = _refund_graph(
        surface,
        keyed_db,
        gates,
        checkpointer,
        [step(call("refund", order_id="o-1", amount=5)), say("Done."), say("Ok.")],
    )
    out = graph.invoke(
        {"messages": [HumanMessage("refund o-1", id="m1")]}, CFG, context=CONTEXT, version="v2"
    )
    [request] = [r for i in out.interrupts for r in i.value["requests"]]
    paused_at = graph.get_state(CFG).config
    grant = gate.approve(request["approval_id"], version=1, approver=FIONA)
    assert isinstance(grant, Grant)
    graph.invoke(
        resume({request["approval_id"]: approve(grant.token)}, out.interrupts),
        CFG,
        context=CONTEXT,
        version="v2",
    )
    assert receiver.count("refund", order_id="o-1", amount=5) == 1

    state = graph.get_state(paused_at)
    [last] = [m for m in state.values["messages"] if isinstance(m, AIMessage)][-1:]
    calls = [{**c, "args": {**c["args"], "amount": 999}} for c in last.tool_calls]
    as_node = "agent" if "agent" in graph.nodes else "model"
    fork = graph.update_state(
        paused_at, {"messages": [AIMessage(content="", id=last.id, tool_calls=calls)]}, as_node=as_node
    )
    forked = graph.invoke(None, fork, context=CONTEXT, version="v2")

    assert receiver.count("refund") == 1  # nothing ran again
    row = gate.store.get_approval(request["approval_id"])
    assert row is not None
    assert row.status == "executed"
    [answer] = _refund_messages(forked)
    assert answer.status == "error"  # the 999 refund is not reported as done
    assert answer.artifact[ARTIFACT_KEY]["outcome"] == "refused"
    assert answer.artifact[ARTIFACT_KEY]["approval_id"] == request["approval_id"]


@pytest.mark.parametrize("given", [42, ""])
@pytest.mark.parametrize("surface", ["node", "agent"])
def test_a_context_user_id_that_is_not_text_is_refused_not_replaced_by_the_configs(
    surface: str,
    given: object,
    keyed_db: str,
    gates: list[EffectGate],
    checkpointer: BaseCheckpointSaver[Any],
) -> None:
    """The runtime context names the user (an integer database id, or an empty one), and the
    config carries a default `user_id`. The context's value was read as absent and the call was
    proposed for the config's user instead: the run went on as someone the context never named.
    A user id the context gives must be used or refused, never silently swapped."""
    gate, graph, receiver = _refund_graph(
        surface, keyed_db, gates, checkpointer, [step(call("refund", order_id="o-1", amount=5)), say("Done.")]
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada", "user_id": "u-default"}}
    with pytest.raises(MissingIdentity, match="user_id"):
        graph.invoke(
            {"messages": [HumanMessage("refund o-1", id="m1")]}, cfg, context={"user_id": given}, version="v2"
        )
    assert receiver.count("refund") == 0
    assert gate.store.approvals() == []  # nothing proposed, for anyone


@pytest.mark.parametrize("surface", ["node", "agent"])
def test_a_gated_call_whose_id_is_not_valid_text_is_refused_not_a_crash(
    surface: str, keyed_db: str, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """The model's tool-call id holds a lone surrogate (what a JSON "\\ud800" decodes to). A read
    or write with that id runs as under ToolNode; the gated refund was registered (its subject
    held) and then the run raised ArgumentError signing the pause, on every retry: the thread
    could never go on. It is refused unregistered instead, as a reused id is; nothing runs."""
    gate, graph, receiver = _refund_graph(
        surface,
        keyed_db,
        gates,
        checkpointer,
        [step(call("refund", id="call-\ud800", order_id="o-1", amount=5)), say("Done.")],
    )
    out = graph.invoke(
        {"messages": [HumanMessage("refund o-1", id="m1")]}, CFG, context=CONTEXT, version="v2"
    )
    assert out.interrupts == ()
    assert receiver.count("refund") == 0
    assert gate.store.approvals() == []  # nothing registered: the subject is not held
    [answer] = _refund_messages(out)
    assert answer.status == "error"


def test_a_context_agent_id_that_is_not_text_is_refused_not_replaced_by_the_configs(
    keyed_db: str, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """As for the user: a node built without `agent_id` reads it from the run; the context's
    agent id (an integer) must not be read as absent and replaced by the config's default one,
    whose allowlist would then decide the call."""
    gate, _graph, receiver = _refund_graph(
        "node", keyed_db, gates, checkpointer, [step(call("refund", order_id="o-1", amount=5)), say("Done.")]
    )
    [refund] = list(_graph.nodes["tools"].bound.tools_by_name.values())
    node = GatedToolNode(gate, [refund])  # no agent_id: the run names it
    graph = shop_graph(
        gate,
        ScriptedChatModel(script=Script([step(call("refund", order_id="o-1", amount=5))])),
        checkpointer=checkpointer,
        node=node,
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada", "agent_id": "agent"}}
    with pytest.raises(MissingIdentity, match="agent_id"):
        graph.invoke(
            {"messages": [HumanMessage("refund o-1", id="m1")]},
            cfg,
            context={"user_id": "u1", "agent_id": 7},
            version="v2",
        )
    assert receiver.count("refund") == 0
    assert gate.store.approvals() == []
