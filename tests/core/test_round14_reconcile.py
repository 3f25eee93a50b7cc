"""Round 14: reconciliation and leases (each reproduced first); on SQLite and PostgreSQL.

A worker stalls past its lease (the fake clock jumps inside its tool), `recover` in another worker
turns the record into needs_reconciliation, and a person settles it as "did not happen": the
approval ends `failed` (terminal), the subject is free, and the spent grant never runs again. The
stalled run then comes back and reopens the record (`reopen`: its effect may have happened).
Before: not found at the provider, `reconcile` ran that failed grant again, after a fresh
approval of the same payment had already paid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from effectgate import (
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import LeaseLost, PolicyViolation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from ._bank import FINANCE, exec_key, status
from .conftest import MakeGate


class StalledPay:
    """A payment whose first run stalls past its lease while `during` runs (another worker)."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: dict[str, dict[str, Any]] = {}
        self.during: list[Callable[[], None]] = []  # run inside the next run, before it pays
        self.lose_next = False

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        if self.during:
            self.during.pop()()
        if self.lose_next:  # the request never reached the provider; the caller cannot tell
            self.lose_next = False
            raise TimeoutError("no reply")
        key = tool_context.idempotency_key
        if key not in self.applied:
            self.applied[key] = {"account": account, "amount": amount}
            self.receiver.record("pay", idempotency_key=key)
        return self.applied[key]

    def lookup(self, key: str) -> Reconciled | None:
        if key in self.applied:
            return Reconciled(found=True, result=self.applied[key])
        return Reconciled(found=False)

    def table(self, *, hook: bool = True) -> EffectTable:
        t = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=self.lookup if hook else None,
                    definite_failures=(ValueError,),
                )
            ]
        )
        t.allow_all("support")
        return t


def grant_of(gate: EffectGate, message: str = "m1") -> Grant:
    out = gate.call("pay", {"account": "a1", "amount": 5}, context(message))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def stalled_then_settled_failed(
    bank: StalledPay, first: EffectGate, other: EffectGate, clock: FakeClock, *, then: Callable[[], None]
) -> Grant:
    """`first` runs a grant that stalls past its lease; meanwhile `other` recovers it and a person
    settles it as "did not happen", then `then` runs; the stalled run comes back (LeaseLost)."""
    grant = grant_of(first)

    def stall() -> None:
        clock.advance(first.policy.lease_seconds + 1)
        assert other.recover() == [exec_key(grant)]
        other.settle(grant.approval_id, happened=False, by="fiona")
        assert status(other.store, grant.approval_id) == "failed"
        then()

    bank.during.append(stall)
    with pytest.raises(LeaseLost):
        first.execute(grant.token)
    record = first.store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    return grant


def test_a_grant_settled_as_not_happened_never_runs_again(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The late run raised before reaching the provider (its reply: a timeout). The person who
    settled it as "did not happen" had a fresh approval of the same payment made and paid. Not
    found at the provider, the reopened record of the failed grant is released, never run again
    (before: `reconcile` ran it again and the account was paid twice)."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)
    fresh: list[Grant] = []

    def pay_afresh() -> None:
        fresh.append(grant_of(other, message="m2"))
        assert isinstance(other.execute(fresh[0].token), Executed)
        bank.lose_next = True  # the stalled run then raises: its outcome unknown

    grant = stalled_then_settled_failed(bank, first, other, clock, then=pay_afresh)
    assert bank.receiver.count("pay") == 1
    assert first.reconcile(grant.approval_id, approver=FINANCE) is None
    assert bank.receiver.count("pay") == 1
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "failed"
    assert status(store, grant.approval_id) == "failed"
    latest = store.executions(approval_id=grant.approval_id)[-1]
    assert latest.status == "failed"  # the subject's history: not in effect
    with pytest.raises(PolicyViolation) as refused:
        first.reconcile(grant.approval_id, approver=FINANCE)
    assert refused.value.code == "not_reconcilable"
    assert bank.receiver.count("pay") == 1
    assert first.audit().findings == []
