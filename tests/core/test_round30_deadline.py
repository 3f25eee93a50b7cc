"""Round 30: a version's pending deadline is the one its proposal announced, in every process.

The proposing event records the gate's `pending_ttl` (round 29b). Until now each process derived
the deadline with its own `pending_ttl` (which the policy fingerprint does not bind), so two
processes sharing one ledger, an agent's gate and a reviewer's inbox configured apart, disagreed:
the reviewer granted what the proposer's card and the audit said had expired, or its sweep expired
a call the card still showed open, and `redact(policy=...)` erased the arguments of a call that
could still be approved. Now approve, deny, the sweep and the erasures derive it from the
`pending_ttl` that event records (the deciding policy's own only when it records none). On SQLite
and PostgreSQL; refunds counted at the provider's receiver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from effectgate import EffectGate, Grant, Pending
from effectgate.audit import audit
from effectgate.errors import ApprovalExpired
from effectgate.examples.shop import Shop, context
from effectgate.redact import RedactionError, redact
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tokens import Keyring

from .test_round29_deadline import FINANCE, REFUND
from .test_round29_deadline_review import DAY, _gate


@dataclass
class WeekCall:
    """A refund proposed by an agent's gate announcing seven days, three days ago; beside it a
    reviewer's inbox whose own policy says one day (the default)."""

    shop: Shop
    keyring: Keyring
    agent: EffectGate
    inbox: EffectGate
    pending: Pending

    def grant_and_run(self) -> None:
        grant = self.inbox.approve(self.pending.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        self.agent.execute(grant.token)


@pytest.fixture
def week_call(store: SQLStore, clock: FakeClock) -> Iterator[WeekCall]:
    shop, keyring = Shop(), Keyring.generate()
    agent = _gate(store, clock, shop, keyring, pending_ttl=7 * DAY)
    inbox = _gate(store, clock, shop, keyring)
    try:
        pending = agent.call("refund_order", REFUND, context("m1", session_id="s-ada"))
        assert isinstance(pending, Pending)
        clock.advance(3 * DAY)
        yield WeekCall(shop, keyring, agent, inbox, pending)
    finally:
        agent.close()
        inbox.close()


def test_a_reviewer_process_with_a_shorter_pending_ttl_grants_within_the_proposers_deadline(
    store: SQLStore, week_call: WeekCall
) -> None:
    """On day three the inbox grants it (before: refused as expired, and the call marked expired
    for every process), it runs once, and the audit finds nothing."""
    week_call.grant_and_run()
    assert week_call.shop.receiver.count("refund") == 1
    assert _status(store, week_call.pending.approval_id) == "executed"
    assert [f.kind for f in audit(store, keyring=week_call.keyring).findings] == []


def test_a_reviewer_process_sweep_follows_the_deadline_each_call_announced(
    store: SQLStore, clock: FakeClock
) -> None:
    """The inbox's sweep (a day of its own) two hours in: the one-hour call is expired (before: left
    pending, its deadline taken as a day), the seven-day call stays pending; on day eight the
    seven-day one is expired too."""
    shop, keyring = Shop(), Keyring.generate()
    week = _gate(store, clock, shop, keyring, pending_ttl=7 * DAY)
    hour = _gate(store, clock, shop, keyring, pending_ttl=3600.0)
    inbox = _gate(store, clock, shop, keyring)
    try:
        long = week.call("refund_order", REFUND, context("m1", session_id="s-ada"))
        short = hour.call(
            "refund_order", {**REFUND, "order_id": "1043", "amount": 3000}, context("m2", session_id="s-bob")
        )
        assert isinstance(long, Pending)
        assert isinstance(short, Pending)
        clock.advance(2 * 3600)
        inbox.expire()
        assert _status(store, long.approval_id) == "pending"
        assert _status(store, short.approval_id) == "expired"
        clock.advance(8 * DAY)
        inbox.expire()
        assert _status(store, long.approval_id) == "expired"
        with pytest.raises(ApprovalExpired):
            week.approve(long.approval_id, version=1, approver=FINANCE)
    finally:
        week.close()
        hour.close()
        inbox.close()
    assert shop.receiver.count("refund") == 0


def test_a_redaction_under_a_shorter_policy_refuses_a_call_still_open_by_its_announced_deadline(
    store: SQLStore, week_call: WeekCall
) -> None:
    """`redact(policy=inbox.policy)` on day three: the call may still run, so the redaction is
    refused (before: its arguments were erased while it could still be granted); it is then
    approved and runs once."""
    with pytest.raises(RedactionError, match="may still run"):
        redact(
            store, week_call.keyring, user_id="u1", by="dpo", reason="erasure", policy=week_call.inbox.policy
        )
    row = store.get_approval(week_call.pending.approval_id)
    assert row is not None
    assert not row.args_json.startswith('{"$redacted"')
    week_call.grant_and_run()
    assert week_call.shop.receiver.count("refund") == 1


def _status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status
