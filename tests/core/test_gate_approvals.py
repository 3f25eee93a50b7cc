"""Decisions: business checks, escalation, two-person destructive calls, denial and expiry."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from effectgate import Approver, EffectGate, Executed, Grant, PartialApproval, Pending, Refused
from effectgate.errors import (
    AlreadyDecided,
    ApprovalExpired,
    ConfirmFailed,
    NeedsReconciliation,
    PolicyViolation,
    StaleApproval,
    TokenError,
    WrongApprover,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
FINANCE_2 = Approver("frank", "finance")
FINANCE_LEAD = Approver("lena", "finance_lead")
PRIVACY_1 = Approver("pia", "privacy")
PRIVACY_2 = Approver("pete", "privacy")
BIG_ORDER = {"user_id": "u1", "total": 200000, "currency": "GBP", "status": "delivered"}


def refund(amount: int, order_id: str = "1042") -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "currency": "GBP"}


def propose(gate: EffectGate, tool: str, args: dict[str, Any], message: str) -> Pending:
    out = gate.call(tool, args, context(message))
    assert isinstance(out, Pending), out
    return out


def grant_of(gate: EffectGate, pending: Pending, approver: Approver = FINANCE) -> Grant:
    grant = gate.approve(pending.approval_id, version=pending.version, approver=approver)
    assert isinstance(grant, Grant)
    return grant


def status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status


# -- confirm: the refundable balance


@pytest.mark.parametrize("amount", [0, -500], ids=["zero", "negative"])
def test_non_positive_refund_is_refused_at_proposal(
    shop_gate: ShopGate, store: SQLStore, amount: int
) -> None:
    """A refund of zero or less is Refused(confirm_failed) and registers no approval."""
    _, gate = shop_gate
    out = gate.call("refund_order", refund(amount), context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "confirm_failed"
    assert "positive" in out.message
    assert store.approvals() == []


def test_refund_above_the_order_total_is_refused_at_proposal(shop_gate: ShopGate, store: SQLStore) -> None:
    """12001 on an order of 12000 is Refused(confirm_failed); no approval row."""
    _, gate = shop_gate
    out = gate.call("refund_order", refund(12001), context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "confirm_failed"
    assert store.approvals() == []
    assert json.loads(store.events(kind="refused")[0].detail_json)["code"] == "confirm_failed"


def test_refund_of_exactly_the_total_is_allowed(shop_gate: ShopGate) -> None:
    """The full total is refundable."""
    _, gate = shop_gate
    propose(gate, "refund_order", refund(12000), "m1")


def test_refund_in_another_currency_is_refused(shop_gate: ShopGate) -> None:
    """A refund in EUR of an order in GBP fails the business check."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "currency": "EUR"}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "confirm_failed"


def test_executed_refunds_reduce_the_balance_at_proposal(shop_gate: ShopGate, store: SQLStore) -> None:
    """After 8000 was refunded, a new 5000 is refused (4000 left) and 4000 is accepted."""
    _, gate = shop_gate
    gate.execute(grant_of(gate, propose(gate, "refund_order", refund(8000), "m1")).token)
    out = gate.call("refund_order", refund(5000), context("m2"))
    assert isinstance(out, Refused)
    assert out.code == "confirm_failed"
    assert "4000" in out.message
    propose(gate, "refund_order", refund(4000), "m3")


def test_approved_refunds_reduce_the_balance_at_proposal(shop_gate: ShopGate) -> None:
    """An approved, not yet executed refund of 8000 counts against the balance."""
    _, gate = shop_gate
    grant_of(gate, propose(gate, "refund_order", refund(8000), "m1"))
    out = gate.call("refund_order", refund(5000), context("m2"))
    assert isinstance(out, Refused)
    assert out.code == "confirm_failed"


def test_denied_refunds_do_not_reduce_the_balance(shop_gate: ShopGate) -> None:
    """A denied refund of the full total leaves the full total refundable."""
    _, gate = shop_gate
    first = propose(gate, "refund_order", refund(12000), "m1")
    gate.deny(first.approval_id, approver=FINANCE, reason="duplicate request")
    propose(gate, "refund_order", refund(12000), "m2")


def test_confirm_is_checked_again_at_approval(shop_gate: ShopGate, store: SQLStore) -> None:
    """If the balance shrank since the proposal, approve raises ConfirmFailed, counting executed refunds."""
    shop, gate = shop_gate
    gate.execute(grant_of(gate, propose(gate, "refund_order", refund(8000), "m1")).token)
    second = propose(gate, "refund_order", refund(4000), "m2")
    # a partial cancellation lowers the order total to 100.00: 100.00 - 80.00 refunded < 40.00
    shop.orders["1042"]["total"] = 10000
    with pytest.raises(ConfirmFailed) as raised:
        gate.approve(second.approval_id, version=1, approver=FINANCE)
    assert raised.value.code == "confirm_failed"
    assert "2000" in raised.value.reason
    row = store.get_approval(second.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("pending", None)
    assert len([d for d in store.all_decisions() if d.approval_id == second.approval_id]) == 0
    assert shop.receiver.count("refund", order_id="1042") == 1


def test_scope_is_checked_again_at_approval(shop_gate: ShopGate, store: SQLStore) -> None:
    """If the order changed hands since the proposal, approve raises PolicyViolation(out_of_scope)."""
    shop, gate = shop_gate
    pending = propose(gate, "refund_order", REFUND, "m1")
    shop.orders["1042"]["user_id"] = "u2"
    with pytest.raises(PolicyViolation) as raised:
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert raised.value.code == "out_of_scope"
    assert status(store, pending.approval_id) == "pending"
    assert store.all_decisions() == []


# -- escalation


def test_refund_above_100000_needs_finance_lead(shop_gate: ShopGate) -> None:
    """A refund above 1000.00 escalates to finance_lead, with the rule's note on the card."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    out = propose(gate, "refund_order", refund(150000, "3001"), "m1")
    assert out.card.approver_role == "finance_lead"
    [note] = out.card.notes
    assert "refund above 1000.00" in note
    assert "150000" in note


def test_finance_cannot_approve_an_escalated_refund(shop_gate: ShopGate, store: SQLStore) -> None:
    """finance approving a finance_lead refund raises WrongApprover and records no decision."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    out = propose(gate, "refund_order", refund(150000, "3001"), "m1")
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert status(store, out.approval_id) == "pending"
    assert store.all_decisions() == []


def test_finance_lead_approves_an_escalated_refund(shop_gate: ShopGate) -> None:
    """finance_lead's approval of the escalated refund is a Grant that runs once."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    out = propose(gate, "refund_order", refund(150000, "3001"), "m1")
    gate.execute(grant_of(gate, out, FINANCE_LEAD).token)
    assert shop.receiver.count("refund", order_id="3001", amount=150000) == 1


def test_refund_of_exactly_100000_is_not_escalated(shop_gate: ShopGate) -> None:
    """The threshold is strict: 100000 stays with finance, with no note."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    out = propose(gate, "refund_order", refund(100000, "3001"), "m1")
    assert out.card.approver_role == "finance"
    assert out.card.notes == ()


def test_amendment_above_the_threshold_escalates(shop_gate: ShopGate) -> None:
    """Amending a finance refund to above 100000 moves version 2 to finance_lead."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    first = propose(gate, "refund_order", refund(50000, "3001"), "m1")
    assert first.card.approver_role == "finance"
    amended = propose(gate, "refund_order", refund(150000, "3001"), "m2")
    assert (amended.version, amended.card.approver_role) == (2, "finance_lead")
    with pytest.raises(WrongApprover):
        gate.approve(amended.approval_id, version=2, approver=FINANCE)


def test_amendment_below_the_threshold_drops_the_escalation(shop_gate: ShopGate) -> None:
    """Amending an escalated refund down to 50000 returns it to finance, without the note."""
    shop, gate = shop_gate
    shop.orders["3001"] = dict(BIG_ORDER)
    propose(gate, "refund_order", refund(150000, "3001"), "m1")
    amended = propose(gate, "refund_order", refund(50000, "3001"), "m2")
    assert (amended.card.approver_role, amended.card.notes) == ("finance", ())
    grant_of(gate, amended, FINANCE)


def test_finance_lead_may_approve_a_plain_finance_refund(shop_gate: ShopGate) -> None:
    """SHOP_POLICY grants finance_lead what finance may approve."""
    shop, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m1")
    gate.execute(grant_of(gate, out, FINANCE_LEAD).token)
    assert shop.receiver.count("refund", order_id="1042") == 1


def test_bulk_email_needs_marketing_lead_with_the_count_on_the_card(shop_gate: ShopGate) -> None:
    """501 recipients is a bulk send: role marketing_lead and a note with the recipient count."""
    _, gate = shop_gate
    to = [f"user{i}@example.com" for i in range(501)]
    out = propose(gate, "send_email", {"to": to, "subject": "Outage", "body": "We are on it."}, "m1")
    assert out.card.approver_role == "marketing_lead"
    [note] = out.card.notes
    assert "bulk send" in note
    assert "501" in note


def test_email_to_500_recipients_is_not_bulk(shop_gate: ShopGate) -> None:
    """500 recipients stays with support_lead, with no note."""
    _, gate = shop_gate
    to = [f"user{i}@example.com" for i in range(500)]
    out = propose(gate, "send_email", {"to": to, "subject": "Outage", "body": "x"}, "m1")
    assert out.card.approver_role == "support_lead"
    assert out.card.notes == ()


def test_support_lead_cannot_approve_a_bulk_send(shop_gate: ShopGate, store: SQLStore) -> None:
    """A support lead approving the bulk send raises WrongApprover; nothing is sent."""
    shop, gate = shop_gate
    to = [f"user{i}@example.com" for i in range(501)]
    out = propose(gate, "send_email", {"to": to, "subject": "Outage", "body": "x"}, "m1")
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead"))
    assert status(store, out.approval_id) == "pending"
    assert shop.receiver.count("email") == 0


def test_marketing_lead_approves_the_bulk_send(shop_gate: ShopGate) -> None:
    """marketing_lead's grant sends the bulk email once."""
    shop, gate = shop_gate
    to = [f"user{i}@example.com" for i in range(501)]
    out = propose(gate, "send_email", {"to": to, "subject": "Outage", "body": "x"}, "m1")
    gate.execute(grant_of(gate, out, Approver("mia", "marketing_lead")).token)
    assert shop.receiver.count("email") == 1


# -- destructive: two distinct approvers (conversation 9)


def test_first_approval_of_a_destructive_call_is_partial(shop_gate: ShopGate, store: SQLStore) -> None:
    """One privacy approval of delete_customer_data returns PartialApproval, not a Grant."""
    shop, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m9")
    assert out.card.approvals_required == 2
    first = gate.approve(out.approval_id, version=1, approver=PRIVACY_1)
    assert isinstance(first, PartialApproval)
    assert (first.approvals, first.required) == (1, 2)
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("pending", None)
    assert gate.card(out.approval_id).approvals_given == 1
    assert shop.receiver.count("delete") == 0


def test_same_approver_twice_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """The same privacy approver approving again raises WrongApprover; still one decision."""
    _, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m9")
    gate.approve(out.approval_id, version=1, approver=PRIVACY_1)
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=PRIVACY_1)
    assert len(store.all_decisions()) == 1
    assert status(store, out.approval_id) == "pending"


def test_second_distinct_approver_grants_the_destructive_call(shop_gate: ShopGate, store: SQLStore) -> None:
    """A second, distinct privacy approver gets a Grant; the deletion runs once."""
    shop, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m9")
    gate.approve(out.approval_id, version=1, approver=PRIVACY_1)
    grant = gate.approve(out.approval_id, version=1, approver=PRIVACY_2)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    assert shop.receiver.count("delete", customer_id="u1") == 1
    assert shop.deleted == {"u1"}
    assert status(store, out.approval_id) == "executed"
    assert gate.audit().clean


def test_destructive_call_needs_the_destructive_role(shop_gate: ShopGate) -> None:
    """finance cannot approve a deletion, even as a second approver."""
    _, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m9")
    gate.approve(out.approval_id, version=1, approver=PRIVACY_1)
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=FINANCE)


def test_deleting_another_customers_data_is_rejected(shop_gate: ShopGate, store: SQLStore) -> None:
    """u1 asking to delete u2's data is Refused(out_of_scope), recorded rejected."""
    _, gate = shop_gate
    out = gate.call("delete_customer_data", {"customer_id": "u2"}, context("m9"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert [r.status for r in store.approvals()] == ["rejected"]


def decide_concurrently(gate: EffectGate, approval_id: str, approvers: list[Approver]) -> list[object]:
    barrier = threading.Barrier(len(approvers))
    results: list[object] = []
    lock = threading.Lock()

    def decide(approver: Approver) -> None:
        barrier.wait()
        try:
            result: object = gate.approve(approval_id, version=1, approver=approver)
        except Exception as exc:
            result = exc
        with lock:
            results.append(result)

    threads = [threading.Thread(target=decide, args=(a,)) for a in approvers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_two_privacy_approvers_at_once_make_one_grant(shop_gate: ShopGate, store: SQLStore) -> None:
    """Two distinct approvers deciding at the same moment: one partial approval, then one grant."""
    _, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m9")
    results = decide_concurrently(gate, out.approval_id, [PRIVACY_1, PRIVACY_2])
    assert sorted(type(r).__name__ for r in results) == ["Grant", "PartialApproval"]
    assert len(store.all_decisions()) == 2
    assert status(store, out.approval_id) == "approved"


def test_two_finance_approvers_at_once_mint_one_token(shop_gate: ShopGate, store: SQLStore) -> None:
    """Two finance approvers deciding one refund at once: one Grant, the other AlreadyDecided."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    results = decide_concurrently(gate, out.approval_id, [FINANCE, FINANCE_2])
    assert sorted(type(r).__name__ for r in results) == ["AlreadyDecided", "Grant"]
    assert len(store.all_decisions()) == 1
    assert len(store.events(kind="token_minted")) == 1


# -- deny


def test_denial_with_a_reason_is_returned_as_a_refusal(shop_gate: ShopGate, store: SQLStore) -> None:
    """deny returns Refused(denied) carrying the reason; the record is denied and nothing ran."""
    shop, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    refused = gate.deny(out.approval_id, approver=FINANCE, reason="already refunded by phone")
    assert (refused.code, refused.approval_id) == ("denied", out.approval_id)
    assert "already refunded by phone" in refused.message
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.reason) == ("denied", "already refunded by phone")
    [decision] = store.all_decisions()
    assert (decision.decision, decision.reason, decision.approver_id) == (
        "deny",
        "already refunded by phone",
        "fiona",
    )
    assert shop.receiver.count("refund") == 0


def test_replay_of_a_denied_message_is_refused_denied(shop_gate: ShopGate, store: SQLStore) -> None:
    """The denied message replayed answers Refused(denied) for the same approval; nothing runs."""
    shop, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    gate.deny(out.approval_id, approver=FINANCE, reason="fraud check")
    again = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(again, Refused)
    assert (again.code, again.approval_id) == ("denied", out.approval_id)
    assert "fraud check" in again.message
    assert len(store.approvals()) == 1
    assert shop.receiver.count("refund") == 0


@pytest.mark.parametrize("reason", ["", "   "], ids=["empty", "blank"])
def test_denial_needs_a_reason(shop_gate: ShopGate, store: SQLStore, reason: str) -> None:
    """A denial without a reason the model can be told raises PolicyViolation; still pending."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    with pytest.raises(PolicyViolation):
        gate.deny(out.approval_id, approver=FINANCE, reason=reason)
    assert status(store, out.approval_id) == "pending"
    assert store.all_decisions() == []


def test_denial_by_the_wrong_role_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """Only the approver role may deny: a support lead gets WrongApprover."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    with pytest.raises(WrongApprover):
        gate.deny(out.approval_id, approver=Approver("sam", "support_lead"), reason="no")
    assert status(store, out.approval_id) == "pending"


def test_denial_of_a_stale_version_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """deny(version=1) after an amendment raises StaleApproval and changes nothing."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    propose(gate, "refund_order", refund(6000), "m5")
    with pytest.raises(StaleApproval):
        gate.deny(out.approval_id, approver=FINANCE, reason="no", version=1)
    assert status(store, out.approval_id) == "pending"
    assert store.all_decisions() == []


def test_executed_approval_cannot_be_denied(shop_gate: ShopGate, store: SQLStore) -> None:
    """After execution a denial raises AlreadyDecided; the record stays executed."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    gate.execute(grant_of(gate, out).token)
    with pytest.raises(AlreadyDecided):
        gate.deny(out.approval_id, approver=FINANCE, reason="too late")
    assert status(store, out.approval_id) == "executed"


def test_denied_approval_cannot_be_approved(shop_gate: ShopGate) -> None:
    """A denied approval is decided: approving it raises AlreadyDecided."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    gate.deny(out.approval_id, approver=FINANCE, reason="no")
    with pytest.raises(AlreadyDecided):
        gate.approve(out.approval_id, version=1, approver=FINANCE_2)


# -- expiry: never auto-approved


def test_approval_after_the_pending_ttl_is_refused_and_marked_expired(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Past Policy.pending_ttl approve raises ApprovalExpired and the record becomes expired."""
    shop, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    with pytest.raises(ApprovalExpired):
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("expired", None)
    assert store.all_decisions() == []
    assert [e.approval_id for e in store.events(kind="expired")] == [out.approval_id]
    assert shop.receiver.count("refund") == 0


def test_approval_expires_exactly_at_the_deadline(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """At exactly created_at + pending_ttl the approval is already expired."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl)
    with pytest.raises(ApprovalExpired):
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert status(store, out.approval_id) == "expired"


def test_approval_just_before_the_deadline_is_granted(shop_gate: ShopGate, clock: FakeClock) -> None:
    """One second before the deadline the approval still grants."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl - 1)
    grant_of(gate, out)


def test_expired_approval_stays_expired(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """A second approval attempt after expiry raises ApprovalExpired again; no token is ever minted."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    for _ in range(2):
        with pytest.raises(ApprovalExpired):
            gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert status(store, out.approval_id) == "expired"
    assert store.events(kind="token_minted") == []


def test_denial_after_expiry_is_refused(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """Past the deadline deny raises ApprovalExpired and the record is expired, not denied."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    with pytest.raises(ApprovalExpired):
        gate.deny(out.approval_id, approver=FINANCE, reason="late")
    assert status(store, out.approval_id) == "expired"


def test_expire_marks_due_approvals_and_empties_the_queue(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """gate.expire() marks an overdue approval expired; it leaves the pending list, unapproved."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    gate.expire()
    assert status(store, out.approval_id) == "expired"
    assert gate.pending() == []


def test_replay_after_expiry_is_refused_expired(shop_gate: ShopGate, clock: FakeClock) -> None:
    """The expired message replayed answers Refused(expired) for the same approval."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    again = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(again, Refused)
    assert (again.code, again.approval_id) == ("expired", out.approval_id)


def test_new_message_after_expiry_is_a_fresh_approval(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """After expiry a new request is a new approval, not a revival of the old one."""
    _, gate = shop_gate
    out = propose(gate, "refund_order", REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    fresh = propose(gate, "refund_order", REFUND, "m4")
    assert fresh.approval_id != out.approval_id
    assert sorted(r.status for r in store.approvals()) == ["expired", "pending"]


# -- a grant that lapsed unused


def test_lapsed_unused_grant_is_granted_again_and_runs_once(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """An approved refund whose grant expired unpresented can be granted again: the new token runs
    it once, the old token is void, and both decisions are on record."""
    shop, gate = shop_gate
    p = propose(gate, "refund_order", REFUND, "m3")
    old = grant_of(gate, p)
    clock.advance(gate.policy.token_ttl + 1)
    new = grant_of(gate, p, FINANCE_2)
    assert new.token != old.token
    with pytest.raises(TokenError):
        gate.execute(old.token)
    done = gate.execute(new.token)
    assert done.result["order_id"] == "1042"
    assert shop.receiver.count("refund") == 1
    assert status(store, p.approval_id) == "executed"
    assert [(d.approver_id, d.decision) for d in store.all_decisions()] == [
        ("fiona", "approve"),
        ("frank", "approve"),
    ]
    assert len(store.events(kind="regranted")) == 1
    assert gate.audit().clean


def test_usable_grant_is_not_granted_twice(shop_gate: ShopGate, store: SQLStore) -> None:
    """While a grant is still usable, approving again is refused and mints nothing."""
    _, gate = shop_gate
    p = propose(gate, "refund_order", REFUND, "m3")
    grant_of(gate, p)
    before = store.get_approval(p.approval_id)
    with pytest.raises(AlreadyDecided):
        gate.approve(p.approval_id, version=1, approver=FINANCE_2)
    assert store.get_approval(p.approval_id) == before
    assert len(store.all_decisions()) == 1


def test_presented_grant_is_not_granted_again(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """A grant that was presented (its outcome unknown) is never replaced, even once expired."""
    shop, gate = shop_gate
    p = propose(gate, "refund_order", REFUND, "m3")
    grant = grant_of(gate, p)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    clock.advance(gate.policy.token_ttl + 1)
    with pytest.raises(AlreadyDecided):
        gate.approve(p.approval_id, version=1, approver=FINANCE_2)
    assert len(store.all_decisions()) == 1


def test_regrant_refused_when_another_session_took_the_subject(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """The lapse freed the order; once another session's refund is in flight, the old approval
    cannot be granted again (two refunds would be in flight) and nothing changes."""
    shop, gate = shop_gate
    p = propose(gate, "refund_order", refund(6000), "m3")
    grant_of(gate, p)
    clock.advance(gate.policy.token_ttl + 1)
    other = gate.call("refund_order", refund(6000), context("p1", session_id="s-ada-phone"))
    assert isinstance(other, Pending)
    before = store.get_approval(p.approval_id)
    with pytest.raises(PolicyViolation) as caught:
        gate.approve(p.approval_id, version=1, approver=FINANCE_2)
    assert caught.value.code == "subject_busy"
    assert store.get_approval(p.approval_id) == before
    assert shop.receiver.count("refund") == 0


def test_regrant_after_the_approval_deadline_is_refused(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Past the approval's own deadline a lapsed grant is not renewed."""
    _, gate = shop_gate
    p = propose(gate, "refund_order", REFUND, "m3")
    grant_of(gate, p)
    clock.advance(gate.policy.pending_ttl + 1)
    with pytest.raises(ApprovalExpired):
        gate.approve(p.approval_id, version=1, approver=FINANCE_2)
    assert len(store.all_decisions()) == 1


def test_regrant_needs_the_role(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """A lapsed grant is renewed only by an approver holding the approval's role."""
    _, gate = shop_gate
    p = propose(gate, "refund_order", REFUND, "m3")
    grant_of(gate, p)
    clock.advance(gate.policy.token_ttl + 1)
    with pytest.raises(WrongApprover):
        gate.approve(p.approval_id, version=1, approver=PRIVACY_1)
    assert len(store.all_decisions()) == 1
