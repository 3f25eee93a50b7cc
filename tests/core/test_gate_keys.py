"""Intent keys: replay, amendment, legitimate repeat, parallel calls, scope, busy subjects, limits."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from effectgate import Approver, EffectGate, Executed, Grant, Pending, Policy, Refused
from effectgate.errors import AlreadyDecided, NeedsReconciliation, StaleApproval
from effectgate.examples.shop import SHOP_POLICY, context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
SIXTY = {**REFUND, "amount": 6000}
INJECTED = {"order_id": "2001", "amount": 50000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def detail(event: Any) -> dict[str, Any]:
    return json.loads(event.detail_json)  # type: ignore[no-any-return]


def propose(gate: EffectGate, args: dict[str, Any], message: str, **kw: str) -> Pending:
    out = gate.call("refund_order", args, context(message, **kw))
    assert isinstance(out, Pending), out
    return out


def run(gate: EffectGate, pending: Pending) -> Executed:
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return gate.execute(grant.token)


# -- replay of the same message


def test_replay_while_pending_returns_the_same_approval(shop_gate: ShopGate, store: SQLStore) -> None:
    """The same message replayed finds the same approval, version 1, and registers no second row."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    again = propose(gate, REFUND, "m3")
    assert (again.approval_id, again.version, again.replay) == (first.approval_id, 1, True)
    assert len(store.approvals()) == 1
    assert len(gate.pending()) == 1


def test_replay_while_pending_shows_the_same_card(shop_gate: ShopGate) -> None:
    """A replay's card is the stored card: same arguments, same hash."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    again = propose(gate, REFUND, "m3")
    assert again.card.args_hash == first.card.args_hash
    assert dict(again.card.args) == REFUND


def test_identical_call_from_a_new_message_while_pending_is_not_an_amendment(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """A new message with the very same arguments while pending keeps version 1."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    again = propose(gate, REFUND, "m4")
    assert (again.approval_id, again.version) == (first.approval_id, 1)
    assert len(store.approvals()) == 1
    assert store.events(kind="amended") == []


def test_replay_after_execution_returns_the_stored_result(shop_gate: ShopGate, store: SQLStore) -> None:
    """After it ran, the same message replayed returns Executed(replay=True) and the stored result."""
    shop, gate = shop_gate
    pending = propose(gate, REFUND, "m3")
    done = run(gate, pending)
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Executed)
    assert out.replay
    assert out.approval_id == pending.approval_id
    assert out.result == done.result
    assert shop.receiver.count("refund", order_id="1042") == 1
    assert len(store.approvals()) == 1
    assert len(store.executions()) == 1


def test_replay_with_the_recipients_reordered_or_repeated_is_the_same_operation(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """A list subject names a set: the same message replayed after its email went out, with the
    recipients in another order or one of them twice, returns the stored result; it registered no
    second approval, and no second email went out (a review sent three)."""
    shop, gate = shop_gate
    lead = Approver("lee", "support_lead")
    email = {"to": ["a@x.com", "b@x.com"], "subject": "Your refund", "body": "We refunded 120.00"}
    first = gate.call("send_email", email, context("m1"))
    assert isinstance(first, Pending)
    grant = gate.approve(first.approval_id, version=1, approver=lead)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    for to in (["b@x.com", "a@x.com"], ["a@x.com", "b@x.com", "a@x.com"]):
        again = gate.call("send_email", {**email, "to": to}, context("m1"))
        assert isinstance(again, Executed), again
        assert again.replay
        assert again.approval_id == first.approval_id
    assert shop.receiver.count("email") == 1
    assert len(store.approvals()) == 1


def test_replay_after_approval_before_execution_is_still_pending(shop_gate: ShopGate) -> None:
    """Between grant and execution a replay answers Pending with status approved, and nothing runs."""
    shop, gate = shop_gate
    pending = propose(gate, REFUND, "m3")
    gate.approve(pending.approval_id, version=1, approver=FINANCE)
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    assert (out.approval_id, out.status, out.replay) == (pending.approval_id, "approved", True)
    assert shop.receiver.count("refund") == 0


def test_concurrent_replays_of_one_message_register_one_approval(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Two workers handling the same message at once end with one approval, and both see it."""
    _, gate = shop_gate
    barrier = threading.Barrier(2)
    seen: list[str] = []
    lock = threading.Lock()

    def handle() -> None:
        barrier.wait()
        out = gate.call("refund_order", REFUND, context("m3"))
        assert isinstance(out, Pending)
        with lock:
            seen.append(out.approval_id)

    threads = [threading.Thread(target=handle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    [row] = store.approvals()
    assert seen == [row.id, row.id]
    assert row.version == 1


# -- amendment


def test_amendment_while_pending_is_version_two_of_the_same_approval(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """'Only refund 60' from a new message amends in place: same id, version 2, amount 6000."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    amended = propose(gate, SIXTY, "m5")
    assert (amended.approval_id, amended.version) == (first.approval_id, 2)
    [row] = store.approvals()
    assert row.version == 2
    assert json.loads(row.args_json) == SIXTY
    assert row.origin_message_id == "m5"
    assert dict(amended.card.args) == SIXTY
    [event] = store.events(kind="amended")
    assert detail(event)["previous_hash"] == first.card.args_hash


def test_decision_on_the_superseded_version_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """approve(version=1) after the amendment raises StaleApproval and changes nothing."""
    shop, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    propose(gate, SIXTY, "m5")
    with pytest.raises(StaleApproval) as raised:
        gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert (raised.value.given, raised.value.current) == (1, 2)
    row = store.get_approval(first.approval_id)
    assert row is not None
    assert (row.status, row.version, row.token_hash) == ("pending", 2, None)
    assert store.all_decisions() == []
    assert shop.receiver.count("refund") == 0


def test_amended_version_runs_with_the_amended_amount(shop_gate: ShopGate) -> None:
    """Approving version 2 refunds 6000, once."""
    shop, gate = shop_gate
    propose(gate, REFUND, "m3")
    amended = propose(gate, SIXTY, "m5")
    done = run(gate, amended)
    assert done.version == 2
    assert shop.receiver.count("refund", order_id="1042", amount=6000) == 1
    assert shop.receiver.count("refund") == 1


def test_amendment_that_fails_confirm_leaves_the_version_unchanged(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Amending to more than the order total is refused confirm_failed; version 1 stays as it was."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    out = gate.call("refund_order", {**REFUND, "amount": 12001}, context("m5"))
    assert isinstance(out, Refused)
    assert (out.code, out.approval_id) == ("confirm_failed", first.approval_id)
    [row] = store.approvals()
    assert (row.version, json.loads(row.args_json)) == (1, REFUND)


def test_replay_of_the_original_message_does_not_undo_a_later_amendment(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Replaying message 3 after 'only refund 60' (message 5) returns the amended version 2 unchanged."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    propose(gate, SIXTY, "m5")
    again = propose(gate, REFUND, "m3")
    assert (again.approval_id, again.version) == (first.approval_id, 2)
    [row] = store.approvals()
    assert (row.version, json.loads(row.args_json)) == (2, SIXTY)


# -- legitimate repeat


def test_same_refund_from_a_later_message_after_execution_is_a_new_approval(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """A new message asking again after the first refund ran is a new approval with new audit rows."""
    shop, gate = shop_gate
    first = propose(gate, SIXTY, "m3")
    run(gate, first)
    second = propose(gate, SIXTY, "m9")
    assert second.approval_id != first.approval_id
    assert (second.version, second.replay) == (1, False)
    run(gate, second)
    assert shop.receiver.count("refund", order_id="1042") == 2
    assert sorted(r.status for r in store.approvals()) == ["executed", "executed"]
    assert sorted(e.approval_id or "" for e in store.executions()) == sorted(
        [first.approval_id, second.approval_id]
    )
    assert len(store.events(kind="proposed")) == 2
    assert gate.audit().clean


# -- scope (conversation 6: a prompt injection)


def test_injected_refund_of_another_customers_order_is_rejected(shop_gate: ShopGate, store: SQLStore) -> None:
    """u1 asking to refund u2's order 2001 is Refused(out_of_scope), recorded as rejected."""
    shop, gate = shop_gate
    out = gate.call("refund_order", INJECTED, context("m6"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    [row] = store.approvals()
    assert row.id == out.approval_id
    assert row.status == "rejected"
    assert json.loads(row.args_json) == INJECTED
    assert [e.approval_id for e in store.events(kind="rejected")] == [row.id]
    assert shop.receiver.count("refund") == 0


def test_rejected_intent_never_reaches_a_card(shop_gate: ShopGate) -> None:
    """The rejected refund of 2001 is not among the pending cards, for any role."""
    _, gate = shop_gate
    gate.call("refund_order", INJECTED, context("m6"))
    assert gate.pending() == []
    assert gate.pending(role="finance") == []


def test_rejected_intent_cannot_be_approved(shop_gate: ShopGate, store: SQLStore) -> None:
    """An approver cannot approve a rejected intent: AlreadyDecided, no token, nothing ran."""
    shop, gate = shop_gate
    out = gate.call("refund_order", INJECTED, context("m6"))
    assert isinstance(out, Refused)
    assert out.approval_id is not None
    with pytest.raises(AlreadyDecided):
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("rejected", None)
    assert shop.receiver.count("refund") == 0


def test_replay_of_the_injected_message_is_rejected_again(shop_gate: ShopGate, store: SQLStore) -> None:
    """The injected message replayed answers out_of_scope with the same rejected record, no second row."""
    _, gate = shop_gate
    first = gate.call("refund_order", INJECTED, context("m6"))
    again = gate.call("refund_order", INJECTED, context("m6"))
    assert isinstance(first, Refused)
    assert isinstance(again, Refused)
    assert (again.code, again.approval_id) == ("out_of_scope", first.approval_id)
    assert len(store.approvals()) == 1


def test_out_of_scope_read_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """u1 reading order 2001 is refused out_of_scope; reads create no approval."""
    _, gate = shop_gate
    out = gate.call("get_order", {"order_id": "2001"}, context("m6"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert store.approvals() == []


def test_owner_of_the_order_may_propose_its_refund(shop_gate: ShopGate) -> None:
    """u2 (Grace) asking for a refund of her own order 2001 is pending, not rejected."""
    _, gate = shop_gate
    out = gate.call("refund_order", INJECTED, context("g1", user_id="u2", session_id="s-grace"))
    assert isinstance(out, Pending)


def test_refund_of_an_order_that_does_not_exist_is_rejected(shop_gate: ShopGate, store: SQLStore) -> None:
    """An unknown order id cannot be shown to be the caller's: rejected, never a card."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "order_id": "9999"}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert [r.status for r in store.approvals()] == ["rejected"]


# -- parallel calls in one model step (conversation 7)


def test_two_refunds_in_one_step_register_neither(shop_gate: ShopGate, store: SQLStore) -> None:
    """Two refund_order calls in one step are both Refused(parallel_calls) and no approval exists."""
    shop, gate = shop_gate
    outs = gate.call_step(
        [
            ("refund_order", {"order_id": "1043", "amount": 1000, "currency": "GBP"}, "call_1"),
            ("refund_order", {"order_id": "1043", "amount": 3500, "currency": "GBP"}, "call_2"),
        ],
        context("m7"),
    )
    assert [type(o) for o in outs] == [Refused, Refused]
    assert [o.code for o in outs if isinstance(o, Refused)] == ["parallel_calls", "parallel_calls"]
    assert store.approvals() == []
    refusals = store.events(kind="refused")
    assert [detail(e)["code"] for e in refusals] == ["parallel_calls", "parallel_calls"]
    assert [detail(e)["tool_call_id"] for e in refusals] == ["call_1", "call_2"]
    assert shop.receiver.count("refund") == 0


def test_other_tools_in_the_same_step_still_run(shop_gate: ShopGate, store: SQLStore) -> None:
    """A read in the same step as two refunds runs; only the refunds are refused."""
    _, gate = shop_gate
    outs = gate.call_step(
        [
            ("refund_order", REFUND),
            ("refund_order", SIXTY),
            ("get_order", {"order_id": "1042"}),
        ],
        context("m7"),
    )
    assert isinstance(outs[0], Refused)
    assert isinstance(outs[1], Refused)
    assert isinstance(outs[2], Executed)
    assert outs[2].result["order_id"] == "1042"
    assert store.approvals() == []


def test_one_gated_call_in_a_step_is_registered(shop_gate: ShopGate) -> None:
    """One refund beside a read in one step is registered as usual."""
    _, gate = shop_gate
    outs = gate.call_step([("get_order", {"order_id": "1042"}), ("refund_order", REFUND)], context("m7"))
    assert isinstance(outs[0], Executed)
    assert isinstance(outs[1], Pending)


def test_two_reads_in_one_step_both_run(shop_gate: ShopGate) -> None:
    """Parallel calls of an autonomous tool are not refused."""
    _, gate = shop_gate
    outs = gate.call_step(
        [("get_order", {"order_id": "1042"}), ("get_order", {"order_id": "1043"})], context("m7")
    )
    assert all(isinstance(o, Executed) for o in outs)


def test_after_parallel_refusal_one_consistent_call_is_registered(shop_gate: ShopGate) -> None:
    """The model's retry with a single refund call, in the same turn, pauses as usual."""
    _, gate = shop_gate
    gate.call_step([("refund_order", REFUND), ("refund_order", SIXTY)], context("m7"))
    [out] = gate.call_step([("refund_order", SIXTY)], context("m7"))
    assert isinstance(out, Pending)
    assert dict(out.card.args) == SIXTY


# -- a subject busy in another session


def test_refund_on_an_order_pending_in_another_session_is_refused_busy(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """While 1042's refund waits in one session, another session's refund is Refused(subject_busy)."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    out = gate.call("refund_order", SIXTY, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Refused)
    assert out.code == "subject_busy"
    assert out.approval_id == first.approval_id
    assert first.approval_id in out.message
    assert [r.id for r in store.approvals()] == [first.approval_id]
    [event] = store.events(kind="refused")
    assert detail(event)["busy"] == first.approval_id


def test_subject_stays_busy_while_approved_and_not_executed(shop_gate: ShopGate) -> None:
    """An approved, not yet executed refund still blocks another session."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    gate.approve(first.approval_id, version=1, approver=FINANCE)
    out = gate.call("refund_order", SIXTY, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Refused)
    assert (out.code, out.approval_id) == ("subject_busy", first.approval_id)


def test_subject_is_free_again_after_execution(shop_gate: ShopGate) -> None:
    """Once the first refund ran, another session may propose a refund of the remaining balance."""
    _, gate = shop_gate
    run(gate, propose(gate, SIXTY, "m3"))
    out = gate.call("refund_order", SIXTY, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Pending)


def test_unused_grant_that_expired_no_longer_blocks_another_session(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """An approved refund whose grant expired without being presented frees the subject."""
    _, gate = shop_gate
    first = propose(gate, SIXTY, "m3")
    gate.approve(first.approval_id, version=1, approver=FINANCE)
    clock.advance(gate.policy.token_ttl + 1)
    out = gate.call("refund_order", SIXTY, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Pending)
    assert out.approval_id != first.approval_id


def test_presented_grant_keeps_the_subject_busy_after_its_expiry(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """A grant that was presented (its outcome unknown) blocks another session even once expired."""
    shop, gate = shop_gate
    first = propose(gate, SIXTY, "m3")
    grant = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    clock.advance(gate.policy.token_ttl + 1)
    out = gate.call("refund_order", SIXTY, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Refused)
    assert (out.code, out.approval_id) == ("subject_busy", first.approval_id)


def test_overdue_approval_in_another_session_does_not_block_the_subject(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Past its deadline, another session's waiting refund no longer makes the order busy."""
    _, gate = shop_gate
    first = propose(gate, REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    out = gate.call("refund_order", REFUND, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Pending), out
    assert out.approval_id != first.approval_id


def test_overdue_approval_stops_blocking_once_marked_expired(shop_gate: ShopGate, clock: FakeClock) -> None:
    """After gate.expire(), another session may propose a refund of the same order."""
    _, gate = shop_gate
    propose(gate, REFUND, "m3")
    clock.advance(gate.policy.pending_ttl + 1)
    gate.expire()
    out = gate.call("refund_order", REFUND, context("p1", session_id="s-ada-phone"))
    assert isinstance(out, Pending)


def test_another_order_is_not_busy(shop_gate: ShopGate) -> None:
    """A pending refund of 1042 does not block another session's refund of 1043."""
    _, gate = shop_gate
    propose(gate, REFUND, "m3")
    out = gate.call(
        "refund_order",
        {"order_id": "1043", "amount": 3500, "currency": "GBP"},
        context("p1", session_id="s2"),
    )
    assert isinstance(out, Pending)


# -- limits


@pytest.fixture
def limited(make_gate: MakeGate, shop_gate: ShopGate) -> EffectGate:
    """The shop's table behind a gate that allows two pending approvals per session."""
    policy = Policy(max_pending_per_session=2, role_grants=SHOP_POLICY.role_grants)
    return make_gate(shop_gate.shop.table(), policy=policy)


def fill(gate: EffectGate) -> None:
    propose(gate, REFUND, "m1")
    propose(gate, {"order_id": "1043", "amount": 3500, "currency": "GBP"}, "m2")


def test_third_pending_approval_in_a_session_is_refused(limited: EffectGate, store: SQLStore) -> None:
    """With max_pending_per_session=2 a third proposal is Refused(too_many_pending), not registered."""
    fill(limited)
    out = limited.call("cancel_subscription", {"subscription_id": "sub_u1"}, context("m3"))
    assert isinstance(out, Refused)
    assert out.code == "too_many_pending"
    assert len(store.approvals()) == 2
    assert detail(store.events(kind="refused")[0])["code"] == "too_many_pending"


def test_amendment_at_the_pending_limit_is_allowed(limited: EffectGate, store: SQLStore) -> None:
    """At the limit, amending a waiting approval still works: it adds no approval."""
    fill(limited)
    out = propose(limited, SIXTY, "m3")
    assert out.version == 2
    assert len(store.approvals()) == 2


def test_replay_at_the_pending_limit_is_answered(limited: EffectGate) -> None:
    """At the limit, a replay of a waiting approval's message still answers Pending."""
    fill(limited)
    out = propose(limited, REFUND, "m1")
    assert out.replay


def test_pending_limit_is_per_session(limited: EffectGate) -> None:
    """A full session does not stop another session from proposing."""
    fill(limited)
    out = limited.call("cancel_subscription", {"subscription_id": "sub_u1"}, context("x1", session_id="s2"))
    assert isinstance(out, Pending)


def test_decided_approvals_do_not_count_toward_the_limit(limited: EffectGate) -> None:
    """After one of the two is approved, a new proposal fits again."""
    fill(limited)
    pending = limited.pending()
    limited.approve(pending[0].approval_id, version=1, approver=FINANCE)
    out = limited.call("cancel_subscription", {"subscription_id": "sub_u1"}, context("m3"))
    assert isinstance(out, Pending)


def test_expired_approvals_do_not_count_toward_the_limit(limited: EffectGate, clock: FakeClock) -> None:
    """Once the two pending approvals expire, the session may propose again."""
    fill(limited)
    clock.advance(limited.policy.pending_ttl)
    out = limited.call("cancel_subscription", {"subscription_id": "sub_u1"}, context("m3"))
    assert isinstance(out, Pending)
