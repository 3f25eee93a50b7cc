"""An adversarial review of the day's fixes: each test's docstring tells the defect it was written
against (it failed before its fix): a fix whose sibling path kept the defect, or a fix that made a
new one. On SQLite and PostgreSQL where a store is involved."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Effect, EffectTable, Executed, Pending, Reconciled, ToolContext, ToolSpec
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from ._bank import FINANCE, Bank, exec_key, pay_grant, status
from .conftest import MakeGate

# -- refuse_async_on_loop: the async tool that is not an `async def`


class _AsyncPay:
    """A money tool given as an object whose `__call__` is a coroutine function."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()

    async def __call__(self, account: str, amount: int) -> dict[str, Any]:
        self.receiver.record("pay", account=account)
        return {"account": account, "amount": amount}


def test_sync_execute_on_a_loop_keeps_the_grant_of_an_async_callable_object(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """`execute` on a thread whose loop runs (a notebook cell) refuses an async tool before its
    claim since today, but only an `async def`: a tool given as an object with an async
    `__call__` (which `aexecute` awaits as any coroutine tool) was still claimed first, so the
    grant was spent and the record left in flight though nothing ran."""
    pay = _AsyncPay()
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow_all("support")
    gate = make_gate(table)
    grant = pay_grant(gate)

    async def scenario() -> Executed:
        with pytest.raises(RuntimeError, match="aexecute"):
            gate.execute(grant.token)
        return await gate.aexecute(grant.token)

    out = asyncio.run(scenario())
    assert isinstance(out, Executed)
    assert not out.replay
    assert pay.receiver.count("pay") == 1
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "succeeded"
    assert status(store, grant.approval_id) == "executed"


# -- NUL in stored text (no_nul): the decision rows


def test_a_denial_whose_reason_holds_a_nul_is_recorded(store: SQLStore, make_gate: MakeGate) -> None:
    """Text with a NUL is stored with U+FFFD in its place since today (PostgreSQL's text cannot
    hold it) in approvals, claims and executions, but not in decisions: a reviewer's denial
    reason with a NUL (a web form, a pasted text) failed its PostgreSQL write with a raw driver
    error, and the call stayed pending."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    gate.deny(out.approval_id, approver=FINANCE, reason="no\x00pe", version=1)
    assert status(store, out.approval_id) == "denied"
    [decision] = [d for d in store.all_decisions() if d.approval_id == out.approval_id]
    assert (decision.decision, decision.reason) == ("deny", "no\ufffdpe")


# -- CallContext refusing NUL: a context rebuilt from a stored row


def test_a_granted_row_whose_unsealed_model_id_holds_a_nul_runs_once(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A CallContext refuses a NUL since today, and the gate rebuilds the context of every stored
    approval it runs (`context_of`). A row whose model id holds one (written on SQLite before
    the check, or edited: the model id is not sealed, so the row still verifies) had its claim
    committed and then raised ValueError: the grant spent, the record left in flight (an
    unknown outcome for a person), though the tool never ran."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's text cannot hold a NUL: no such row there")
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET model_id = :m WHERE id = :id"),
            {"m": "gpt\x00x", "id": grant.approval_id},
        )
    out = gate.execute(grant.token)
    assert isinstance(out, Executed)
    assert bank.receiver.count("pay") == 1
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "succeeded"
    assert status(store, grant.approval_id) == "executed"


class _AsyncBank:
    """An async payment whose first attempt fails before the provider sees it (an unknown
    outcome to the gate), with a sync lookup hook."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: set[str] = set()
        self.fail_first = True

    async def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        if self.fail_first:
            self.fail_first = False
            raise TimeoutError("the request never reached the provider")
        self.applied.add(tool_context.idempotency_key)
        self.receiver.record("pay", idempotency_key=tool_context.idempotency_key, account=account)
        return {"account": account, "amount": amount}

    def lookup(self, key: str) -> Reconciled:
        return Reconciled(found=key in self.applied)


def test_sync_reconcile_on_a_loop_of_an_async_tool_releases_nothing(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The sibling of `execute`'s refusal before the claim: `reconcile` of an async tool whose
    provider never saw the key, called on a thread whose loop runs (a notebook cell), released
    the record and claimed it again before the tool's coroutine was refused: a new attempt, a
    'released' event, and the same unknown outcome recorded (and notified) once more, though
    nothing ran."""
    bank = _AsyncBank()
    table = EffectTable(
        [
            ToolSpec(
                name="pay",
                effect=Effect.MONEY,
                fn=bank.pay,
                approver_role="finance",
                subject=("account",),
                reconcile=bank.lookup,
            )
        ]
    )
    table.allow_all("support")
    gate = make_gate(table)
    grant = pay_grant(gate)

    async def first() -> None:
        with pytest.raises(NeedsReconciliation):
            await gate.aexecute(grant.token)

    asyncio.run(first())
    before = store.get(exec_key(grant))
    assert before is not None
    assert before.status == "needs_reconciliation"

    async def in_a_cell() -> None:
        with pytest.raises(RuntimeError, match="event loop is running"):
            gate.reconcile(grant.approval_id)

    asyncio.run(in_a_cell())
    after = store.get(exec_key(grant))
    assert after is not None
    assert (after.status, after.attempts) == ("needs_reconciliation", before.attempts)
    assert store.events(kind="released") == []
    out = gate.reconcile(grant.approval_id)  # no loop runs here: the tool runs once
    assert isinstance(out, Executed)
    assert bank.receiver.count("pay") == 1
    assert status(store, grant.approval_id) == "executed"
