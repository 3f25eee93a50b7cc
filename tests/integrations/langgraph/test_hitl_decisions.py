"""langchain HumanInTheLoopMiddleware's answer, `Command(resume={"decisions": [...]})`, is bridged
to the gate, not refused and not bypassed.

Decisions match the payload's requests by position. A reject always closes the approval; an
approve goes through `gate.approve` as the application's `native_approver` (refused, naming that
setting, without one); an edit is effectgate's edit. Each test runs on the hand-built graph
(GatedToolNode) and on create_agent (EffectGateMiddleware) where both apply, with both
checkpointers, and counts effects at the receiver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Approver, CallContext, EffectGate, Pending
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import gated_middleware, gated_node
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, ShopGate, Turn, grant

from ._graph import LangGraphHarness
from ._paused import only_request, paused_refund, status_of
from .conftest import MakeLangGraphHarness
from .test_async import spy_async
from .test_native import EFFECTS, FIONA, ask, graph_of, invoke, refund_script, shop_tools

PIA = Approver("pia", "privacy")
PAT = Approver("pat", "privacy")
DELETE = {"customer_id": "u1"}
APPROVE: dict[str, Any] = {"type": "approve"}
LANGCHAIN_DEFAULT = "User rejected the tool call for `refund_order`."


def reject(message: str | None = None) -> dict[str, Any]:
    return {"type": "reject"} if message is None else {"type": "reject", "message": message}


def hitl(*decisions: Mapping[str, Any]) -> Command[Any]:
    """langchain's own resume: `Command(resume={"decisions": [...]})`, no interrupt id."""
    return Command(resume={"decisions": [dict(d) for d in decisions]})


def answer_by_tool(h: LangGraphHarness, decisions: Mapping[str, Mapping[str, Any]]) -> Turn:
    """Every pending interrupt answered in HITL's shape, addressed by its id: the decision for
    each of its action_requests in their order (create_agent pauses each call on its own)."""
    assert h.last is not None
    answers = {
        i.id: {"decisions": [dict(decisions[r["name"]]) for r in i.value["action_requests"]]}
        for i in h.last.interrupts
    }
    return h.invoke(Command(resume=answers))


def reviewer(config: RunnableConfig, context: Any) -> Approver | None:
    """The application's native approver: the privacy reviewer its request names, if any."""
    name = (config.get("configurable") or {}).get("reviewer")
    return Approver(name, "privacy") if isinstance(name, str) else None


def as_reviewer(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": "s-ada", "reviewer": name}}


def decisions_of(shop_gate: ShopGate, approval_id: str) -> list[tuple[str, str, str, str | None]]:
    with shop_gate.store.transaction() as conn:
        rows = shop_gate.store.decisions(conn, approval_id)
    return [(d.approver_id, d.role, d.decision, d.reason) for d in rows]


def refusals(h: LangGraphHarness) -> list[str]:
    assert h.last is not None
    return [r["reason"] for i in h.last.interrupts for r in i.value["refused"]]


def paused_delete(make: MakeLangGraphHarness, *later: Any, **options: Any) -> tuple[LangGraphHarness, Any]:
    h = make(Script([call("delete_customer_data", id="call-1", **DELETE), *later]), **options)
    [paused] = h.send("Please delete my data", message_id="m3").paused
    return h, paused


def test_a_hitl_reject_closes_the_approval_and_frees_the_subject(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A reject denies the approval with its message as the reason, recorded as hitl-reject with
    the row's role; nothing runs, and another session can propose on the same order at once."""
    h, paused = paused_refund(node_or_agent, say("Not refunded."))
    turn = h.invoke(hitl(reject("Not this order.")))
    assert turn.paused == ()
    [result] = turn.results
    assert (result.tool, result.ok) == ("refund_order", False)
    assert "Not this order." in result.content
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert (row.status, row.reason) == ("denied", "Not this order.")
    assert decisions_of(shop_gate, paused.approval_id) == [
        ("hitl-reject", "finance", "deny", "Not this order.")
    ]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    other = CallContext(session_id="s-other", origin_message_id="m9", user_id="u1", agent_id="support")
    again = shop_gate.gate.call("refund_order", REFUND, other)
    assert isinstance(again, Pending)
    assert again.approval_id != paused.approval_id
    h.script.assert_complete()


@pytest.mark.parametrize(
    ("native", "recorded_as"),
    [(None, "hitl-reject"), (FINANCE, "fiona"), (SUPPORT_LEAD, "hitl-reject")],
    ids=["no-approver", "approver-with-the-role", "approver-without-the-role"],
)
def test_a_hitl_reject_without_a_message_is_recorded_with_langchains_wording(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, native: Approver | None, recorded_as: str
) -> None:
    """A bare reject closes the approval with langchain's default wording as the reason, recorded
    as the native approver when their role decides the call, else as hitl-reject."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=native), say("Not refunded."))
    assert h.invoke(hitl(reject())).paused == ()
    [(approver, role, decision, reason)] = decisions_of(shop_gate, paused.approval_id)
    assert (approver, role, decision) == (recorded_as, "finance", "deny")
    assert reason is not None
    assert reason.startswith(LANGCHAIN_DEFAULT)
    assert status_of(shop_gate, paused.approval_id) == ("denied", 1)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_hitl_approve_with_a_native_approver_runs_once(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """`{"type": "approve"}` with `native_approver=fiona` approves through the gate as fiona and
    the refund runs exactly once, with an execution record."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE), say("Refunded."))
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", True)]
    assert shop_gate.shop.receiver.count("refund", order_id="1042", amount=12000) == 1
    assert len(shop_gate.store.executions(approval_id=paused.approval_id)) == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [("fiona", "finance", "approve")]
    h.script.assert_complete()


@pytest.mark.parametrize("agent", [False, True], ids=["node", "agent"])
def test_a_hitl_approve_runs_once_on_the_async_path(shop_gate: ShopGate, agent: bool) -> None:
    """The same through `ainvoke` (memory checkpointer: SqliteSaver has no async methods): the
    native approve runs the refund once, and no store work runs on the event loop."""

    def make(script: Script) -> LangGraphHarness:
        model = ScriptedChatModel(script=script)
        return LangGraphHarness(shop_gate.gate, model, InMemorySaver(), agent=agent, native_approver=FINANCE)

    h, paused = paused_refund(make, say("Refunded."))
    used = spy_async(shop_gate.gate)
    turn = asyncio.run(h.ainvoke(hitl(APPROVE)))
    assert turn.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
    assert "on_loop" not in used
    h.script.assert_complete()


def test_a_hitl_approve_without_a_native_approver_is_refused_naming_the_setting(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Without `native_approver` nothing runs, the approval stays pending, and the refusal names
    the setting and the effectgate way; that way then runs the refund once."""
    h, paused = paused_refund(node_or_agent, say("Refunded."))
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == (paused,)
    [reason] = refusals(h)
    assert "native_approver=Approver(id, role)" in reason
    assert "effectgate_langgraph.resume({approval_id: decision}, out.interrupts)" in reason
    assert "approve(grant.token)" in reason
    assert shop_gate.shop.receiver.count("refund") == 0
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert decisions_of(shop_gate, paused.approval_id) == []

    h.approve(paused, grant(shop_gate.gate, paused))
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()


def test_a_native_approver_without_the_role_is_refused_with_the_gates_reason(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A support lead configured as the native approver cannot approve a refund: the gate refuses
    them, the refusal says why, and nothing runs."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=SUPPORT_LEAD))
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == (paused,)
    [reason] = refusals(h)
    assert reason.startswith("approve as sam (support_lead) was refused: ")
    assert "needs role finance" in reason
    assert shop_gate.shop.receiver.count("refund") == 0
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert decisions_of(shop_gate, paused.approval_id) == []


@pytest.mark.parametrize("answer", [[reject("no"), APPROVE], []], ids=["too-many", "none"])
def test_a_decisions_list_of_another_length_is_refused_whole(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, answer: Sequence[Mapping[str, Any]]
) -> None:
    """Decisions that do not match the requests one for one apply none, not even the reject."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE))
    turn = h.invoke(hitl(*answer))
    assert turn.paused == (paused,)
    [reason] = refusals(h)
    assert reason.startswith(f"the answer has {len(answer)} decision(s) for 1 waiting call(s)")
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert decisions_of(shop_gate, paused.approval_id) == []
    assert shop_gate.shop.receiver.effects == []


def test_one_decision_for_two_waiting_calls_applies_neither(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """On the node, one payload lists both gated calls of the step; a single decision is refused
    for both, and nothing is decided."""
    h = lg_harness(
        Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL))]), native_approver=FINANCE
    )
    paused = h.send("Refund 1042 and tell me", message_id="m3").paused
    assert len(paused) == 2
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == paused
    assert [r.startswith("the answer has 1 decision(s) for 2") for r in refusals(h)] == [True, True]
    assert [status_of(shop_gate, p.approval_id) for p in paused] == [("pending", 1), ("pending", 1)]
    assert shop_gate.shop.receiver.effects == []


def test_decisions_match_the_requests_by_position(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A refund and an email in one step, answered reject and approve in the order of the
    payload's action_requests: the refund is denied, the email is sent once as the support lead."""
    h = node_or_agent(
        Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL)), say("Emailed.")]),
        native_approver=SUPPORT_LEAD,
    )
    by_tool = {p.tool: p for p in h.send("Refund 1042 and tell me", message_id="m3").paused}
    turn = answer_by_tool(h, {"refund_order": reject("No refund."), "send_email": APPROVE})
    assert turn.paused == ()
    refund, email = by_tool["refund_order"].approval_id, by_tool["send_email"].approval_id
    assert decisions_of(shop_gate, refund) == [("hitl-reject", "finance", "deny", "No refund.")]
    assert [d[:3] for d in decisions_of(shop_gate, email)] == [("sam", "support_lead", "approve")]
    assert (status_of(shop_gate, refund)[0], status_of(shop_gate, email)[0]) == ("denied", "executed")
    assert shop_gate.shop.receiver.count("email") == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_a_destructive_call_needs_two_distinct_native_approvers(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The first native approve of a destructive call is a partial approval: still paused, the
    card counts it, nothing runs; the same reviewer again is refused; a second, distinct reviewer
    runs it once."""
    h, paused = paused_delete(node_or_agent, say("Deleted."), native_approver=reviewer)
    first = h.invoke(hitl(APPROVE), as_reviewer("pia"))
    assert first.paused == (paused,)
    assert refusals(h) == []
    assert only_request(h)["card"]["approvals_given"] == 1
    assert shop_gate.shop.receiver.count("delete") == 0
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)

    again = h.invoke(hitl(APPROVE), as_reviewer("pia"))
    assert again.paused == (paused,)
    [reason] = refusals(h)
    assert "pia already approved" in reason

    done = h.invoke(hitl(APPROVE), as_reviewer("pat"))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("delete", customer_id="u1") == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [
        ("pia", "privacy", "approve"),
        ("pat", "privacy", "approve"),
    ]
    h.script.assert_complete()


@pytest.mark.parametrize("by_id", [False, True], ids=["plain", "by-interrupt-id"])
def test_a_replayed_approve_is_never_recorded_for_a_later_reviewer(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, by_id: bool
) -> None:
    """LangGraph replays pia's earlier approve when pat's reject resumes the step; it is not
    applied again as pat's: the call is denied and nothing runs. Whether the answers come as
    `Command(resume=...)` or addressed by interrupt id."""
    h, paused = paused_delete(node_or_agent, say("Not deleted."), native_approver=reviewer)

    def answer(decision: Mapping[str, Any], name: str) -> Turn:
        if by_id:
            return h.invoke(
                Command(resume={h.interrupt.id: {"decisions": [dict(decision)]}}), as_reviewer(name)
            )
        return h.invoke(hitl(decision), as_reviewer(name))

    assert answer(APPROVE, "pia").paused == (paused,)
    done = answer(reject("Keep my data."), "pat")
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("delete") == 0
    assert status_of(shop_gate, paused.approval_id) == ("denied", 1)
    assert [d[:3] for d in decisions_of(shop_gate, paused.approval_id)] == [
        ("pia", "privacy", "approve"),
        ("pat", "privacy", "deny"),
    ]
    h.script.assert_complete()


def test_a_mismatched_call_accepts_only_a_reject(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Resumed under another user, the paused call is a mismatch: a native approve is refused
    before the gate decides anything, and a reject closes it."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE), say("Not refunded."))
    h.context = {"user_id": "u2"}
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == (paused,)
    assert any(r.startswith("approve refused, only a deny is accepted") for r in refusals(h))
    assert decisions_of(shop_gate, paused.approval_id) == []

    done = h.invoke(hitl(reject("Wrong account.")))
    assert done.paused == ()
    assert status_of(shop_gate, paused.approval_id) == ("denied", 1)
    assert decisions_of(shop_gate, paused.approval_id) == [("fiona", "finance", "deny", "Wrong account.")]
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_hitl_edit_needs_its_own_approval_then_runs_once(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """`{"type": "edit", "edited_action": ...}` proposes a new version and runs nothing; a native
    approve of that version runs the edited refund once."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE), say("Refunded."))
    edited = {"name": "refund_order", "args": {**REFUND, "amount": 5000}}
    turn = h.invoke(hitl({"type": "edit", "edited_action": edited}))
    [v2] = turn.paused
    assert (v2.approval_id, v2.version) == (paused.approval_id, 2)
    assert shop_gate.shop.receiver.effects == []

    done = h.invoke(hitl(APPROVE))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=5000) == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 2)
    h.script.assert_complete()


def test_a_respond_decision_is_refused(node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate) -> None:
    """HITL's respond answers in the tool's place; a gated call runs as approved or not at all."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE))
    assert h.invoke(hitl({"type": "respond", "message": "done"})).paused == (paused,)
    [reason] = refusals(h)
    assert "approve, edit or reject it" in reason
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert shop_gate.shop.receiver.effects == []


@pytest.mark.parametrize("agent", [False, True], ids=["gated_node", "gated_middleware"])
def test_the_existing_tools_entry_points_take_a_native_approver(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any], agent: bool
) -> None:
    """`gated_node(..., native_approver=...)` and `gated_middleware(...)` pass it on: a HITL
    approve of the langchain tool's refund runs it once, approved as fiona."""
    receiver = EffectRecorder()
    db = f"sqlite:///{tmp_path}/effectgate.db"
    model = ScriptedChatModel(script=refund_script())
    if agent:
        middleware = gated_middleware(shop_tools(receiver), EFFECTS, db=db, native_approver=FIONA)
        gate, graph = middleware.gate, create_agent(model, middleware=[middleware], checkpointer=checkpointer)
    else:
        node = gated_node(shop_tools(receiver), EFFECTS, db=db, native_approver=FIONA)
        gate, graph = node.gate, graph_of(node, model, checkpointer)
    gates.append(gate)
    out = invoke(graph, ask("refund 1042"))
    [pause] = out.interrupts
    [request] = pause.value["requests"]
    done = invoke(graph, hitl(APPROVE))
    assert done.interrupts == ()
    assert receiver.count("refund") == 1
    with gate.store.transaction() as conn:
        [decision] = gate.store.decisions(conn, request["approval_id"])
    assert (decision.approver_id, decision.decision) == ("fiona", "approve")
    model.assert_complete()


@pytest.mark.parametrize("kind", ["approve", "reject"])
def test_langchains_per_call_mode_answers_one_interrupt_with_a_bare_decision(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, kind: str
) -> None:
    """HumanInTheLoopMiddleware's per-call mode resumes with one decision, no list: it answers
    the one waiting call as the list form would (approve as the native approver, or reject)."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE), say("Done."))
    decision = APPROVE if kind == "approve" else reject("Not this one.")
    turn = h.invoke(Command(resume=dict(decision)))
    assert turn.paused == ()
    if kind == "approve":
        assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
        assert shop_gate.shop.receiver.count("refund") == 1
    else:
        assert status_of(shop_gate, paused.approval_id) == ("denied", 1)
        assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_a_bare_decision_for_two_waiting_calls_applies_neither(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """One bare decision cannot say which of two waiting calls it answers: refused for both."""
    h = lg_harness(
        Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL))]), native_approver=FINANCE
    )
    paused = h.send("Refund 1042 and tell me", message_id="m3").paused
    assert len(paused) == 2
    turn = h.invoke(Command(resume=dict(reject("no"))))
    assert turn.paused == paused
    assert [r.startswith("the answer has 1 decision(s) for 2") for r in refusals(h)] == [True, True]
    assert [status_of(shop_gate, p.approval_id) for p in paused] == [("pending", 1), ("pending", 1)]
    assert shop_gate.shop.receiver.effects == []
