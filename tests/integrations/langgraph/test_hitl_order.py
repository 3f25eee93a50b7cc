"""A HumanInTheLoopMiddleware answer is matched by position to the calls the reviewer was shown,
whatever order the checkpoint holds them in when the node resumes; an answer given before the
checkpoint was edited is refused whole (the edited state runs as a new task, which showed nothing).

The order of a step's waiting calls (in the payload and when an answer is applied) comes from
the gate's store: the order their approvals were first proposed. Someone who can write the
checkpoint and reverses the paused AIMessage's tool calls (no id, name or argument changed, so
nothing mismatches) must not move the reviewer's approve onto the call they rejected. Effects
are counted at the receiver, and the decisions at the gate's store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, GraphOutput

from effectgate import Approver, EffectGate, money
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import GatedToolNode, deny, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel

from .test_async import spy_async
from .test_native import CFG, CONTEXT, ask, graph_of, invoke

FIONA = Approver("fiona", "finance")
EFFECTS = {
    "refund_order": money("finance", subject="order_id"),
    "issue_credit": money("finance", subject="customer"),
}
APPROVE: dict[str, Any] = {"type": "approve"}
NO_CREDIT: dict[str, Any] = {"type": "reject", "message": "No credit."}
#: Why an answer to a step whose pause no one was shown (a new task) is refused (`_shown`).
NO_RECORD = "the gate's store has no record of what it showed"


def finance_tools(receiver: EffectRecorder) -> list[BaseTool]:
    """Two money tools one finance reviewer may approve; each effect lands at `receiver`."""

    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return "refunded"

    @tool
    def issue_credit(customer: str, amount: int) -> str:
        """Issue store credit."""
        receiver.record("credit", customer=customer, amount=amount)
        return "credited"

    return [refund_order, issue_credit]


def two_calls(*later: Any) -> ScriptedChatModel:
    """One model step with a refund and a credit, in that order."""
    return ScriptedChatModel(
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


def node_of(receiver: EffectRecorder, db: str, gates: list[EffectGate]) -> GatedToolNode:
    node = gated_node(finance_tools(receiver), EFFECTS, agent_id="support", db=db, native_approver=FIONA)
    gates.append(node.gate)
    return node


def reverse_paused_calls(graph: Any) -> None:
    """What a writer of the checkpoint store can do: reverse the order of the paused AIMessage's
    tool calls (same message id, same call ids, names and arguments)."""
    [last] = [m for m in graph.get_state(CFG).values["messages"] if isinstance(m, AIMessage)][-1:]
    reordered = AIMessage(content=last.content, id=last.id, tool_calls=list(reversed(last.tool_calls)))
    graph.update_state(CFG, {"messages": [reordered]}, as_node="agent")
    assert [c["id"] for c in graph.get_state(CFG).values["messages"][-1].tool_calls] == ["c2", "c1"]


def shown(out: GraphOutput[Any]) -> list[str]:
    [pause] = out.interrupts
    return [a["name"] for a in pause.value["action_requests"]]


def approval_ids(out: GraphOutput[Any]) -> dict[str, str]:
    [pause] = out.interrupts
    return {r["tool"]: r["approval_id"] for r in pause.value["requests"]}


def decided(gate: EffectGate, approval_id: str) -> tuple[str, list[tuple[str, str, str | None]]]:
    """The approval's status and its decisions (approver, decision, reason) in the gate's store."""
    row = gate.store.get_approval(approval_id)
    assert row is not None
    with gate.store.reading() as conn:
        rows = gate.store.decisions(conn, approval_id)
    return row.status, [(d.approver_id, d.decision, d.reason) for d in rows]


def answer(names: Sequence[str], decisions: Mapping[str, Mapping[str, Any]]) -> Command[Any]:
    """The reviewer's HITL answer: the decision for each action request, in the order shown."""
    return Command(resume={"decisions": [dict(decisions[n]) for n in names]})


def test_a_reordered_checkpoint_does_not_move_a_hitl_decision(
    keyed_db: str, checkpointer: BaseCheckpointSaver[Any], gates: list[EffectGate]
) -> None:
    """Shown refund then credit, the reviewer approves the refund and rejects the credit; the
    checkpoint's calls are reversed before the answer arrives. The edited checkpoint runs the
    step as a new task, whose pause no one was shown: the answer is refused whole and nothing
    runs. The new payload lists the calls in the order first shown; answered, the refund runs
    once, approved by fiona, and the credit never runs, denied with the reviewer's reason."""
    receiver = EffectRecorder()
    node = node_of(receiver, keyed_db, gates)
    model = two_calls(say("Refunded, no credit."))
    graph = graph_of(node, model, checkpointer)
    out = invoke(graph, ask("refund 1042 please"))
    names, ids = shown(out), approval_ids(out)
    assert names == ["refund_order", "issue_credit"]  # an honest payload: the model's order

    reverse_paused_calls(graph)
    refused = invoke(graph, answer(names, {"refund_order": APPROVE, "issue_credit": NO_CREDIT}))
    [pause] = refused.interrupts
    assert all(NO_RECORD in r["reason"] for r in pause.value["refused"])
    assert receiver.effects == []
    assert [decided(node.gate, i) for i in ids.values()] == [("pending", []), ("pending", [])]

    assert shown(refused) == names
    done = invoke(graph, answer(names, {"refund_order": APPROVE, "issue_credit": NO_CREDIT}))

    assert done.interrupts == ()
    assert receiver.count("credit") == 0
    assert receiver.count("refund", order_id="1042", amount=10) == 1
    assert receiver.count() == 1
    assert decided(node.gate, ids["refund_order"]) == ("executed", [("fiona", "approve", None)])
    assert decided(node.gate, ids["issue_credit"]) == ("denied", [("fiona", "deny", "No credit.")])
    model.assert_complete()


def test_the_payload_keeps_the_order_the_reviewer_was_shown(
    keyed_db: str, checkpointer: BaseCheckpointSaver[Any], gates: list[EffectGate]
) -> None:
    """After the reorder, the next payload (here, after an answer of the wrong length) lists the
    calls in the order first shown, so the reviewer's next answer means what it says."""
    receiver = EffectRecorder()
    node = node_of(receiver, keyed_db, gates)
    model = two_calls(say("Credited, no refund."))
    graph = graph_of(node, model, checkpointer)
    first = invoke(graph, ask("refund 1042 please"))
    reverse_paused_calls(graph)
    again = invoke(graph, Command(resume={"decisions": [APPROVE]}))
    assert shown(again) == shown(first) == ["refund_order", "issue_credit"]
    assert approval_ids(again) == approval_ids(first)
    assert receiver.effects == []

    done = invoke(graph, answer(shown(again), {"refund_order": NO_CREDIT, "issue_credit": APPROVE}))
    assert done.interrupts == ()
    assert (receiver.count("refund"), receiver.count("credit", customer="mallory")) == (0, 1)
    ids = approval_ids(first)
    assert decided(node.gate, ids["refund_order"])[0] == "denied"
    assert decided(node.gate, ids["issue_credit"]) == ("executed", [("fiona", "approve", None)])
    model.assert_complete()


def test_a_positional_answer_is_refused_when_the_store_has_no_order(
    keyed_db: str, gates: list[EffectGate], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two calls waiting and no recorded proposal for one of them (a ledger altered outside
    effectgate), no order is beyond the checkpoint's reach: the HITL answer is refused whole and
    nothing runs; an answer by approval id still settles the step."""
    receiver = EffectRecorder()
    node = node_of(receiver, keyed_db, gates)
    model = two_calls(say("Nothing done."))
    graph = graph_of(node, model, InMemorySaver())
    out = invoke(graph, ask("refund 1042 please"))
    ids = approval_ids(out)
    recorded = node.gate.store.first_proposed
    monkeypatch.setattr(
        node.gate.store,
        "first_proposed",
        lambda approval_ids: {k: v for k, v in recorded(approval_ids).items() if k != ids["issue_credit"]},
    )

    refused = invoke(graph, answer(shown(out), {"refund_order": APPROVE, "issue_credit": NO_CREDIT}))
    [pause] = refused.interrupts
    reasons = [r["reason"] for r in pause.value["refused"]]
    assert len(reasons) == 2
    assert all(f"no record of when approval(s) {ids['issue_credit']} were proposed" in r for r in reasons)
    assert receiver.effects == []
    assert [decided(node.gate, i) for i in ids.values()] == [("pending", []), ("pending", [])]

    done = invoke(graph, resume({i: deny("Not now.") for i in ids.values()}, refused.interrupts))
    assert done.interrupts == ()
    assert receiver.effects == []
    assert [decided(node.gate, i)[0] for i in ids.values()] == ["denied", "denied"]
    model.assert_complete()


def test_the_order_is_read_off_the_event_loop(keyed_db: str, gates: list[EffectGate]) -> None:
    """The same attack through `ainvoke`: the answer to the reordered step is refused, the
    answer to its new payload runs the refund alone, and the store read that orders the calls
    runs in the driver's worker thread, not on the loop."""
    receiver = EffectRecorder()
    node = node_of(receiver, keyed_db, gates)
    model = two_calls(say("Refunded, no credit."))
    graph = graph_of(node, model, InMemorySaver())
    out = asyncio.run(graph.ainvoke(ask("refund 1042 please"), CFG, context=CONTEXT, version="v2"))
    names = shown(out)
    reverse_paused_calls(graph)
    used = spy_async(node.gate)
    value = answer(names, {"refund_order": APPROVE, "issue_credit": NO_CREDIT})
    refused = asyncio.run(graph.ainvoke(value, CFG, context=CONTEXT, version="v2"))
    assert receiver.effects == []
    assert shown(refused) == names
    value = answer(names, {"refund_order": APPROVE, "issue_credit": NO_CREDIT})
    done = asyncio.run(graph.ainvoke(value, CFG, context=CONTEXT, version="v2"))
    assert done.interrupts == ()
    assert (receiver.count("refund"), receiver.count("credit")) == (1, 0)
    assert "on_loop" not in used
    model.assert_complete()
