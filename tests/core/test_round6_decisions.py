"""Round 6 review of the decision and execution path: defects reproduced first, on SQLite and
PostgreSQL (the `store` fixture family)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, Executed, Grant, Pending, Policy
from effectgate.errors import NeedsReconciliation, TamperedRecord
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE, Bank, pay_grant, status
from .conftest import MakeGate


def test_recover_never_runs_a_call_nobody_approved(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """Someone with write access to the database inserts an in-flight idempotency record for a
    *pending* payment (`eg_<id>_v1`, its lease run out). `recover()` turns it into
    needs_reconciliation and reconciles it: the provider never saw the key, so it "runs again"
    under the same key. Nobody approved it: the tool must not run."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    row = store.get_approval(out.approval_id)
    assert row is not None
    store.claim(f"eg_{row.id}_v{row.version}", row.args_hash, lease_seconds=1)  # the inserted row
    clock.advance(gate.policy.lease_seconds + 1)
    gate.recover()
    assert bank.runs == 0
    assert status(store, out.approval_id) == "pending"


def record_status(store: SQLStore, key: str) -> str | None:
    record = store.get(key)
    return record.status if record is not None else None


def _inserted_unknown_outcome(store: SQLStore, approval_id: str, clock: FakeClock) -> str:
    """An idempotency record awaiting reconciliation, written straight into the database."""
    row = store.get_approval(approval_id)
    assert row is not None
    key = f"eg_{row.id}_v{row.version}"
    store.claim(key, row.args_hash, lease_seconds=1)
    clock.advance(2)
    assert store.expire_lease(key, now=clock.now(), reason="inserted")
    return key


def test_reconcile_never_runs_a_denied_call(store: SQLStore, make_gate: MakeGate, clock: FakeClock) -> None:
    """A payment was denied; an inserted record awaiting reconciliation makes `reconcile` (the
    provider never saw the key) run it: a sealed denial is final, nothing runs."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    gate.deny(out.approval_id, approver=FINANCE, reason="no")
    key = _inserted_unknown_outcome(store, out.approval_id, clock)
    with pytest.raises(TamperedRecord):
        gate.reconcile(out.approval_id, approver=FINANCE)
    assert bank.runs == 0
    assert status(store, out.approval_id) == "denied"
    assert record_status(store, key) == "needs_reconciliation"


@pytest.mark.parametrize("happened", [True, False])
def test_settle_refuses_an_outcome_of_a_call_nobody_approved(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, happened: bool
) -> None:
    """Settling an inserted unknown outcome of a pending call would record an execution (or a
    failure ending the approval) for a call nobody approved: refused, nothing changed."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    key = _inserted_unknown_outcome(store, out.approval_id, clock)
    with pytest.raises(TamperedRecord):
        gate.settle(out.approval_id, happened=happened, result={"ref": "x"}, by="fiona")
    assert status(store, out.approval_id) == "pending"
    assert store.executions() == []
    assert record_status(store, key) == "needs_reconciliation"
    assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Grant)


def test_a_run_again_whose_claim_fails_stays_awaiting_reconciliation(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reconcile` (the provider never saw the key) releases the record in one transaction and
    claims it in another. The database connection drops at the claim: the record stays `failed`
    with the approval `approved`: reconcile and settle refuse it (not awaiting reconciliation),
    execute refuses the spent grant, and recover never looks at it: nothing can settle the call.
    The release and the claim are one commit, so a failed claim leaves it awaiting reconciliation."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    key = f"eg_{grant.approval_id}_v{grant.version}"
    row = store.get_approval(grant.approval_id)
    assert row is not None
    store.claim(key, row.args_hash, lease_seconds=gate.policy.lease_seconds)  # the worker died
    clock.advance(gate.policy.lease_seconds + 1)
    assert store.expire_lease(key, now=clock.now(), reason="worker died")
    real_claim, failures = store.claim, [1]

    def claim(*args: Any, **kwargs: Any) -> Any:
        if failures:
            failures.pop()
            raise sa.exc.OperationalError("claim", {}, ConnectionError("server closed the connection"))
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim", claim)
    with pytest.raises(sa.exc.OperationalError):
        gate.reconcile(grant.approval_id, approver=FINANCE)
    assert record_status(store, key) == "needs_reconciliation"
    assert isinstance(gate.reconcile(grant.approval_id, approver=FINANCE), Executed)
    assert bank.runs == 1
    assert status(store, grant.approval_id) == "executed"


def _unknown_payment(store: SQLStore, make_gate: MakeGate) -> tuple[Any, Bank, str]:
    """A payment whose reply was lost: awaiting reconciliation."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    return gate, bank, grant.approval_id


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"by": None}, TypeError),
        ({"by": 5}, TypeError),
        ({"by": ""}, ValueError),
        ({"by": "  "}, ValueError),
        ({"by": "fiona\udcff"}, ValueError),
        ({"provider_ref": 5}, TypeError),
        ({"provider_ref": ""}, ValueError),
        ({"provider_ref": "re_1\udcff"}, ValueError),
    ],
    ids=["by-none", "by-int", "by-empty", "by-blank", "by-surrogate", "ref-int", "ref-empty", "ref-lone"],
)
@pytest.mark.parametrize("happened", [True, False])
def test_settle_refuses_who_or_a_reference_it_cannot_record(
    store: SQLStore, make_gate: MakeGate, kw: dict[str, Any], error: type[Exception], happened: bool
) -> None:
    """`settle` records who settled (`by`) and the provider's reference: `by=None` or "" was
    recorded as "settled by None" / "settled by " (a settlement nobody answers for), and a lone
    surrogate in either raised sqlalchemy's StatementError from the store. Each is refused with
    TypeError/ValueError before anything is read: the record still awaits reconciliation."""
    gate, _, approval_id = _unknown_payment(store, make_gate)
    args: dict[str, Any] = {"by": "fiona", "provider_ref": None, **kw}
    with pytest.raises(error):
        gate.settle(approval_id, happened=happened, result={"ref": "p1"}, **args)
    assert record_status(store, f"eg_{approval_id}_v1") == "needs_reconciliation"
    assert status(store, approval_id) == "approved"
    assert [e.status for e in store.executions()] == ["needs_reconciliation"]


def test_an_outcome_granted_under_a_policy_changed_since_can_still_be_settled(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The check that the settled version was granted counts its sealed decisions as the gate
    checked them when it granted: a lead who approved through a role grant the policy has since
    dropped still counts, so a payment that happened can be recorded."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False), policy=Policy(role_grants={"lead": frozenset({"finance"})}))
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=Approver("lena", "lead"))
    assert isinstance(grant, Grant)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    later = make_gate(bank.table(reconcile=False), keyring=gate.keyring)
    done = later.settle(out.approval_id, happened=True, result={"ref": "p1"}, by="fiona")
    assert isinstance(done, Executed)
    assert status(store, out.approval_id) == "executed"
    assert bank.runs == 1
