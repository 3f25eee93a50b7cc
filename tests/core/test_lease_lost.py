"""A tool that returns after its lease was lost (it ran longer than `lease_seconds`, `recover`
in another worker found the lease expired, and a reconcile that found nothing at the provider ran
it again under the same key): its effect is recorded, never dropped. A review saw the late run's
`complete` raise LeaseLost and leave no execution row and no event: one approval invoked the tool
twice while the ledger showed one execution. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Approver, Effect, EffectGate, EffectTable, Grant, Pending, Reconciled, ToolSpec
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")


def test_a_run_that_lost_its_lease_is_recorded_and_announced(make_gate: MakeGate, clock: FakeClock) -> None:
    receiver = EffectRecorder()
    gates: list[EffectGate] = []
    notices: list[Any] = []
    slow = [True]

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (the first run outlives its lease)."""
        receiver.record("pay", account=account, amount=amount)
        if slow.pop() if slow else False:
            clock.advance(gates[0].policy.lease_seconds + 1)
            gates[1].recover()  # another worker: the lease expired, the provider has no record
        return {"paid": amount}

    def not_at_provider(key: str) -> Reconciled:
        return Reconciled(found=False)

    def table() -> EffectTable:
        t = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=not_at_provider,
                )
            ]
        )
        t.allow("support", ["pay"])
        return t

    first = make_gate(table(), on_needs_reconciliation=notices.append)
    gates += [first, make_gate(table(), keyring=first.keyring)]
    pending = first.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = first.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(LeaseLost):
        first.execute(grant.token)
    assert receiver.count("pay") == 2  # the tool ran twice: the ledger must show both runs
    executions = first.store.executions(approval_id=pending.approval_id)
    assert sorted(e.status for e in executions) == ["needs_reconciliation", "succeeded"]
    late = next(e for e in executions if e.status == "needs_reconciliation")
    assert "lease was lost" in (late.error or "")
    assert [e.kind for e in first.store.events(kind="lease_lost")] == ["lease_lost"]
    assert [n.approval_id for n in notices] == [pending.approval_id]
