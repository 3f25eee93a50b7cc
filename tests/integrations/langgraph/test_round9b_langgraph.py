"""Review round 9b of the LangGraph adapter: `resume()` and interrupts that are not the gate's.

A step may have more than one pending interrupt: with `create_agent` and the gate's middleware
each tool call runs in its own task, so a tool of the application's that calls `interrupt()`
itself pauses next to the gate's interrupt. Its payload may be built from model text, which can
copy the gate's `"type": "effectgate.approval"`. Effects are counted at the receiver (the tool),
and the approval's status at the gate's store. `resume(..., gate=, user_id=)` tells them
apart by the payload's signature."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import GraphOutput, interrupt

from effectgate import Approver, EffectGate, Grant, money, read
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, gated_middleware, resume
from effectgate_langgraph.testing import ScriptedChatModel

CFG: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
CONTEXT = {"user_id": "u1"}
FIONA = Approver("fiona", "finance")


class Paused(NamedTuple):
    agent: Any
    gate: EffectGate
    out: GraphOutput[Any]
    approval_id: str
    token: str
    receiver: EffectRecorder


@pytest.fixture
def paused(keyed_db: str) -> Iterator[Paused]:
    """A run paused on the gate's interrupt (a refund) and a tool's own look-alike (a question),
    the refund approved."""
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
    mw = gated_middleware([refund_order, ask_customer], effects, agent_id="support", db=keyed_db)
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
        agent = create_agent(
            model, tools=[refund_order, ask_customer], middleware=[mw], checkpointer=InMemorySaver()
        )
        out: GraphOutput[Any] = agent.invoke(
            {"messages": [HumanMessage("refund 1042", id="m1")]}, CFG, context=CONTEXT, version="v2"
        )
        assert len(out.interrupts) == 2
        [card] = gate.pending()
        grant = gate.approve(card.approval_id, version=card.version, approver=FIONA)
        assert isinstance(grant, Grant)
        yield Paused(agent, gate, out, card.approval_id, grant.token, receiver)
    finally:
        gate.close()


def test_resume_with_the_gate_answers_only_the_gates_own_interrupt(
    paused: Paused,
) -> None:
    agent, gate, out, approval_id, token, receiver = paused
    command = resume({approval_id: approve(token)}, out.interrupts, gate=gate, user_id="u1")
    after = agent.invoke(command, CFG, context=CONTEXT, version="v2")
    assert receiver.count("refund", order_id="1042", amount=10) == 1
    row = gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "executed"
    # the customer's question is left unanswered (never handed the reviewer's decisions or token)
    assert receiver.count("answer") == 0
    assert [i.value.get("question") for i in after.interrupts] == ["Which card?"]


def test_resume_for_another_user_answers_no_interrupt(
    paused: Paused,
) -> None:
    _agent, gate, out, approval_id, token, receiver = paused
    command = resume({approval_id: approve(token)}, out.interrupts, gate=gate, user_id="u2")
    assert command.resume == {}
    assert receiver.count("refund") == 0
    assert receiver.count("answer") == 0
    row = gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "approved"


@pytest.mark.parametrize("kwargs", [{"gate": "g"}, {"user_id": "u1"}, {"gate": "g", "user_id": ""}])
def test_resume_needs_gate_and_user_together(paused: Paused, kwargs: dict[str, Any]) -> None:
    _agent, gate, out, approval_id, token, _receiver = paused
    given = {k: gate if v == "g" else v for k, v in kwargs.items()}
    with pytest.raises(TypeError, match="resume"):
        resume({approval_id: approve(token)}, out.interrupts, **given)
    row = gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "approved"
