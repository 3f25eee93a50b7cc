"""A tool that RAISES after its lease was lost (it ran longer than `lease_seconds` and `recover`
in another worker took the operation over) is recorded like one that returns late
(`test_lease_lost.py`): an execution row needing reconciliation with the tool's error, a
`lease_lost` event, a notice to the approver role, and LeaseLost raised from the tool's error.
A review saw storing the outcome (`mark_needs_reconciliation` for an unknown outcome, `fail` for
a declared definite failure) meet LeaseLost inside its transaction and roll back: no execution
row, no event, the tool's error dropped. Copied from the reviewer's
`tests/core/test_review_flows.py` (with its helpers); on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from effectgate import (
    EffectGate,
    EffectTable,
    ToolContext,
)
from effectgate.errors import LeaseLost
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import Bank, pay_grant
from .conftest import MakeGate


@pytest.mark.parametrize("error", [TimeoutError("reply lost"), ValueError("card declined")])
def test_a_run_that_raises_after_its_lease_was_lost_is_still_recorded(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, error: Exception
) -> None:
    """The worker stalls past its lease, `recover` in another worker takes the operation over,
    then the tool raises (an unknown outcome, or a declared definite failure). The success path
    records such a run (`record_lease_lost`: an execution needing reconciliation); storing the
    outcome met LeaseLost inside its transaction, which rolled back: the run left no execution
    row and no event, and the caller got LeaseLost with the tool's error dropped."""
    bank = Bank()
    gates: list[EffectGate] = []
    notices: list[Any] = []
    unknown = isinstance(error, TimeoutError)  # the payment went through, its reply was lost

    def pay(account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        bank.runs += 1
        if unknown:
            bank.receiver.record("pay", idempotency_key=tool_context.idempotency_key, account=account)
        clock.advance(gates[0].policy.lease_seconds + 1)
        assert gates[0].recover() == [tool_context.idempotency_key]  # another worker, in effect
        raise error

    spec = dataclasses.replace(bank.table()["pay"], fn=pay, reconcile=None, definite_failures=(ValueError,))
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table, on_needs_reconciliation=notices.append)
    gates.append(gate)
    grant = pay_grant(gate)
    key = f"eg_{grant.approval_id}_v{grant.version}"
    with pytest.raises(LeaseLost) as raised:
        gate.execute(grant.token)
    assert bank.runs == 1
    assert bank.receiver.count("pay") == (1 if unknown else 0)  # run once, never again
    runs = [e for e in store.executions() if e.approval_id == grant.approval_id]
    assert len(runs) == 1, runs
    assert raised.value.__cause__ is error  # the tool's error is kept
    assert runs[0].status == "needs_reconciliation"
    assert runs[0].idempotency_key == key
    assert runs[0].result_json is None
    assert "lease was lost" in (runs[0].error or "")
    assert f"{type(error).__name__}: {error}" in (runs[0].error or "")
    events = store.events(kind="lease_lost", approval_id=grant.approval_id)
    assert len(events) == 1
    detail = json.loads(events[0].detail_json)
    assert detail["error"] == f"{type(error).__name__}: {error}"
    assert "lease was lost" in detail["reason"]
    record = store.get(key)  # as `recover` left it: awaiting a person, never settled by the late run
    assert record is not None
    assert record.status == "needs_reconciliation"
    approval = store.get_approval(grant.approval_id)
    assert approval is not None
    assert approval.status == "approved"  # not `failed`: the record awaits a person
    # `recover`'s notice, then the late run's (with the tool's error)
    assert [n.approval_id for n in notices] == [grant.approval_id, grant.approval_id]
    assert f"{type(error).__name__}: {error}" in notices[-1].reason
