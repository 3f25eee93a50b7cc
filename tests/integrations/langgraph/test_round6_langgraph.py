"""Review round 6 of the LangGraph adapter: answers to a tool's own interrupt after a settled step."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, interrupt

from effectgate import Approver, EffectGate, Grant, money, read
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, gated_node
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import shop_graph

CONTEXT = {"user_id": "u1"}


@pytest.mark.parametrize("addressed", [True, False], ids=["by-id", "plain"])
@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_tool_question_after_a_plain_approval_map_gets_the_first_answer(
    keyed_db: str,
    gates: list[EffectGate],
    checkpointer: BaseCheckpointSaver[Any],
    addressed: bool,
    run: str,
) -> None:
    """The documented plain resume `Command(resume={approval_id: approve(token)})` (no interrupt
    id) settles the gated payment without taking an answer slot of the task; the read's own
    interrupt() then pauses at the task's first slot. The person's answer to that question must
    reach the read: it must not be taken for an answer to the gate's earlier pause (which was
    raised at the same slot), so the question is asked once and the tool gets its answer."""
    if run == "ainvoke" and isinstance(checkpointer, SqliteSaver):
        pytest.skip("SqliteSaver has no async methods")
    asked: list[Any] = []
    receiver = EffectRecorder()

    @tool
    def ask_user(question: str) -> str:
        """Ask the person a question."""
        answer = interrupt({"question": question})
        asked.append(answer)
        return str(answer)

    @tool
    def pay_invoice(invoice_id: str) -> str:
        """Pay an invoice."""
        receiver.record("pay", invoice_id=invoice_id)
        return "paid"

    effects = {"ask_user": read(), "pay_invoice": money("finance", subject="invoice_id")}
    node = gated_node([pay_invoice, ask_user], effects, db=keyed_db)
    gates.append(node.gate)
    script = Script(
        [step(call("pay_invoice", invoice_id="inv-1"), call("ask_user", question="colour?")), say("ok")]
    )
    graph = shop_graph(node.gate, ScriptedChatModel(script=script), checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}

    def go(value: Any) -> Any:
        if run == "invoke":
            return graph.invoke(value, cfg, context=CONTEXT, version="v2")
        return asyncio.run(graph.ainvoke(value, cfg, context=CONTEXT, version="v2"))

    out = go({"messages": [HumanMessage("pay inv-1, and ask me a colour", id="m3")]})
    [request] = out.interrupts[0].value["requests"]
    granted = node.gate.approve(request["approval_id"], version=1, approver=Approver("fiona", "finance"))
    assert isinstance(granted, Grant)
    out = go(Command(resume={request["approval_id"]: approve(granted.token)}))
    assert receiver.count("pay") == 1
    [question] = out.interrupts
    assert question.value == {"question": "colour?"}
    out = go(Command(resume={question.id: "blue"} if addressed else "blue"))
    assert [i.value for i in out.interrupts] == []
    assert asked == ["blue"]
    assert receiver.count("pay") == 1
