"""smolagents `resume` binds every decision to the call it is filed under before any is applied:
crossed grants, stale versions, approvals the run did not pause on and edited records run nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from effectgate import Approver, Grant, Pending
from effectgate.errors import PolicyViolation, WrongApprover
from effectgate.examples.shop import context
from effectgate.testing import Script, call, say, step
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Decision,
    DecisionMismatch,
    Deny,
    Finished,
    GatedAgent,
    RunOutcome,
    TamperedState,
)
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, ShopGate

from ._harness import support_agent


def ask(gated: GatedAgent, task: str) -> RunOutcome:
    """Ada's message m3 to the support agent (session s-ada)."""
    return gated.run(task, session_id="s-ada", origin_message_id="m3", user_id="u1")


def _status(shop_gate: ShopGate, approval_id: str) -> str:
    row = shop_gate.store.get_approval(approval_id)
    assert row is not None
    return row.status


def _grant(shop_gate: ShopGate, pending: Pending, approver: Approver) -> Grant:
    decision = shop_gate.gate.approve(pending.approval_id, version=pending.version, approver=approver)
    assert isinstance(decision, Grant)
    return decision


def _paused_on_refund_and_email(shop_gate: ShopGate, *after: str) -> tuple[GatedAgent, AwaitingApproval]:
    """A ToolCallingAgent whose one step asks for the refund and the email; both wait."""
    script = Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL)), *map(say, after)])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = ask(gated, "Refund 1042 and email me")
    assert isinstance(out, AwaitingApproval)
    assert sorted(p.card.tool for p in out.pending) == ["refund_order", "send_email"]
    return gated, out


def _by_tool(awaiting: AwaitingApproval) -> dict[str, Pending]:
    return {p.card.tool: p for p in awaiting.pending}


def test_crossed_grants_run_and_deny_nothing_then_the_right_decisions_work(shop_gate: ShopGate) -> None:
    """Two decisions at once with a grant filed under the other call's approval raise
    DecisionMismatch in either order: no email is sent, no refund made, nothing denied; the right
    decisions then work."""
    gated, out = _paused_on_refund_and_email(shop_gate, "Refunded; no email.")
    refund, email = _by_tool(out)["refund_order"], _by_tool(out)["send_email"]
    email_grant = _grant(shop_gate, email, SUPPORT_LEAD)
    refund_grant = _grant(shop_gate, refund, FINANCE)

    crossed: list[dict[str, Decision]] = [
        {refund.approval_id: Approve(email_grant), email.approval_id: Deny(SUPPORT_LEAD, "no")},
        {email.approval_id: Deny(SUPPORT_LEAD, "no"), refund.approval_id: Approve(email_grant)},
        {email.approval_id: Approve(refund_grant), refund.approval_id: Approve(email_grant)},
        {refund.approval_id: Approve(refund_grant), email.approval_id: Approve(refund_grant)},
    ]
    for decisions in crossed:
        with pytest.raises(DecisionMismatch):
            gated.resume(out, decisions)
        assert shop_gate.shop.receiver.count("email") == 0
        assert shop_gate.shop.receiver.count("refund") == 0
        assert shop_gate.store.executions() == []
        assert (_status(shop_gate, refund.approval_id), _status(shop_gate, email.approval_id)) == (
            "approved",
            "approved",
        )
        assert shop_gate.store.events(kind="denied") == []

    done = gated.resume(
        out, {refund.approval_id: Approve(refund_grant), email.approval_id: Deny(SUPPORT_LEAD, "no")}
    )

    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 0
    assert (_status(shop_gate, refund.approval_id), _status(shop_gate, email.approval_id)) == (
        "executed",
        "denied",
    )


def test_a_deny_the_gate_would_refuse_is_refused_before_the_approved_call_runs(
    shop_gate: ShopGate,
) -> None:
    """A denial by someone who may not decide the email (or with no reason) is refused while the
    decisions are bound: the refund approved beside it does not run, and the email stays open."""
    gated, out = _paused_on_refund_and_email(shop_gate, "Refunded; no email.")
    refund, email = _by_tool(out)["refund_order"], _by_tool(out)["send_email"]
    refund_grant = _grant(shop_gate, refund, FINANCE)

    for deny, refused in ((Deny(FINANCE, "no"), WrongApprover), (Deny(SUPPORT_LEAD, "  "), PolicyViolation)):
        with pytest.raises(refused):
            gated.resume(out, {refund.approval_id: Approve(refund_grant), email.approval_id: deny})
        assert shop_gate.shop.receiver.count("refund") == 0
        assert shop_gate.store.executions() == []
        assert (_status(shop_gate, refund.approval_id), _status(shop_gate, email.approval_id)) == (
            "approved",
            "pending",
        )

    done = gated.resume(
        out, {refund.approval_id: Approve(refund_grant), email.approval_id: Deny(SUPPORT_LEAD, "no")}
    )
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert _status(shop_gate, email.approval_id) == "denied"


def test_a_stale_version_deny_is_refused(shop_gate: ShopGate) -> None:
    """The run paused on version 1; a later message amended the refund to version 2. Denying it
    through the paused run is refused and changes nothing: version 2 stays pending, nothing ran."""
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([call("refund_order", **REFUND)])))
    out = ask(gated, "Please refund order 1042")
    assert isinstance(out, AwaitingApproval)
    [paused] = out.pending
    amended = shop_gate.gate.call("refund_order", {**REFUND, "amount": 6000}, context("m4"))
    assert isinstance(amended, Pending)
    assert (amended.approval_id, amended.version) == (paused.approval_id, 2)

    with pytest.raises(DecisionMismatch, match="version"):
        gated.resume(out, {paused.approval_id: Deny(FINANCE, "not this one")})

    assert _status(shop_gate, paused.approval_id) == "pending"
    assert shop_gate.gate.card(paused.approval_id).version == 2
    assert shop_gate.store.events(kind="denied") == []
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_decision_for_an_approval_the_run_did_not_pause_on_is_refused(shop_gate: ShopGate) -> None:
    """A valid grant for another conversation's refund, filed with this run's resume, runs
    nothing: neither that refund nor this run's, and both approvals stay as they were."""
    gated = support_agent(
        shop_gate.gate, ScriptedModel(Script([call("refund_order", **REFUND), say("Done.")]))
    )
    out = ask(gated, "Please refund order 1042")
    assert isinstance(out, AwaitingApproval)
    [mine] = out.pending
    other = shop_gate.gate.call(
        "refund_order", {**REFUND, "order_id": "1043", "amount": 3500}, context("m1", session_id="s-other")
    )
    assert isinstance(other, Pending)
    other_grant = _grant(shop_gate, other, FINANCE)

    refused: list[dict[str, Decision]] = [
        {other.approval_id: Approve(other_grant)},
        {other.approval_id: Deny(FINANCE, "no")},
        {mine.approval_id: Deny(FINANCE, "no"), other.approval_id: Approve(other_grant)},
    ]
    for decisions in refused:
        with pytest.raises(DecisionMismatch, match="did not pause"):
            gated.resume(out, decisions)

    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert (_status(shop_gate, mine.approval_id), _status(shop_gate, other.approval_id)) == (
        "pending",
        "approved",
    )
    done = gated.resume(out, {mine.approval_id: Approve(_grant(shop_gate, mine, FINANCE))})
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert shop_gate.shop.receiver.count("refund", order_id="1043") == 0


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: dataclasses.replace(a, user_id="u2"),
        lambda a: dataclasses.replace(a, session_id="s-other"),
        lambda a: dataclasses.replace(a, paused=(dataclasses.replace(a.paused[0], version=2),)),
        lambda a: dataclasses.replace(a, paused=(dataclasses.replace(a.paused[0], args_hash="0" * 64),)),
        lambda a: dataclasses.replace(a, paused=()),
        lambda a: dataclasses.replace(a, signature=""),
    ],
    ids=["user", "session", "paused_version", "paused_args_hash", "nothing_paused", "no_signature"],
)
def test_an_awaiting_record_edited_in_the_process_is_refused(
    shop_gate: ShopGate, edit: Callable[[AwaitingApproval], AwaitingApproval]
) -> None:
    """`resume` verifies the record's signature itself, not only `from_dict`: an AwaitingApproval
    changed in memory (identity or paused call) raises TamperedState and the approved refund does
    not run."""
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([call("refund_order", **REFUND)])))
    out = ask(gated, "Please refund order 1042")
    assert isinstance(out, AwaitingApproval)
    [paused] = out.pending
    decision = _grant(shop_gate, paused, FINANCE)

    with pytest.raises(TamperedState):
        gated.resume(edit(out), {paused.approval_id: Approve(decision)})

    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert _status(shop_gate, paused.approval_id) == "approved"
