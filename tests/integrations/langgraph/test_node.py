"""GatedToolNode in a compiled graph: re-runs, one interrupt per step, decisions bound to their call."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware.human_in_the_loop import ActionRequest, HITLRequest, ReviewConfig
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.types import Command

from effectgate import Approver, EffectGate
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, approve, deny, edit
from tests.conformance.adapters import REFUND, ShopGate, grant

from .conftest import MakeLangGraphHarness

CANCEL = {"subscription_id": "sub_u1"}
BILLING = Approver("bill", "billing")


def count_entries(gate: EffectGate) -> list[int]:
    """Count the node's entries: it registers the step's gated calls exactly once per entry."""
    entries = [0]
    original = gate.flows.call_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        entries[0] += 1
        return original(*args, **kwargs)

    gate.flows.call_step = counted  # type: ignore[method-assign]
    return entries


def test_nothing_with_effects_runs_before_the_pause(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A step of a read, a write and a refund pauses before any of them has run."""
    h = lg_harness(
        Script(
            [
                step(
                    call("get_order", order_id="1042"),
                    call("update_ticket_tags", ticket_id="t-17", tags=["refund"]),
                    call("refund_order", **REFUND),
                )
            ]
        )
    )
    turn = h.send("Check 1042, tag my ticket, refund it", message_id="m3")
    assert [p.tool for p in turn.paused] == ["refund_order"]
    assert turn.results == ()
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.receiver.effects == []
    assert shop_gate.store.executions() == []


def test_read_and_write_siblings_run_once_across_resume(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """After the approval, the read, the write and the refund of one step have each run exactly once."""
    h = lg_harness(
        Script(
            [
                step(
                    call("get_order", order_id="1042"),
                    call("update_ticket_tags", ticket_id="t-17", tags=["refund"]),
                    call("refund_order", **REFUND),
                ),
                say("Done."),
            ]
        )
    )
    entries = count_entries(shop_gate.gate)
    [paused] = h.send("Check 1042, tag my ticket, refund it", message_id="m3").paused
    turn = h.approve(paused, grant(shop_gate.gate, paused))
    assert entries == [2]
    assert [(r.tool, r.ok) for r in turn.results] == [
        ("get_order", True),
        ("update_ticket_tags", True),
        ("refund_order", True),
    ]
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert sorted(e.tool for e in shop_gate.store.executions()) == ["refund_order", "update_ticket_tags"]
    h.script.assert_complete()


def test_one_interrupt_lists_every_gated_call_of_the_step(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two gated calls of one step surface in ONE interrupt, each with its own approval and stored card."""
    h = lg_harness(Script([step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL))]))
    turn = h.send("Refund 1042 and cancel my subscription", message_id="m3")
    assert h.last is not None
    [interrupt] = h.last.interrupts
    value = interrupt.value
    assert value["type"] == "effectgate.approval"
    assert (value["session_id"], value["origin_message_id"]) == ("s-ada", "m3")
    assert [r["tool"] for r in value["requests"]] == ["refund_order", "cancel_subscription"]
    assert len({p.approval_id for p in turn.paused}) == 2
    for request in value["requests"]:
        card = shop_gate.gate.card(request["approval_id"])
        assert request["card"] == card.to_dict()
        assert (request["version"], request["args_hash"]) == (card.version, card.args_hash)
        assert request["allowed_decisions"] == ["approve", "deny", "edit"]
    assert {r.status for r in shop_gate.store.approvals()} == {"pending"}


def test_payload_renders_as_a_langchain_hitl_request(lg_harness: MakeLangGraphHarness) -> None:
    """The payload carries HITL's action_requests and review_configs: name, args, description, decisions."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    h.send("Please refund order 1042", message_id="m3")
    value = h.interrupt.value
    hitl = {k: value[k] for k in HITLRequest.__annotations__}
    [action] = hitl["action_requests"]
    [review] = hitl["review_configs"]
    assert set(action) == set(ActionRequest.__annotations__)
    assert (action["name"], action["args"]) == ("refund_order", REFUND)
    assert value["requests"][0]["args_hash"] in action["description"]
    assert set(review) <= set(ReviewConfig.__annotations__)
    assert review == {"action_name": "refund_order", "allowed_decisions": ["approve", "edit", "reject"]}


def test_each_answer_re_runs_the_node_and_nothing_runs_twice(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Answering two gated calls one at a time enters the node three times; each effect lands once."""
    h = lg_harness(
        Script(
            [step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL)), say("Both done.")]
        )
    )
    entries = count_entries(shop_gate.gate)
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    first = h.approve(refund, grant(shop_gate.gate, refund))
    assert [p.approval_id for p in first.paused] == [cancel.approval_id]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 0
    done = h.approve(cancel, grant(shop_gate.gate, cancel, BILLING))
    assert done.paused == ()
    assert entries == [3]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}
    assert len(shop_gate.store.executions()) == 2
    h.script.assert_complete()


def test_crossed_decisions_are_refused_and_nothing_runs(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Each call's grant sent under the other's approval id is refused; both stay pending, nothing runs."""
    h = lg_harness(
        Script(
            [step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL)), say("Both done.")]
        )
    )
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    refund_token = grant(shop_gate.gate, refund)
    cancel_token = grant(shop_gate.gate, cancel, BILLING)
    crossed = h.decide({refund.approval_id: approve(cancel_token), cancel.approval_id: approve(refund_token)})
    assert {p.approval_id for p in crossed.paused} == {refund.approval_id, cancel.approval_id}
    assert {r["approval_id"] for r in h.interrupt.value["refused"]} == {
        refund.approval_id,
        cancel.approval_id,
    }
    assert shop_gate.shop.receiver.effects == []
    assert shop_gate.store.executions() == []
    assert {r.status for r in shop_gate.store.approvals()} == {"approved"}
    done = h.decide({refund.approval_id: approve(refund_token), cancel.approval_id: approve(cancel_token)})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    h.script.assert_complete()


@pytest.mark.parametrize(
    ("field", "value"),
    [("version", 2), ("args_hash", "sha256:not-the-card")],
)
def test_decision_that_names_another_version_or_hash_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, field: str, value: object
) -> None:
    """A decision whose version or args hash differs from the waiting card is refused; nothing runs."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    decision = {**approve(grant(shop_gate.gate, paused)), field: value}
    again = h.decide({paused.approval_id: decision})
    assert [p.approval_id for p in again.paused] == [paused.approval_id]
    [refused] = h.interrupt.value["refused"]
    assert refused["approval_id"] == paused.approval_id
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []


def test_decision_for_an_approval_not_waiting_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A resume naming an approval this step does not wait for runs nothing and asks again."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    again = h.decide({"f" * 32: approve(grant(shop_gate.gate, paused))})
    assert [p.approval_id for p in again.paused] == [paused.approval_id]
    assert h.interrupt.value["refused"][0]["approval_id"] == "f" * 32
    assert shop_gate.shop.receiver.count("refund") == 0


@pytest.mark.parametrize("answer", ["approve", {"decisions": [{"type": "approve"}]}, ["approve"]])
def test_resume_that_is_not_a_mapping_by_approval_id_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, answer: object
) -> None:
    """A bare value, HITL's approve with no native approver, or a list, never approves anything;
    the step asks again."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    grant(shop_gate.gate, paused)
    again = h.invoke(Command(resume={h.interrupt.id: answer}))
    assert [p.approval_id for p in again.paused] == [paused.approval_id]
    assert h.interrupt.value["refused"]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []


def test_plain_mapping_resume_by_approval_id_is_accepted(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """`Command(resume={approval_id: decision})`, with no interrupt id, approves the refund once."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Refunded.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    turn = h.invoke(Command(resume={paused.approval_id: approve(grant(shop_gate.gate, paused))}))
    assert turn.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()


def test_stale_decision_from_an_earlier_turn_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Turn 1's used grant, sent for turn 2's waiting call or its own id, runs nothing new."""
    h = lg_harness(
        Script([call("refund_order", **REFUND), say("Refunded."), call("cancel_subscription", **CANCEL)])
    )
    [refund] = h.send("Please refund order 1042", message_id="m3").paused
    used = grant(shop_gate.gate, refund)
    h.approve(refund, used)
    [cancel] = h.send("Cancel my subscription", message_id="m7").paused
    grant(shop_gate.gate, cancel, BILLING)
    again = h.decide({refund.approval_id: approve(used), cancel.approval_id: approve(used)})
    assert [p.approval_id for p in again.paused] == [cancel.approval_id]
    assert {r["approval_id"] for r in h.interrupt.value["refused"]} == {
        refund.approval_id,
        cancel.approval_id,
    }
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 0
    h.script.assert_complete()


def test_resume_sent_again_after_completion_runs_nothing(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Re-sending the same approving Command after the turn finished leaves one refund."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Refunded.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    command = Command(resume={h.interrupt.id: {paused.approval_id: approve(grant(shop_gate.gate, paused))}})
    h.invoke(command)
    h.invoke(command)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.executions()) == 1
    h.script.assert_complete()


def test_denial_reaches_the_model_and_a_retry_does_not_pause_again(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """After a denial, the model's retry of the same call is refused as denied with no second card."""
    h = lg_harness(
        Script([call("refund_order", **REFUND), call("refund_order", **REFUND), say("It was declined.")])
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    turn = h.deny(paused, "already refunded by bank transfer")
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("refund_order", False)]
    [message, retry] = [m for m in h.messages() if isinstance(m, ToolMessage)]
    assert message.artifact[ARTIFACT_KEY] == {
        "outcome": "refused",
        "code": "denied",
        "approval_id": paused.approval_id,
    }
    assert retry.artifact[ARTIFACT_KEY]["code"] == "denied"
    assert "already refunded by bank transfer" in str(h.script.seen[-1][-1].content)
    [row] = shop_gate.store.approvals()
    assert (row.status, row.reason) == ("denied", "already refunded by bank transfer")
    [decision] = shop_gate.store.all_decisions()
    assert (decision.decision, decision.approver_id, decision.role) == ("deny", "langgraph-resume", "finance")
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_parallel_refunds_in_one_step_register_neither(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two refund_order calls in one step are both refused (parallel_calls), with no card and no pause."""
    h = lg_harness(
        Script(
            [
                step(
                    call("refund_order", order_id="1042", amount=6000, currency="GBP"),
                    call("refund_order", order_id="1043", amount=3500, currency="GBP"),
                ),
                say("Let me do one at a time."),
            ]
        )
    )
    turn = h.send("Refund 60 on 1042 and all of 1043", message_id="m7")
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("refund_order", False)]
    assert [m.artifact[ARTIFACT_KEY]["code"] for m in h.messages() if isinstance(m, ToolMessage)] == [
        "parallel_calls",
        "parallel_calls",
    ]
    assert shop_gate.store.approvals() == []
    h.script.assert_complete()


def test_keys_are_the_thread_and_the_last_human_message(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The approval is keyed on thread_id and the last HumanMessage id, never the tool call id."""
    h = lg_harness(Script([call("refund_order", id="call-from-model", **REFUND)]), thread_id="thread-9")
    h.invoke({"messages": [HumanMessage("hello", id="m1"), HumanMessage("refund 1042", id="m3")]})
    [row] = shop_gate.store.approvals()
    assert (row.session_id, row.origin_message_id, row.user_id, row.agent_id) == (
        "thread-9",
        "m3",
        "u1",
        "support",
    )
    [proposed] = shop_gate.store.events(kind="proposed")
    assert proposed.origin_message_id == "m3"


def test_edit_that_changes_the_subject_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """An edit moving the refund to another order is refused: the approval and the provider are untouched."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    again = h.decide({paused.approval_id: {"type": "edit", "args": {**REFUND, "order_id": "1043"}}})
    assert [(p.approval_id, p.version) for p in again.paused] == [(paused.approval_id, 1)]
    [row] = shop_gate.store.approvals()
    assert (row.version, row.status) == (1, "pending")
    assert shop_gate.shop.receiver.count("refund") == 0


def test_edit_is_a_new_version_that_needs_its_own_approval(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """An edit to 60.00 is version 2; a decision on version 1 is refused; v2's grant refunds 6000 once."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Refunded 60.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    edited = {**REFUND, "amount": 6000}
    [v2] = h.decide({paused.approval_id: edit(edited)}).paused
    assert (v2.approval_id, v2.version) == (paused.approval_id, 2)
    assert h.interrupt.value["requests"][0]["card"]["args"] == edited
    assert shop_gate.shop.receiver.count("refund") == 0
    stale = h.decide({paused.approval_id: {**deny("changed my mind"), "version": 1}})
    assert [(p.approval_id, p.version) for p in stale.paused] == [(paused.approval_id, 2)]
    done = h.approve(v2, grant(shop_gate.gate, v2))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=6000) == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    [row] = shop_gate.store.approvals()
    assert (row.status, row.version) == ("executed", 2)
    [message] = [m for m in h.messages() if isinstance(m, ToolMessage)]
    assert message.artifact[ARTIFACT_KEY]["version"] == 2
    h.script.assert_complete()


def test_edit_of_an_approved_call_is_refused(lg_harness: MakeLangGraphHarness, shop_gate: ShopGate) -> None:
    """Once a grant exists, an edit is refused and the approval stays at version 1, approved."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    grant(shop_gate.gate, paused)
    again = h.decide({paused.approval_id: edit({**REFUND, "amount": 6000})})
    assert [(p.approval_id, p.version) for p in again.paused] == [(paused.approval_id, 1)]
    assert h.interrupt.value["refused"][0]["approval_id"] == paused.approval_id
    [row] = shop_gate.store.approvals()
    assert (row.status, row.version) == ("approved", 1)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_denial_made_outside_the_graph_is_what_the_model_is_told(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Denied with `gate.deny` while paused, the resumed step reports that denial and records no other."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Declined.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    shop_gate.gate.deny(paused.approval_id, approver=Approver("fiona", "finance"), reason="fraud check")
    turn = h.deny(paused, "ignored: already decided")
    assert turn.paused == ()
    assert "fraud check" in turn.results[0].content
    [decision] = shop_gate.store.all_decisions()
    assert (decision.approver_id, decision.reason) == ("fiona", "fraud check")
    h.script.assert_complete()


def test_approval_that_expired_while_paused_is_never_run(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A day later the pending refund has expired: the resumed step reports it and refunds nothing."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("It expired.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    shop_gate.clock.advance(25 * 3600)
    turn = h.decide({paused.approval_id: deny("too late")})
    assert turn.paused == ()
    [message] = [m for m in h.messages() if isinstance(m, ToolMessage)]
    assert message.artifact[ARTIFACT_KEY]["code"] == "expired"
    [row] = shop_gate.store.approvals()
    assert row.status == "expired"
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_grant_that_expired_before_the_resume_is_refused(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A grant presented after its TTL runs nothing; the call keeps waiting and can still be denied."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Declined.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    token = grant(shop_gate.gate, paused)
    shop_gate.clock.advance(301)
    again = h.approve(paused, token)
    assert [p.approval_id for p in again.paused] == [paused.approval_id]
    assert h.interrupt.value["requests"][0]["status"] == "approved"
    assert shop_gate.shop.receiver.count("refund") == 0
    done = h.deny(paused, "grant lapsed")
    assert done.paused == ()
    [row] = shop_gate.store.approvals()
    assert row.status == "denied"
    h.script.assert_complete()


def test_provider_timeout_is_reported_for_reconciliation_not_retried(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Conversation 8: the provider times out after refunding; the model is told, and nothing runs again."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("A person will check it.")]))
    shop_gate.shop.provider.timeouts_to_inject = 1
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    turn = h.approve(paused, grant(shop_gate.gate, paused))
    assert turn.paused == ()
    [message] = [m for m in h.messages() if isinstance(m, ToolMessage)]
    assert (message.status, message.artifact[ARTIFACT_KEY]["outcome"]) == ("error", "needs_reconciliation")
    [execution] = shop_gate.store.executions()
    assert execution.status == "needs_reconciliation"
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()
