"""Round 19: the async paths at their edges: a cancelled decision, a tool job its executor refused
or dropped, a coroutine returned to the sync API, an async `confirm`. On SQLite and PostgreSQL;
effects are counted at the tool (`EffectRecorder`), records read back from the store. Nothing
waits on time: threads meet at events, the hang guards are bounds a passing run never nears.

- `aapprove` cancelled while its worker thread committed the grant: the thread ran on and the
  approval was approved with a grant whose token nobody held (only its hash is stored); approving
  again was `AlreadyDecided` until the grant's lifetime ran out. Now the cancelled call waits for
  its thread and voids the grant it minted (its stored expiry set to now; the token was never
  handed out), so the approval can be approved again; then CancelledError is raised, with a note
  saying so. A denial that landed stands (it is final) and its CancelledError says it landed.
- `aexecute` whose tool job the loop's default executor refused (shut down: "cannot schedule new
  futures after shutdown") or dropped unrun (`shutdown(cancel_futures=True)`, the task never
  cancelled): the caller got the raw RuntimeError, or a CancelledError nobody asked for, the record
  stayed in flight, and `recover` later ran the payment. Now the tool never starts and the call is
  recorded as a definite failure (`flow.NotStarted`, raised to the caller).
- A plain `def` money tool that returns a coroutine, run by `execute` on a thread whose loop runs:
  the call fails (nothing ran; the grant is spent) and the error sent the caller to `aexecute`,
  which then refused the spent grant. Now the error says the grant is spent: propose again.
- An async `confirm` check was accepted by `ToolSpec` and refused every call at run time (its
  coroutine is not a reason): now refused where the row is built, as an async `snapshot` is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, Grant, Pending, Policy, ToolSpec, flow
from effectgate._decisions import Decisions
from effectgate.errors import TableError, TokenError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_lease_edges import _on_one_thread, _OneThread, _paused_in_its_claim
from .test_lease_renewal import FINANCE, LEASE, _granted, _table

GUARD = 10.0  #: seconds: a bound on a wait that a passing run never comes near


def _payments(receiver: EffectRecorder) -> EffectTable:
    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    return _table(pay)


def _held_in(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[threading.Event, threading.Event]:
    """Hold `Decisions.<name>` in its worker thread: `entered` is set there, and it goes on once
    `go` is (inside the decision's transaction for `mint`, before it for `_deny`)."""
    entered, go = threading.Event(), threading.Event()
    original = getattr(Decisions, name)

    def held(self: Decisions, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert go.wait(GUARD)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Decisions, name, held)
    return entered, go


def _cancelled_in_its_thread(call: Any, entered: threading.Event, go: threading.Event) -> BaseException:
    """Run `call()` (a decision's coroutine), cancel its task once its thread is inside, let the
    thread go on, and return the CancelledError the caller got (its worker threads all ended)."""
    caught: list[BaseException] = []

    async def main() -> None:
        task = asyncio.ensure_future(call())
        await asyncio.to_thread(entered.wait, GUARD)
        task.cancel()
        go.set()
        await asyncio.wait({task}, timeout=GUARD)
        try:
            task.result()  # the task's own CancelledError, with its notes
        except asyncio.CancelledError as exc:
            caught.append(exc)

    asyncio.run(main())  # waits for the default executor's threads
    [exc] = caught
    return exc


def test_a_cancelled_aapprove_voids_the_grant_it_minted_and_the_approval_can_be_approved_again(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = EffectRecorder()
    gate = make_gate(_payments(receiver))
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    entered, go = _held_in(monkeypatch, "mint")
    exc = _cancelled_in_its_thread(
        lambda: gate.aapprove(pending.approval_id, version=1, approver=FINANCE), entered, go
    )
    monkeypatch.undo()
    assert "voided" in " ".join(getattr(exc, "__notes__", ()))  # the caller is told what it did
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "approved"
    assert row.token_expires_at is not None
    assert row.token_expires_at <= gate.clock.now()  # the lost token's grant can run nothing
    grant = gate.approve(pending.approval_id, version=1, approver=Approver("fred", "finance"))
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert receiver.count("pay") == 1
    assert [e.status for e in store.executions()] == ["succeeded"]
    assert gate.audit().findings == []


def test_a_cancelled_aapprove_whose_decision_was_refused_leaves_the_approval_pending(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision refused in its thread (here: a stale version) is no grant to void: the
    approval stays pending and a later approve grants it once."""
    receiver = EffectRecorder()
    gate = make_gate(_payments(receiver))
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    entered, go = _held_in(monkeypatch, "_approve")
    _cancelled_in_its_thread(
        lambda: gate.aapprove(pending.approval_id, version=2, approver=FINANCE), entered, go
    )
    monkeypatch.undo()
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "pending"
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)


def test_a_cancelled_adeny_that_landed_is_final_and_the_caller_is_told(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = EffectRecorder()
    gate = make_gate(_payments(receiver))
    token = _granted(gate).token
    [row] = store.approvals()
    entered, go = _held_in(monkeypatch, "_deny")
    exc = _cancelled_in_its_thread(
        lambda: gate.adeny(row.id, approver=FINANCE, reason="wrong account"), entered, go
    )
    monkeypatch.undo()
    assert "denied" in " ".join(getattr(exc, "__notes__", ()))
    denied = store.get_approval(row.id)
    assert denied is not None
    assert denied.status == "denied"
    with pytest.raises(TokenError, match="denied"):
        gate.execute(token)
    assert receiver.count("pay") == 0


def _run_on_a_shut_executor(gate: Any, token: str) -> BaseException:
    """`aexecute(token)` with the loop's default executor shut down as the tool's job is
    submitted (an application's shutdown): what the caller got."""
    caught: list[BaseException] = []
    tool = flow._Worker.tool

    async def shut_then_tool(worker: Any, fn: Any, kwargs: Any) -> Any:
        executor.shutdown(wait=False, cancel_futures=True)
        return await tool(worker, fn, kwargs)

    async def main() -> None:
        try:
            await asyncio.wait_for(gate.aexecute(token), GUARD)
        except BaseException as exc:
            caught.append(exc)

    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    flow._Worker.tool = shut_then_tool  # type: ignore[method-assign]
    try:
        loop.run_until_complete(main())
    finally:
        flow._Worker.tool = tool  # type: ignore[method-assign]
        loop.close()
    [exc] = caught
    return exc


def test_an_aexecute_whose_tool_job_the_shut_down_executor_refuses_never_runs_it(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    receiver = EffectRecorder()
    gate = make_gate(_payments(receiver), policy=Policy(lease_seconds=LEASE))
    exc = _run_on_a_shut_executor(gate, _granted(gate).token)
    assert isinstance(exc, flow.NotStarted)  # not the executor's raw RuntimeError
    [record] = store.idempotency_records()
    assert record.status == "failed"  # definitely did not run
    assert [e.status for e in store.executions()] == ["failed"]
    assert gate._settlement.leases._held == {}
    clock.advance(LEASE * 2)
    assert gate.recover() == []
    assert receiver.count("pay") == 0  # never run, by the call or by recover


def test_an_aexecute_whose_queued_tool_job_the_executor_drops_never_runs_it(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """The tool's job waits in a saturated executor, which the application shuts down dropping
    queued jobs; the task itself was never cancelled."""
    gate, ran, in_snapshot, go_on = _paused_in_its_claim(make_gate)
    token = _granted(gate).token
    caught: list[BaseException] = []

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await loop.run_in_executor(side, in_snapshot.wait, GUARD)  # the claim step has the thread
        blocking, unblock = threading.Event(), threading.Event()

        def blocker() -> None:
            blocking.set()
            assert unblock.wait(GUARD)

        blocked = loop.run_in_executor(None, blocker)  # queued behind it
        queued = executor.submitted
        go_on.set()  # the claim step ends; the blocker takes the thread
        await loop.run_in_executor(side, blocking.wait, GUARD)
        await loop.run_in_executor(side, executor.until, queued + 1)  # the tool's job is queued
        executor.shutdown(wait=False, cancel_futures=True)  # and dropped
        try:
            await asyncio.wait_for(asyncio.shield(task), GUARD)
        except BaseException as exc:
            caught.append(exc)
        unblock.set()
        await blocked

    _on_one_thread(scenario)
    [exc] = caught
    assert isinstance(exc, flow.NotStarted)  # not a CancelledError nobody asked for
    [record] = store.idempotency_records()
    assert record.status == "failed"
    assert gate._settlement.leases._held == {}
    clock.advance(LEASE * 2)
    assert gate.recover() == []
    assert ran == []


def test_a_plain_tool_returning_a_coroutine_under_execute_on_a_loop_says_its_grant_is_spent(
    make_gate: MakeGate, store: SQLStore
) -> None:
    receiver = EffectRecorder()

    async def send(account: str, amount: int) -> dict[str, int]:
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    def pay(account: str, amount: int) -> Any:
        """Pay `amount` to an account (an SDK method that returns its coroutine)."""
        return send(account, amount)

    gate = make_gate(_table(pay))
    token = _granted(gate).token
    errors: list[Exception] = []

    async def cell() -> None:
        for run in (lambda: gate.execute(token), None):
            try:
                if run is not None:
                    run()
                else:
                    await gate.aexecute(token)
            except Exception as exc:
                errors.append(exc)

    asyncio.run(cell())
    first, then = errors
    assert isinstance(first, flow.NotStarted)
    assert "propose" in str(first)  # what works next: not aexecute with this grant
    assert "use the gate's async methods" not in str(first)
    assert isinstance(then, TokenError)
    assert then.reason == "used"
    [record] = store.idempotency_records()
    assert record.status == "failed"
    assert receiver.count("pay") == 0


class _AsyncCheck:
    async def __call__(self, args: Any, seen: Any) -> str | None:
        return None


async def _async_confirm(args: Any, seen: Any) -> str | None:
    return None


@pytest.mark.parametrize("confirm", [_async_confirm, _AsyncCheck()], ids=["function", "callable"])
def test_an_async_confirm_check_is_refused_when_the_row_is_built(confirm: Any) -> None:
    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        return {"paid": amount}

    with pytest.raises(TableError, match="confirm"):
        ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", confirm=confirm)


def test_an_aexecute_on_a_shut_executor_claims_nothing_and_keeps_its_grant(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """Refused at its first step (the claim): nothing of it ran, so the grant is kept."""
    receiver = EffectRecorder()
    gate = make_gate(_payments(receiver))
    token = _granted(gate).token
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    executor.shutdown()
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    try:
        with pytest.raises(RuntimeError, match="shut down"):
            loop.run_until_complete(asyncio.wait_for(gate.aexecute(token), GUARD))
    finally:
        loop.close()
    assert store.idempotency_records() == []
    gate.execute(token)
    assert receiver.count("pay") == 1
