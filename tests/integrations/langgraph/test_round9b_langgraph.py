"""Review round 9b of the LangGraph adapter: `resume()` and interrupts that are not the gate's.

A step may have more than one pending interrupt: with `create_agent` and the gate's middleware
each tool call runs in its own task, so a tool of the application's that calls `interrupt()`
itself pauses next to the gate's interrupt. Its payload may be built from model text, which can
copy the gate's `"type": "effectgate.approval"`. Effects are counted at the receiver (the tool),
and the approval's status at the gate's store."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import GraphOutput, interrupt

from effectgate import Approver, EffectGate, money, read
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, gated_middleware, resume
from effectgate_langgraph.testing import ScriptedChatModel

CFG: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
CONTEXT = {"user_id": "u1"}
FIONA = Approver("fiona", "finance")


@pytest.mark.xfail(
    strict=True,
    reason=(
        "resume() has no gate, so it cannot tell the gate's interrupts (signed payloads) from a "
        "tool's own interrupt whose payload copies `type: effectgate.approval`: it answers that "
        "one too (with the decisions it lists, or none). Verifying needs the gate and the run's "
        "user id (the signature covers them): an API decision"
    ),
)
def test_resume_answers_only_the_gates_own_interrupt(store_url: str) -> None:
    receiver = EffectRecorder()

    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return "refunded"

    @tool
    def ask_customer(question: str) -> str:
        """Ask the customer something (the question is model text)."""
        answer = interrupt({"type": "effectgate.approval", "question": question, "requests": []})
        receiver.record("answer", answer=repr(answer))
        return f"the customer said: {answer}"

    effects = {"refund_order": money("finance", subject="order_id"), "ask_customer": read()}
    mw = gated_middleware([refund_order, ask_customer], effects, agent_id="support", db=store_url)
    gate: EffectGate = mw.gate
    try:
        model = ScriptedChatModel(
            script=Script(
                [
                    step(
                        call("refund_order", id="c1", order_id="1042", amount=10),
                        call("ask_customer", id="c2", question="Which card?"),
                    ),
                    say("Done."),
                ]
            )
        )
        tools = [refund_order, ask_customer]
        agent = create_agent(model, tools=tools, middleware=[mw], checkpointer=InMemorySaver())
        out: GraphOutput[Any] = agent.invoke(
            {"messages": [HumanMessage("refund 1042", id="m1")]}, CFG, context=CONTEXT, version="v2"
        )
        assert len(out.interrupts) == 2
        [card] = gate.pending()
        grant = gate.approve(card.approval_id, version=card.version, approver=FIONA)
        command = resume({card.approval_id: approve(grant.token)}, out.interrupts)
        after = agent.invoke(command, CFG, context=CONTEXT, version="v2")
        assert receiver.count("refund", order_id="1042", amount=10) == 1
        row = gate.store.get_approval(card.approval_id)
        assert row is not None
        assert row.status == "executed"
        # the customer's question is left unanswered (not answered with the reviewer's decisions)
        assert receiver.count("answer") == 0
        assert [i.value.get("question") for i in after.interrupts] == ["Which card?"]
    finally:
        gate.close()
