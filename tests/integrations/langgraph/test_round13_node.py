"""Review round 13 of the LangGraph node, step and middleware. Effects are counted at the
receiver (the tool), and records are read back from the gate's store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from effectgate import Approver, EffectGate, Grant, money, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import approve, gated_middleware, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import shop_graph
from .test_review_round3 import CONTEXT

FIONA = Approver("fiona", "finance")


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("surface", ["node", "agent"])
def test_a_write_whose_tool_handled_its_own_error_is_recorded_failed_and_runs_on_retry(
    surface: str,
    is_async: bool,
    tmp_path: Path,
    gates: list[EffectGate],
    checkpointer: BaseCheckpointSaver[Any],
) -> None:
    """A write whose langchain tool turns its exception into an error ToolMessage itself
    (`handle_tool_error=True`) did not happen: the gate records the run as failed, and the
    model's retry of the same call runs the tool, as under ToolNode. (It was recorded as
    succeeded with the error text as its result, so the retry replayed the error and the note
    was never written.)"""
    receiver = EffectRecorder()
    attempts: list[str] = []

    def flaky(order_id: str) -> str:
        attempts.append(order_id)
        if len(attempts) == 1:
            raise ToolException("the notes service is down, try again")
        receiver.record("note", order_id=order_id)
        return "noted"

    add_note = StructuredTool.from_function(
        flaky, name="add_note", description="Add a note to an order.", handle_tool_error=True
    )
    db = f"sqlite:///{tmp_path}/eg.db"
    if is_async:  # SqliteSaver has no async methods
        checkpointer = InMemorySaver()
    script = Script([call("add_note", order_id="1042"), call("add_note", order_id="1042"), say("Noted.")])
    model = ScriptedChatModel(script=script)
    graph: Any
    if surface == "node":
        node = gated_node([add_note], {"add_note": write()}, db=db)
        gate = node.gate
        graph = shop_graph(gate, model, checkpointer=checkpointer, node=node)
    else:
        middleware = gated_middleware([add_note], {"add_note": write()}, db=db)
        gate = middleware.gate
        graph = create_agent(model, middleware=[middleware], checkpointer=checkpointer)
    gates.append(gate)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    ask = {"messages": [HumanMessage("note it", id="m3")]}
    out = (
        asyncio.run(graph.ainvoke(ask, cfg, context=CONTEXT, version="v2"))
        if is_async
        else graph.invoke(ask, cfg, context=CONTEXT, version="v2")
    )
    assert out.interrupts == ()
    assert receiver.count("note", order_id="1042") == 1
    assert [e.status for e in gate.store.executions()] == ["failed", "succeeded"]
    first = next(m for m in out.value["messages"] if isinstance(m, ToolMessage))
    assert first.status == "error"  # the tool's own message, as ToolNode gives it


def test_a_gated_call_whose_tool_handled_its_own_error_is_not_recorded_as_succeeded(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """An approved money call whose tool turned its exception into an error ToolMessage itself:
    the gate cannot tell whether the money moved (only a row's `definite_failures` say so), so
    the record is an unknown outcome for a person to reconcile, never a success."""

    def charge(invoice_id: str) -> str:
        raise ToolException("the payment provider timed out")

    pay_invoice = StructuredTool.from_function(
        charge, name="pay_invoice", description="Pay an invoice.", handle_tool_error=True
    )
    node = gated_node(
        [pay_invoice],
        {"pay_invoice": money("finance", subject="invoice_id")},
        db=f"sqlite:///{tmp_path}/eg.db",
    )
    gates.append(node.gate)
    script = Script([call("pay_invoice", invoice_id="inv-1"), say("Sorry.")])
    graph = shop_graph(node.gate, ScriptedChatModel(script=script), checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    out = graph.invoke({"messages": [HumanMessage("pay it", id="m3")]}, cfg, context=CONTEXT, version="v2")
    [request] = out.interrupts[0].value["requests"]
    granted = node.gate.approve(request["approval_id"], version=1, approver=FIONA)
    assert isinstance(granted, Grant)
    out = graph.invoke(
        resume({request["approval_id"]: approve(granted.token)}, out.interrupts),
        cfg,
        context=CONTEXT,
        version="v2",
    )
    assert out.interrupts == ()
    [execution] = node.gate.store.executions()
    assert execution.status == "needs_reconciliation"
    [answer] = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "error"
