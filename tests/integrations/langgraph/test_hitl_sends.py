"""A HumanInTheLoopMiddleware answer addressed to an interrupt lands only on the call that
interrupt showed, whatever task the checkpoint now puts that call in.

With `create_agent` and EffectGateMiddleware each gated call pauses in its own task (a `Send`),
and LangGraph names each interrupt after its task's position in the checkpoint. Someone who can
write the checkpoint and reverses the paused `Send`s (same checkpoint id, no call changed) must
not move the reviewer's approve of the refund onto the credit: the gate's store records what each
interrupt showed, and an answer given for another call is refused whole. Effects are counted at
the receiver, and the approvals' status at the gate's store.
"""

from __future__ import annotations

from typing import Any

import langgraph.types
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, GraphOutput

from effectgate import EffectGate
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import gated_middleware
from effectgate_langgraph.testing import ScriptedChatModel

from .test_hitl_order import APPROVE, EFFECTS, FIONA, NO_CREDIT, finance_tools

CFG: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
CONTEXT = {"user_id": "u1"}

#: Newer LangGraph gives a re-raised interrupt a new id (its slot); 1.2.15 names each after its task.
SLOT_IDS = hasattr(langgraph.types, "_interrupt_id")


def agent_of(receiver: EffectRecorder, db: str, gates: list[EffectGate], *later: Any) -> tuple[Any, Any]:
    """create_agent with the gate's middleware, a model step with a refund then a credit."""
    mw = gated_middleware(finance_tools(receiver), EFFECTS, agent_id="support", db=db, native_approver=FIONA)
    gates.append(mw.gate)
    model = ScriptedChatModel(
        script=Script(
            [
                step(
                    call("refund_order", id="c1", order_id="1042", amount=10),
                    call("issue_credit", id="c2", customer="mallory", amount=99999),
                ),
                *later,
            ]
        )
    )
    saver = InMemorySaver()
    return create_agent(model, middleware=[mw], checkpointer=saver), saver


def invoke(agent: Any, value: Any) -> GraphOutput[Any]:
    out: GraphOutput[Any] = agent.invoke(value, CFG, context=CONTEXT, version="v2")
    return out


def by_tool(out: GraphOutput[Any]) -> dict[str, Any]:
    """Each pending interrupt by the one tool its payload shows."""
    shown = {}
    for pause in out.interrupts:
        [request] = pause.value["action_requests"]
        shown[request["name"]] = pause
    return shown


def reverse_sends(saver: InMemorySaver) -> None:
    """What a writer of the checkpoint store can do: reverse the paused `Send`s of the latest
    checkpoint in place (same checkpoint id, same calls)."""
    checkpoint = saver.get_tuple(CFG).checkpoint  # type: ignore[union-attr]
    key = ("t1", "", "__pregel_tasks", checkpoint["channel_versions"]["__pregel_tasks"])
    sends = saver.serde.loads_typed(saver.blobs[key])
    saver.blobs[key] = saver.serde.dumps_typed(list(reversed(sends)))
    after = saver.get_tuple(CFG).checkpoint  # type: ignore[union-attr]
    assert after["id"] == checkpoint["id"]
    assert [s.arg[0]["id"] for s in after["channel_values"]["__pregel_tasks"]] == ["c2", "c1"]


def status(gate: EffectGate) -> dict[str, str]:
    return {row.tool: row.status for row in gate.store.approvals()}


def test_reversed_sends_do_not_move_a_hitl_decision(keyed_db: str, gates: list[EffectGate]) -> None:
    """The reviewer approves the refund's interrupt and rejects the credit's; the Sends are then
    reversed. Neither answer is applied: nothing runs, both approvals stay pending, and each new
    payload says why. Answering those payloads then decides each call as shown."""
    receiver = EffectRecorder()
    agent, saver = agent_of(receiver, keyed_db, gates, say("Refunded, no credit."))
    gate = gates[-1]
    shown = by_tool(invoke(agent, {"messages": [HumanMessage("refund 1042 please", id="m1")]}))
    assert set(shown) == {"refund_order", "issue_credit"}

    reverse_sends(saver)
    answers = {shown["refund_order"].id: {"decisions": [APPROVE]}, shown["issue_credit"].id: NO_CREDIT}
    out = invoke(agent, Command(resume=answers))

    assert receiver.count() == 0
    assert status(gate) == {"refund_order": "pending", "issue_credit": "pending"}
    again = by_tool(out)
    assert set(again) == {"refund_order", "issue_credit"}
    for pause in again.values():
        assert (pause.id not in answers) if SLOT_IDS else (pause.id in answers)
        [refused] = pause.value["refused"]
        assert "the reviewer saw" in refused["reason"]

    # the payloads now shown are what their tasks hold: answering them is honest
    answers = {again["refund_order"].id: {"decisions": [APPROVE]}, again["issue_credit"].id: NO_CREDIT}
    # Before slot ids (LangGraph 1.2.15) every interrupt of a task keeps its namespace's id; the
    # record of what each pause showed also names its answer slot, so the same holds there.
    done = invoke(agent, Command(resume=answers))
    assert done.interrupts == ()
    assert receiver.count("credit") == 0
    assert receiver.count("refund", order_id="1042", amount=10) == 1
    assert receiver.count() == 1
    assert status(gate) == {"refund_order": "executed", "issue_credit": "denied"}


def test_an_honest_run_applies_each_hitl_answer_to_its_own_call(
    keyed_db: str, gates: list[EffectGate]
) -> None:
    """Without tampering, per-interrupt HITL answers (a decisions list and a bare decision) are
    applied to the calls their interrupts showed."""
    receiver = EffectRecorder()
    agent, _ = agent_of(receiver, keyed_db, gates, say("Refunded, no credit."))
    shown = by_tool(invoke(agent, {"messages": [HumanMessage("refund 1042 please", id="m1")]}))
    answers = {shown["refund_order"].id: {"decisions": [APPROVE]}, shown["issue_credit"].id: NO_CREDIT}
    done = invoke(agent, Command(resume=answers))
    assert done.interrupts == ()
    assert receiver.count("refund", order_id="1042", amount=10) == 1
    assert receiver.count() == 1
    assert status(gates[-1]) == {"refund_order": "executed", "issue_credit": "denied"}
