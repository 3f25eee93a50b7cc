"""Round 29 review of the derived pending deadline (`effectgate._deadline`, `_audit_deadline`).

`Policy.fingerprint` leaves the timeouts out (`Policy.canonical`), so the policy recorded with
an approval does not say its `pending_ttl`: the audit's `approved_late` must not judge a deadline
with the recorded policy's default `pending_ttl` (a gate configured with a longer one approved in
time, and the audit called it late).
"""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import EffectGate, Grant, Pending, Policy
from effectgate.audit import audit
from effectgate.errors import ApprovalExpired
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tokens import Keyring

from .test_round29_deadline import FINANCE, REFUND

DAY = 86400.0


def _gate(store: SQLStore, clock: FakeClock, shop: Shop, keyring: Keyring, **policy: Any) -> EffectGate:
    chosen = Policy(role_grants=dict(SHOP_POLICY.role_grants), **policy)
    return EffectGate(shop.table(), store, policy=chosen, keyring=keyring, clock=clock)


def test_an_approval_in_time_under_a_longer_pending_ttl_is_not_approved_late(
    store: SQLStore, clock: FakeClock
) -> None:
    shop, keyring = Shop(), Keyring.generate()
    gate = _gate(store, clock, shop, keyring, pending_ttl=7 * DAY)
    try:
        pending = gate.call("refund_order", REFUND, context("m1", session_id="s-ada"))
        assert isinstance(pending, Pending)
        clock.advance(3 * DAY)  # past the default pending_ttl, well inside this gate's
        grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
    finally:
        gate.close()
    assert shop.receiver.count("refund") == 1
    report = audit(store, keyring=keyring)
    assert [f.kind for f in report.findings] == []


def test_a_reviewer_process_with_a_longer_pending_ttl_grants_nothing_past_the_proposers_deadline(
    store: SQLStore, clock: FakeClock
) -> None:
    shop, keyring = Shop(), Keyring.generate()
    agent = _gate(store, clock, shop, keyring, pending_ttl=3600.0)
    inbox = _gate(store, clock, shop, keyring)  # the default pending_ttl: a day
    try:
        pending = agent.call("refund_order", REFUND, context("m1", session_id="s-ada"))
        assert isinstance(pending, Pending)
        clock.advance(2 * 3600)  # past the deadline its card showed
        with pytest.raises(ApprovalExpired):  # before round 30: granted
            inbox.approve(pending.approval_id, version=1, approver=FINANCE)
        row = store.get_approval(pending.approval_id)
        assert row is not None
        assert (row.status, row.grants) == ("expired", 0)
    finally:
        agent.close()
        inbox.close()
    assert shop.receiver.count("refund") == 0


class _SlowCheckShop(Shop):
    """A shop whose refund `confirm` check takes a while (it asks the payment provider)."""

    def __init__(self, clock: FakeClock, takes: float) -> None:
        super().__init__()
        self.clock, self.takes = clock, takes

    def refund_within_balance(self, args: Any, check: Any) -> str | None:
        self.clock.advance(self.takes)
        return super().refund_within_balance(args, check)


def test_an_approval_whose_confirm_check_outlasts_the_deadline_is_refused_not_recorded_late(
    store: SQLStore, clock: FakeClock
) -> None:
    shop, keyring = _SlowCheckShop(clock, 30.0), Keyring.generate()
    gate = _gate(store, clock, shop, keyring)
    try:
        pending = gate.call("refund_order", REFUND, context("m1", session_id="s-ada"))
        assert isinstance(pending, Pending)
        clock.advance(gate.policy.pending_ttl - 1)  # from its proposal event: one second left
        with pytest.raises(ApprovalExpired):  # before: granted, its decision recorded after the deadline
            gate.approve(pending.approval_id, version=1, approver=FINANCE)
        assert [d.decision for d in store.all_decisions()] == []
        row = store.get_approval(pending.approval_id)
        assert row is not None
        assert row.grants == 0
    finally:
        gate.close()
    assert shop.receiver.count("refund") == 0
    assert [f.kind for f in audit(store, keyring=keyring).findings] == []
