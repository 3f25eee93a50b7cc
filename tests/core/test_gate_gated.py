"""Gated calls: send, money and destructive pause for a person, then run once with a grant."""

from __future__ import annotations

import json

import pytest

from effectgate import Approver, Card, Executed, Grant, Pending, Policy
from effectgate.canonical import args_hash
from effectgate.errors import AlreadyDecided, TokenError, UnknownApproval, WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tokens import token_hash

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def test_refund_pauses_and_nothing_runs(shop_gate: ShopGate, store: SQLStore) -> None:
    """A refund returns Pending with one pending approval row; the provider saw nothing."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    assert (out.version, out.status, out.replay) == (1, "pending", False)
    [row] = store.approvals()
    assert row.id == out.approval_id
    assert row.status == "pending"
    assert json.loads(row.args_json) == REFUND
    assert shop.receiver.count("refund") == 0
    assert store.executions() == []
    assert [e.approval_id for e in store.events(kind="proposed")] == [out.approval_id]


def test_card_is_built_from_the_stored_record(shop_gate: ShopGate, store: SQLStore) -> None:
    """The card returned with Pending equals the card rebuilt from the stored approval row."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert out.card == Card.from_record(row)
    assert gate.card(out.approval_id) == out.card


def test_card_shows_arguments_hash_reversibility_role_and_expiry(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """The card shows the frozen arguments, their hash, compensable, role finance and a 24 h expiry."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    card = out.card
    assert dict(card.args) == REFUND
    assert card.args_hash == args_hash("refund_order", REFUND)
    assert (card.effect, card.reversibility) == ("money", "compensable")
    assert card.approver_role == "finance"
    assert card.subject == {"order_id": "1042"}
    assert (card.approvals_required, card.approvals_given) == (1, 0)
    assert card.created_at == clock.now()
    assert card.expires_at == clock.now() + Policy().pending_ttl
    assert (card.session_id, card.user_id, card.owner) == ("s-ada", "u1", "payments")


def test_approved_refund_runs_once(shop_gate: ShopGate, store: SQLStore) -> None:
    """Approved by finance and executed, the refund lands once and the approval is executed."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    assert not done.replay
    assert done.result["amount"] == 12000
    assert shop.receiver.count("refund", order_id="1042") == 1
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert row.status == "executed"
    [execution] = store.executions()
    assert (execution.approval_id, execution.version, execution.status) == (out.approval_id, 1, "succeeded")
    assert execution.args_hash == row.args_hash
    assert gate.audit().clean


def test_approval_records_the_decision(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """An approval stores who decided, the status approved, and the hash of the token, not the token."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    clock.advance(30)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert row.status == "approved"
    assert row.decided_at == clock.now()
    assert row.token_hash == token_hash(grant.token)
    assert row.token_hash != grant.token
    [decision] = store.all_decisions()
    assert (decision.approver_id, decision.role, decision.decision) == ("fiona", "finance", "approve")
    assert grant.expires_at == clock.now() + Policy().token_ttl


def test_pending_lists_the_card_for_its_role(shop_gate: ShopGate) -> None:
    """gate.pending() lists the waiting refund; filtered by another role, it does not."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    assert [c.approval_id for c in gate.pending()] == [out.approval_id]
    assert [c.approval_id for c in gate.pending(role="finance")] == [out.approval_id]
    assert gate.pending(role="privacy") == []


def test_executed_approval_leaves_the_pending_list(shop_gate: ShopGate) -> None:
    """Once approved, the refund is no longer waiting for a decision."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert gate.pending() == []


def test_wrong_role_cannot_approve(shop_gate: ShopGate, store: SQLStore) -> None:
    """A support lead approving a refund gets WrongApprover and the approval stays pending."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead"))
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("pending", None)
    assert store.all_decisions() == []
    assert shop.receiver.count("refund") == 0


def test_unknown_approval_cannot_be_approved(shop_gate: ShopGate) -> None:
    """Approving an id that does not exist raises UnknownApproval."""
    _, gate = shop_gate
    with pytest.raises(UnknownApproval):
        gate.approve("no-such-id", version=1, approver=FINANCE)


def test_approved_approval_cannot_be_approved_again(shop_gate: ShopGate, store: SQLStore) -> None:
    """A second approval of an approved refund raises AlreadyDecided and mints no second token."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    gate.approve(out.approval_id, version=1, approver=FINANCE)
    before = store.get_approval(out.approval_id)
    with pytest.raises(AlreadyDecided):
        gate.approve(out.approval_id, version=1, approver=Approver("frank", "finance"))
    after = store.get_approval(out.approval_id)
    assert before is not None
    assert after is not None
    assert after.token_hash == before.token_hash
    assert len(store.all_decisions()) == 1


def test_email_pauses_for_support_lead(shop_gate: ShopGate) -> None:
    """send_email is a send: it waits for support_lead, irreversible, and nothing is sent."""
    shop, gate = shop_gate
    out = gate.call("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}, context("m1"))
    assert isinstance(out, Pending)
    assert (out.card.approver_role, out.card.reversibility, out.card.effect) == (
        "support_lead",
        "irreversible",
        "send",
    )
    assert shop.receiver.count("email") == 0


def test_cancel_subscription_pauses_for_billing(shop_gate: ShopGate) -> None:
    """cancel_subscription is money: it waits for billing and the subscription stays active."""
    shop, gate = shop_gate
    out = gate.call("cancel_subscription", {"subscription_id": "sub_u1"}, context("m1"))
    assert isinstance(out, Pending)
    assert out.card.approver_role == "billing"
    assert shop.subscriptions["sub_u1"]["status"] == "active"


def test_approved_email_is_sent_once(shop_gate: ShopGate) -> None:
    """An approved email lands once at the receiver, even if execute is attempted twice."""
    shop, gate = shop_gate
    out = gate.call("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead"))
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "used"
    assert shop.receiver.count("email") == 1
