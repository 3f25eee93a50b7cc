"""Round 15: reconciliation and recovery (each reproduced first); on SQLite and PostgreSQL.

- The inbox's reconcile page said "the provider could not say; the record stays in the queue"
  whenever `reconcile` returned None, also when the record had been released (a write the
  provider never saw; an approval that had ended before a late run reopened it): nothing was left
  in the queue.
- `recover()` recorded `reconcile_failed` for a record its reconciliation settled: the provider
  never saw the key, the run again was declined (a definite failure, recorded as such).
- A run again after the provider's "not found" went by the policy the approval was made under:
  a role that no longer counts for the table's role (a role grant withdrawn) still ran it, where
  `execute` refuses it.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    Policy,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import NeedsReconciliation, PolicyViolation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock
from effectgate.web import create_app

from ..web.conftest import login, registry
from ._bank import FINANCE, exec_key, status
from .conftest import MakeGate
from .test_round14_reconcile import StalledPay, stalled_then_settled_failed

STILL_QUEUED = "could not say"


class Declined(Exception):
    """The provider's definite "no"."""


class Provider:
    """A payment and a write whose request can be lost before the provider sees it (`lose`), or
    declined (`decline`); `lookup(key)` says whether the provider has the key (`unsure`: None;
    `down`: it raises)."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: dict[str, Any] = {}
        self.lose = 0
        self.decline = False
        self.unsure = False
        self.down = False

    def _apply(self, name: str, key: str, value: dict[str, Any]) -> dict[str, Any]:
        if self.lose:
            self.lose -= 1
            raise TimeoutError("the request never reached the provider")
        if self.decline:
            raise Declined("card declined")
        self.applied.setdefault(key, value)
        self.receiver.record(name, idempotency_key=key)
        return dict(self.applied[key])

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        return self._apply("pay", tool_context.idempotency_key, {"account": account, "amount": amount})

    def tag(self, ticket_id: str, tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        return self._apply("tag", tool_context.idempotency_key, {"ticket_id": ticket_id})

    def lookup(self, key: str) -> Reconciled | None:
        if self.down:
            raise ConnectionError("provider lookup is down")
        if self.unsure:
            return None
        return Reconciled(found=key in self.applied, result=self.applied.get(key))

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=self.lookup,
                    definite_failures=(Declined,),
                ),
                ToolSpec(name="tag", effect=Effect.WRITE, fn=self.tag, reconcile=self.lookup),
            ]
        )
        table.allow_all("support")
        return table


def pay_grant(gate: EffectGate, approver: Approver = FINANCE) -> Grant:
    out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=1, approver=approver)
    assert isinstance(grant, Grant)
    return grant


def press_reconcile(gate: EffectGate, target: str) -> tuple[int, str]:
    """Finance presses Reconcile on the inbox's queue: (status, the page)."""
    app = create_app(gate, registry(), secret_key="k")
    client = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    csrf = login(client, "fiona")
    r = client.post(f"/reconciliation/{target}", data={"csrf": csrf})
    return r.status_code, r.text


# -- 1. the inbox says what reconciling did


def test_the_inbox_says_a_write_the_provider_never_saw_was_released(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A write whose request never reached the provider, reconciled from the inbox: the record is
    released (its next call runs it under the same key), and the page says so; it used to say
    the provider could not say and the record stayed in the queue."""
    provider = Provider()
    gate = make_gate(provider.table())
    provider.lose = 1
    with pytest.raises(NeedsReconciliation) as unknown:
        gate.call("tag", {"ticket_id": "t1"}, context("m1"))
    key = unknown.value.key
    code, page = press_reconcile(gate, key)
    assert code == 200
    record = store.get(key)
    assert record is not None
    assert record.status != "needs_reconciliation"  # released: nothing left in the queue
    assert store.idempotency_records(status="needs_reconciliation") == []
    assert STILL_QUEUED not in page
    assert "released" in page
    assert provider.receiver.count("tag") == 0


def test_the_inbox_says_an_ended_approval_was_released_and_not_run_again(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """An approval settled as "did not happen" whose late run reopened its record, reconciled from
    the inbox: not found, it is released and never runs again (round 14), and the page says that,
    not that the record stays in the queue."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)

    def lose_the_late_run() -> None:
        bank.lose_next = True

    grant = stalled_then_settled_failed(bank, first, other, clock, then=lose_the_late_run)
    code, page = press_reconcile(first, grant.approval_id)
    assert code == 200
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "failed"
    assert status(store, grant.approval_id) == "failed"
    assert bank.receiver.count("pay") == 0
    assert STILL_QUEUED not in page
    assert "released" in page


def test_the_inbox_still_says_an_unknown_answer_leaves_the_record_queued(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The provider cannot tell (its hook answers None): the record stays in the queue, as the
    page says."""
    provider = Provider()
    gate = make_gate(provider.table())
    provider.lose = 1
    with pytest.raises(NeedsReconciliation) as unknown:
        gate.call("tag", {"ticket_id": "t1"}, context("m1"))
    provider.unsure = True
    code, page = press_reconcile(gate, unknown.value.key)
    assert code == 200
    record = store.get(unknown.value.key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert STILL_QUEUED in page


# -- 2. recover records reconcile_failed only for a reconciliation that failed


def crash_after_claim(gate: EffectGate, store: SQLStore, clock: FakeClock, grant: Grant) -> str:
    """A worker claimed the key and died before reaching the provider: its lease runs out."""
    row = store.get_approval(grant.approval_id)
    assert row is not None
    key = exec_key(grant)
    store.claim(key, row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    return key


def test_recover_records_no_reconcile_failed_for_a_record_it_settled(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The provider never saw the crashed payment, so `recover` runs it again, and the provider
    declines it (a definite failure): the record and the approval end failed, recorded as such.
    The reconciliation did its work: no `reconcile_failed` event says otherwise."""
    provider = Provider()
    gate = make_gate(provider.table())
    grant = pay_grant(gate)
    key = crash_after_claim(gate, store, clock, grant)
    provider.decline = True
    assert gate.recover() == [key]
    record = store.get(key)
    assert record is not None
    assert record.status == "failed"
    assert status(store, grant.approval_id) == "failed"
    assert provider.receiver.count("pay") == 0
    assert store.events(kind="reconcile_failed") == []


def test_recover_still_records_a_lookup_that_raises(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The provider's lookup is down: the record stays queued and `reconcile_failed` says why."""
    provider = Provider()
    gate = make_gate(provider.table())
    grant = pay_grant(gate)
    key = crash_after_claim(gate, store, clock, grant)
    provider.down = True
    assert gate.recover() == [key]
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    [failed] = store.events(kind="reconcile_failed")
    assert failed.approval_id == grant.approval_id


# -- 3. a run again needs the bar of today's table and policy


def test_a_run_again_after_not_found_needs_the_current_policy(store: SQLStore, make_gate: MakeGate) -> None:
    """A finance lead approved a payment under a policy that let that role approve for finance;
    its request never reached the provider. The role grant is withdrawn. `execute` would refuse
    that grant now (the bar comes from today's table and policy); a run again after the provider's
    "not found" must too: nothing runs, the record stays queued (a person may settle it)."""
    provider = Provider()
    lead = Approver("lena", "finance_lead")
    then = Policy(role_grants={"finance_lead": frozenset({"finance"})})
    before = make_gate(provider.table(), policy=then)
    grant = pay_grant(before, approver=lead)
    provider.lose = 1
    with pytest.raises(NeedsReconciliation):
        before.execute(grant.token)
    now = make_gate(provider.table(), keyring=before.keyring)  # the default policy: no role grants
    with pytest.raises(PolicyViolation) as refused:
        now.reconcile(grant.approval_id)
    assert refused.value.code == "reclassified"
    assert provider.receiver.count("pay") == 0
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert now.settle(grant.approval_id, happened=False, by="fiona") is None  # a person still can
    assert status(store, grant.approval_id) == "failed"
