"""Where a HumanInTheLoopMiddleware answer comes from decides whether it is applied.

An answer applies only to the calls, versions and args hashes the reviewer was shown, whether it
is addressed by interrupt id or sent as a plain `Command(resume=...)`; an answer read back from
the checkpoint (LangGraph's replay, or a resume write put there by whoever holds it) is never
applied as a new decision; and the approver of any decision comes from the application, never
from the resume value. Each test counts effects at the receiver on the real LangGraph runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import NULL_TASK_ID, RESUME
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command

from effectgate import CallContext, flow
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import deny
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, ShopGate, grant

from ._graph import LangGraphHarness, edit_paused_call, paused_of, shop_graph
from ._paused import only_request, paused_refund, status_of
from .conftest import MakeLangGraphHarness
from .test_hitl_decisions import APPROVE, DELETE, as_reviewer, decisions_of, hitl, refusals, reject, reviewer

NO_RECORD = "the gate's store has no record of what it showed"


def with_finance(make: MakeLangGraphHarness) -> MakeLangGraphHarness:
    return lambda script, **options: make(script, native_approver=FINANCE, **options)


@pytest.mark.parametrize(
    "changes",
    [{"amount": 1}, {"amount": 3500, "order_id": "1043"}],
    ids=["same-subject", "other-subject"],
)
def test_a_plain_hitl_approve_after_the_paused_call_was_edited_runs_nothing(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, changes: Mapping[str, Any]
) -> None:
    """The paused call is rewritten in the checkpoint, then `{"decisions": [approve]}` arrives as
    a plain resume: the step's new task showed nothing, so the answer is refused whole; nothing
    is approved and nothing runs (the reviewer saw 12000 on 1042, not what the checkpoint holds now)."""
    h, paused = paused_refund(with_finance(node_or_agent), say("Refunded."))
    edit_paused_call(h.graph, h.config, changes)
    turn = h.invoke(hitl(APPROVE))
    assert len(turn.paused) == 1
    assert any(NO_RECORD in r for r in refusals(h))
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert decisions_of(shop_gate, paused.approval_id) == []
    assert [decisions_of(shop_gate, p.approval_id) for p in turn.paused] == [[]]


def test_a_plain_hitl_answer_cannot_move_onto_a_replaced_call(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two calls shown as [refund, email], answered [approve, reject]; before the answer the
    checkpoint replaces the refund with another one. Nothing runs: the reject is not applied to a
    call it was not given for, nor the approve to the email the reviewer rejected."""
    h = lg_harness(
        Script(
            [step(call("refund_order", id="c1", **REFUND), call("send_email", id="c2", **EMAIL)), say("ok")]
        ),
        native_approver=FINANCE,
    )
    h.send("Refund 1042 and email the customer", message_id="m3")
    state = h.graph.get_state(h.config)
    [last] = [m for m in state.values["messages"] if isinstance(m, AIMessage)][-1:]
    replaced = [
        {**last.tool_calls[0], "args": {**REFUND, "order_id": "1043", "amount": 3500}},
        last.tool_calls[1],
    ]
    h.graph.update_state(
        h.config,
        {"messages": [AIMessage(content=last.content, id=last.id, tool_calls=replaced)]},
        as_node="agent",
    )
    turn = h.invoke(hitl(APPROVE, reject("no mass email")))
    assert len(turn.paused) == 2
    assert any(NO_RECORD in r for r in refusals(h))
    assert shop_gate.shop.receiver.effects == []
    assert shop_gate.store.all_decisions() == []


def test_a_plain_hitl_approve_is_bound_to_the_version_shown(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A reviewer edits the waiting approval in the store after the pause (version 2); a plain
    approve given on the version 1 card is refused, and version 2 is neither approved nor run
    until its own payload is answered."""
    h, paused = paused_refund(with_finance(node_or_agent), say("Refunded."))
    ctx = CallContext(session_id="s-ada", origin_message_id="m3", user_id="u1", agent_id="support")
    edited = flow.drive(
        shop_gate.gate.flows.edit("refund_order", {**REFUND, "amount": 300}, ctx, editor="sam")
    )
    assert status_of(shop_gate, paused.approval_id) == ("pending", 2)
    assert getattr(edited, "version", None) == 2

    turn = h.invoke(hitl(APPROVE))
    assert [p.version for p in turn.paused] == [2]
    assert any("other calls (or versions) than the ones now waiting" in r for r in refusals(h))
    assert decisions_of(shop_gate, paused.approval_id) == []
    assert shop_gate.shop.receiver.count("refund") == 0

    done = h.invoke(hitl(APPROVE))  # the version 2 payload, answered
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=300) == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 2)


def continue_as_pat(h: LangGraphHarness, run: str) -> Any:
    """`invoke(None)`: the application continues the thread, in pat's request, with no answer."""
    if run == "sync":
        return h.graph.invoke(None, as_reviewer("pat"), context=h.context, version="v2")
    return asyncio.run(h.graph.ainvoke(None, as_reviewer("pat"), context=h.context, version="v2"))


def check_a_stored_approve_is_not_applied_again(h: LangGraphHarness, shop_gate: ShopGate, run: str) -> None:
    [paused] = h.send("Please delete my data", message_id="m3").paused
    assert h.invoke(hitl(APPROVE), as_reviewer("pia")).paused == (paused,)

    assert paused_of(continue_as_pat(h, run)) == (paused,)
    assert shop_gate.shop.receiver.count("delete") == 0
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [("pia", "privacy", "approve")]

    done = h.invoke(hitl(APPROVE), as_reviewer("pat"))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("delete", customer_id="u1") == 1
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [
        ("pia", "privacy", "approve"),
        ("pat", "privacy", "approve"),
    ]
    h.script.assert_complete()


def test_a_stored_approve_is_not_applied_again_by_a_continuation(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A destructive call: pia's approve counts once. The application then continues the thread
    with no answer (`invoke(None)`) in pat's request: LangGraph hands pia's stored answer to the
    step's next pause, and it is not applied as pat's. Pat's own approve then runs it once."""
    script = Script([call("delete_customer_data", id="call-1", **DELETE), say("Deleted.")])
    check_a_stored_approve_is_not_applied_again(
        node_or_agent(script, native_approver=reviewer), shop_gate, "sync"
    )


@pytest.mark.parametrize("agent", [False, True], ids=["node", "agent"])
def test_a_stored_approve_is_not_applied_again_on_the_async_path(shop_gate: ShopGate, agent: bool) -> None:
    """As above, continued with `ainvoke(None)` (an in-memory checkpointer: SqliteSaver is sync only)."""
    script = Script([call("delete_customer_data", id="call-1", **DELETE), say("Deleted.")])
    model = ScriptedChatModel(script=script)
    h = LangGraphHarness(shop_gate.gate, model, InMemorySaver(), agent=agent, native_approver=reviewer)
    check_a_stored_approve_is_not_applied_again(h, shop_gate, "async")


@pytest.mark.parametrize("write", ["task", "null"])
def test_a_resume_written_into_the_checkpoint_is_not_an_answer(
    node_or_agent: MakeLangGraphHarness,
    shop_gate: ShopGate,
    checkpointer: BaseCheckpointSaver[Any],
    write: str,
) -> None:
    """Whoever holds the checkpoint puts a HITL approve among its pending writes (the paused
    task's RESUME write, or the run's "null" one), and the application continues the thread with
    `invoke(None)`: no invoke brought that answer, so nothing is approved and nothing runs."""
    h, paused = paused_refund(with_finance(node_or_agent), say("Refunded."))
    state = h.graph.get_state(h.config)
    [task] = [t for t in state.tasks if t.interrupts]
    answer = {"decisions": [dict(APPROVE)]}
    if write == "task":
        checkpointer.put_writes(state.config, [(RESUME, [answer])], task.id)
    else:
        checkpointer.put_writes(state.config, [(RESUME, answer)], NULL_TASK_ID)
    turn = h.invoke(None)
    assert turn.paused == (paused,)
    assert shop_gate.shop.receiver.count("refund") == 0
    assert decisions_of(shop_gate, paused.approval_id) == []

    h.approve(paused, grant(shop_gate.gate, paused))  # the effectgate answer still works
    assert shop_gate.shop.receiver.count("refund") == 1


def test_a_deny_that_names_its_approver_is_refused(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A deny naming `approver` in the resume value is refused, nothing recorded; the same deny
    without it is recorded as the application's identity (the resume identity here)."""
    h, paused = paused_refund(node_or_agent, say("Declined."))
    named = {"type": "deny", "reason": "no", "approver": {"id": "fiona-the-cfo", "role": "finance"}}
    turn = h.decide({paused.approval_id: named})
    assert turn.paused == (paused,)
    [refused] = only_refused(h)
    assert "never as one named in the resume value" in refused
    assert shop_gate.store.all_decisions() == []

    h.decide({paused.approval_id: deny("no")})
    [decision] = shop_gate.store.all_decisions()
    assert (decision.approver_id, decision.role, decision.decision) == ("langgraph-resume", "finance", "deny")
    h.script.assert_complete()


def test_a_deny_is_recorded_as_the_native_approver_when_configured(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """As a HITL reject: an effectgate deny is recorded as the application's native approver when
    their role may decide the call."""
    h, paused = paused_refund(with_finance(node_or_agent), say("Declined."))
    h.decide({paused.approval_id: deny("no")})
    [decision] = shop_gate.store.all_decisions()
    assert (decision.approver_id, decision.role, decision.decision) == ("fiona", "finance", "deny")


def only_refused(h: LangGraphHarness) -> list[str]:
    assert only_request(h)["approval_id"]
    return refusals(h)


def test_a_plain_hitl_answer_in_a_nested_graph_is_refused_with_how_to_answer(
    shop_gate: ShopGate,
) -> None:
    """Inside a subgraph, LangGraph shows a task neither the invoke's input nor whether its plain
    resume is the invoke's or the checkpoint's: a plain HITL approve is refused, naming the
    interrupt-id form, and nothing runs; that form then runs the call once."""
    model = ScriptedChatModel(script=Script([call("refund_order", id="call-1", **REFUND), say("Refunded.")]))
    inner = shop_graph(shop_gate.gate, model, checkpointer=None, native_approver=FINANCE)
    outer_builder = StateGraph(MessagesState)
    outer_builder.add_node("inner", inner)
    outer_builder.add_edge(START, "inner")
    outer = outer_builder.compile(checkpointer=InMemorySaver())
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada", "user_id": "u1"}}
    out = outer.invoke({"messages": [HumanMessage("refund 1042", id="m3")]}, cfg, version="v2")
    [pause] = out.interrupts

    out = outer.invoke(hitl(APPROVE), cfg, version="v2")
    [pause] = out.interrupts
    [refused] = pause.value["refused"]
    assert "does not show whether the invoke that runs this task brought it" in refused["reason"]
    assert "Command(resume={interrupt.id: answer})" in refused["reason"]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.all_decisions() == []

    out = outer.invoke(Command(resume={pause.id: {"decisions": [dict(APPROVE)]}}), cfg, version="v2")
    assert out.interrupts == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    model.assert_complete()
