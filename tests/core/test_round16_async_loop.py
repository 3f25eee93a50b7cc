"""Round 16: the sync API called on a thread whose event loop runs (a notebook cell, an async
web handler) with tools that are async in disguise, and coroutine tools that cancel themselves.
On SQLite and PostgreSQL; effects are counted at the tool, records read back from the store.

- A sync write tool that hands its work to the loop's executor and returns the Future
  (`loop.run_in_executor(...)`) or a Task that already ran a step: the gate cannot await it there, so
  it raised a plain RuntimeError, which a write takes for a definite failure. The record ended
  `failed` while the work went on and landed, and the same call again (a retry of a failed write)
  ran it a second time. Now such an awaitable is an unknown outcome (`flow.Unfinished`, an
  `OutcomeUnknown` and a RuntimeError): `needs_reconciliation`, and a retry runs nothing.
- A coroutine tool behind a plain sync decorator (`functools.wraps`, as a logging or tracing
  wrapper writes it): `execute` on a running loop did not see it was async, claimed it, spent the
  grant and ended the approval `failed` (its coroutine refused unrun), so `aexecute` could not run
  it, against README's "refused before anything is claimed: the grant is not spent". Now the
  wrapped function (`__wrapped__`) is looked at too: refused before the claim, and `aexecute`
  runs it once.
- A coroutine tool whose own `CancelledError` escaped (it awaited a job cancelled elsewhere; its
  call was not cancelled): `acall` / `aexecute` ended the caller's task as cancelled (a TaskGroup
  drops such a child silently) and the sync `call` raised a BaseException; the record was left in
  flight for `recover`. Now it is an unknown outcome at once (`flow.Unfinished`):
  `needs_reconciliation`, the lease released, `NeedsReconciliation` raised, never run again.
- A coroutine tool through the sync API from sync code ran under `asyncio.run`, which leaves the
  thread with no current event loop: a program that had set one (for a library calling
  `asyncio.get_event_loop()`) got "There is no current event loop" at its next use. Now the
  tool runs on a loop of its own and the thread's loop is left as it was.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, Executed, Grant, Pending, Refused, ToolSpec
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import MakeGate
from .test_lease_renewal import _granted, _table

FINANCE = Approver("fiona", "finance")


def _off_the_loop(saved: list[str], go: threading.Event) -> EffectTable:
    """A write that saves a note: on a running loop it hands the work to the loop's executor and
    returns the Future; with no loop running it saves inline."""

    def _save(note: str) -> str:
        assert go.wait(10)
        saved.append(note)
        return note

    def save(note: str) -> Any:
        """Save a note without blocking the loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return _save(note)
        return loop.run_in_executor(None, _save, note)

    table = EffectTable([ToolSpec(name="save", effect=Effect.WRITE, fn=save)])
    table.allow("support", ["save"])
    return table


def test_a_write_that_returned_its_running_future_on_a_loop_is_not_failed_nor_run_again(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The sync `call` on a running loop, of a write whose work is already in the executor: its
    outcome is unknown (needs_reconciliation), never `failed`, and calling it again runs nothing."""
    saved: list[str] = []
    go = threading.Event()
    gate = make_gate(_off_the_loop(saved, go))

    async def in_a_handler() -> None:
        try:
            with pytest.raises(NeedsReconciliation, match="event loop is running") as raised:
                gate.call("save", {"note": "n"}, context("m1"))
        finally:
            go.set()  # the executor's job lands (asyncio.run waits for it)
        assert isinstance(raised.value.__cause__, RuntimeError)  # naming acall, as before

    asyncio.run(in_a_handler())
    assert saved == ["n"]
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert [e.status for e in store.executions()] == ["needs_reconciliation"]
    again = gate.call("save", {"note": "n"}, context("m1"))  # no loop now: it would run inline
    assert isinstance(again, Refused), again
    assert again.code == "needs_reconciliation"
    assert saved == ["n"]
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"


def _disguised(ran: list[int]) -> Any:
    async def _pay(account: str, amount: int) -> dict[str, int]:
        ran.append(amount)
        return {"paid": amount}

    @functools.wraps(_pay)
    def pay(account: str, amount: int) -> Any:
        """Pay `amount` to an account (logged by a plain decorator)."""
        return _pay(account, amount)

    return pay


def test_a_coroutine_tool_behind_a_sync_decorator_is_refused_before_its_grant_is_spent(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`execute` on a running loop of a decorated coroutine tool: refused before anything is
    claimed (the approval still approved, no record); `aexecute` then runs it exactly once."""
    ran: list[int] = []
    gate = make_gate(_table(_disguised(ran)))
    grant = _granted(gate)

    async def in_a_cell() -> None:
        with pytest.raises(RuntimeError, match="event loop is running"):
            gate.execute(grant.token)

    asyncio.run(in_a_cell())
    assert ran == []
    assert store.idempotency_records() == []
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert (row.status, row.token_used_at) == ("approved", None)
    out = asyncio.run(gate.aexecute(grant.token))
    assert isinstance(out, Executed), out
    assert ran == [5]
    [record] = store.idempotency_records()
    assert record.status == "succeeded"
    assert [e.status for e in store.executions()] == ["succeeded"]


def test_a_write_of_a_decorated_coroutine_tool_is_refused_before_its_claim(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The same through `call` of a write: nothing claimed, and `acall` then runs it once."""
    ran: list[int] = []
    table = EffectTable([ToolSpec(name="pay", effect=Effect.WRITE, fn=_disguised(ran))])
    table.allow("support", ["pay"])
    gate = make_gate(table)
    args = {"account": "acct-1", "amount": 5}

    async def in_a_cell() -> None:
        with pytest.raises(RuntimeError, match="event loop is running"):
            gate.call("pay", args, context("m1"))

    asyncio.run(in_a_cell())
    assert store.idempotency_records() == []
    out = asyncio.run(gate.acall("pay", args, context("m1")))
    assert isinstance(out, Executed), out
    assert ran == [5]
    [record] = store.idempotency_records()
    assert record.status == "succeeded"


def _awaits_a_cancelled_job(ran: list[str], effect: Effect) -> EffectTable:
    """A coroutine tool that did its work, then awaited a job someone else cancelled (a shared
    connection's task): the CancelledError is its own, not its caller's cancellation."""

    async def save(note: str) -> str:
        """Save a note, then wait for the shared flush."""
        ran.append(note)
        flush = asyncio.get_running_loop().create_future()
        flush.cancel()
        await flush
        return note

    roles = {"approver_role": "finance"} if effect is Effect.MONEY else {}
    spec = ToolSpec(name="save", effect=effect, fn=save, **roles)  # type: ignore[arg-type]
    table = EffectTable([spec])
    table.allow("support", ["save"])
    return table


@pytest.mark.parametrize("driver", ["acall", "call"])
def test_a_coroutine_tools_own_cancelled_error_is_an_unknown_outcome_not_a_cancelled_call(
    make_gate: MakeGate, store: SQLStore, driver: str
) -> None:
    """A write whose coroutine raised CancelledError of its own (the call was not cancelled): an
    unknown outcome recorded at once (needs_reconciliation, the lease released), raised as an
    error, never as the caller's cancellation (a TaskGroup drops a child that ends cancelled; the
    sync `call` handed a BaseException to code that catches Exception), and never run again."""
    ran: list[str] = []
    gate = make_gate(_awaits_a_cancelled_job(ran, Effect.WRITE))

    async def main() -> Any:
        call = asyncio.ensure_future(gate.acall("save", {"note": "n"}, context("m1")))
        with pytest.raises(NeedsReconciliation, match="CancelledError"):
            await call
        assert not call.cancelled()

    if driver == "acall":
        asyncio.run(main())
    else:
        with pytest.raises(NeedsReconciliation, match="CancelledError"):
            gate.call("save", {"note": "n"}, context("m1"))
    assert ran == ["n"]
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert [e.status for e in store.executions()] == ["needs_reconciliation"]
    assert gate._settlement.leases._held == {}
    again = gate.call("save", {"note": "n"}, context("m1"))
    assert isinstance(again, Refused), again
    assert again.code == "needs_reconciliation"
    assert ran == ["n"]


def test_a_payments_own_cancelled_error_under_aexecute_needs_reconciliation(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The same for a gated call: needs_reconciliation (the grant spent, never run again), the
    approval not left in flight for `recover`, the caller told by an error."""
    ran: list[str] = []
    gate = make_gate(_awaits_a_cancelled_job(ran, Effect.MONEY))
    pending = gate.call("save", {"note": "n"}, context("m1"))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation, match="CancelledError"):
        asyncio.run(gate.aexecute(grant.token))
    assert ran == ["n"]
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert [e.status for e in store.executions()] == ["needs_reconciliation"]
    assert gate._settlement.leases._held == {}


def test_a_coroutine_tool_through_the_sync_api_keeps_the_threads_event_loop(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """A sync program that set its thread's event loop (for a library that calls
    `asyncio.get_event_loop()`), calling a coroutine tool through `call`: the tool runs, and the
    program's loop is still the thread's afterwards (`asyncio.run` set it to None: the next
    `get_event_loop()` raised "There is no current event loop")."""
    ran: list[str] = []

    async def save(note: str) -> str:
        """Save a note."""
        ran.append(note)
        return note

    table = EffectTable([ToolSpec(name="save", effect=Effect.WRITE, fn=save)])
    table.allow("support", ["save"])
    gate = make_gate(table)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        out = gate.call("save", {"note": "n"}, context("m1"))
        assert asyncio.get_event_loop() is loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert isinstance(out, Executed), out
    assert ran == ["n"]
    [record] = store.idempotency_records()
    assert record.status == "succeeded"
