"""Lease renewal at its edges, found by a second review of the keeper: an async call cancelled while
its work runs in a worker thread (the thread cannot be stopped: the flow is left to it, never
closed under it), `close()` while a beat hangs, the window between storing an outcome and the end
of the hold, and a lost-connection check that must not read what the caller was handling. On
SQLite and PostgreSQL; waits are events and executor shutdowns, never sleeps."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectTable, Policy, flow
from effectgate._leases import LeaseKeeper
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_lease_renewal import LEASE, _counting_renewals, _granted, _outlive_three_leases, _table


def _paused_in_its_claim(make_gate: MakeGate) -> tuple[Any, list[int], threading.Event, threading.Event]:
    """A gate whose first call waits in its before-snapshot (the claim's step, a worker thread):
    `in_snapshot` is set there, and the step goes on once `go_on` is; `ran` lists the tool's runs."""
    in_snapshot, go_on = threading.Event(), threading.Event()
    ran: list[int] = []

    def snapshot(args: Any) -> dict[str, int]:
        if not ran:
            in_snapshot.set()
            assert go_on.wait(10)
        return {"balance": 0}

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        ran.append(amount)
        return {"paid": amount}

    table = EffectTable([dataclasses.replace(_table(pay).get("pay"), snapshot=snapshot)])  # type: ignore[arg-type]
    table.allow("support", ["pay"])
    return make_gate(table, policy=Policy(lease_seconds=LEASE)), ran, in_snapshot, go_on


def _cancel_while(
    gate: Any, token: str, started: threading.Event, kept: list[Any]
) -> asyncio.AbstractEventLoop:
    """Run `aexecute(token)` and cancel its task once `started` is set, keeping the task and its
    exception in `kept` (as a REPL or a task list would). The loop is returned open: its worker
    thread may still run (`asyncio.run` would wait for it)."""

    async def main() -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            kept.extend([task, exc])

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())
    assert len(kept) == 2
    return loop


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    """Wait for the loop's worker threads to end (what the abandoned flow does there), then close."""
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def test_a_cancelled_sync_tool_keeps_its_lease_until_it_returns_and_its_outcome_is_stored(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    receiver = EffectRecorder()
    started, finish = threading.Event(), threading.Event()
    _, renewed = _counting_renewals(store)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (the provider is slow)."""
        receiver.record("pay", account=account, amount=amount)
        started.set()
        assert finish.wait(10)
        return {"paid": amount}

    policy = Policy(lease_seconds=LEASE)
    gate = make_gate(_table(pay), policy=policy)
    other = make_gate(_table(pay), keyring=gate.keyring, policy=policy)
    kept: list[Any] = []
    loop = _cancel_while(gate, _granted(gate).token, started, kept)
    _outlive_three_leases(clock, renewed)  # the tool still runs in its thread: still renewed
    assert other.recover() == []
    finish.set()
    _finish(loop)
    assert receiver.count("pay") == 1
    assert [e.status for e in store.executions()] == ["succeeded"]  # its outcome was stored
    assert store.idempotency_records(status="in_progress") == []
    assert gate._settlement.leases._held == {}


def test_a_call_cancelled_during_its_claim_never_runs_its_tool_and_is_released(
    make_gate: MakeGate, store: SQLStore
) -> None:
    gate, ran, in_snapshot, go_on = _paused_in_its_claim(make_gate)
    kept: list[Any] = []
    loop = _cancel_while(gate, _granted(gate).token, in_snapshot, kept)
    go_on.set()
    _finish(loop)
    assert ran == []  # no tool starts for a cancelled call
    assert gate._settlement.leases._held == {}  # and its lease is left to run out for `recover`
    [record] = store.idempotency_records()
    assert record.status == "in_progress"


def test_a_hold_while_close_waits_for_a_hanging_beat_gets_a_thread(store: SQLStore) -> None:
    in_beat, unblock = threading.Event(), threading.Event()
    renewed: list[str] = []
    renew = store.renew_lease

    def hanging_first(key: str, owner: str, *, lease_seconds: float) -> bool:
        renewed.append(key)
        if key == "a":  # a database that does not answer
            in_beat.set()
            assert unblock.wait(10)
        return renew(key, owner, lease_seconds=lease_seconds)

    store.renew_lease = hanging_first  # type: ignore[method-assign]
    keeper = LeaseKeeper(store, lease_seconds=LEASE)
    keeper.hold("a", "owner-a")
    assert in_beat.wait(10)
    old = keeper._thread
    closer = threading.Thread(target=keeper.close)
    closer.start()
    keeper.release("a", "owner-a")
    keeper.hold("b", "owner-b")  # a call made while (or after) the gate closes
    assert keeper._thread is not None
    assert keeper._thread is not old  # b has a thread of its own
    unblock.set()
    closer.join(10)
    keeper.close()
    assert old is not None
    assert not old.is_alive()


def test_an_outcome_stored_before_the_hold_ends_is_no_lost_lease(
    make_gate: MakeGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The approver is paged (a notifier hook, maybe slow) after the unknown outcome is stored: a
    beat then must not report the settled record as a lease another worker took over."""
    beats: list[list[str]] = []
    gates: list[Any] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (the provider times out)."""
        raise TimeoutError("no answer")

    def paged(notice: Any) -> None:
        beats.append(gates[0]._settlement.leases.beat())

    gates.append(make_gate(_table(pay), on_needs_reconciliation=paged))
    with caplog.at_level("WARNING", logger="effectgate._execution"), pytest.raises(Exception, match="needs"):
        gates[0].execute(_granted(gates[0]).token)
    assert beats == [[]]
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]


def test_an_error_is_not_a_lost_connection_because_the_caller_was_handling_one(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []

    def failing(conn: Any, **values: Any) -> None:
        attempts.append(1)
        raise sa.exc.IntegrityError("INSERT", None, ValueError("constraint"))

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        monkeypatch.setattr(store, "append_execution", failing)
        return {"paid": amount}

    gate = make_gate(_table(pay))
    token = _granted(gate).token
    blip = sa.exc.OperationalError("SELECT 1", None, ConnectionError("closed"), connection_invalidated=True)

    def go_on_inside_a_handler() -> None:
        try:
            raise blip  # the application's own earlier call lost its connection
        except sa.exc.OperationalError:
            gate.execute(token)

    with pytest.raises(sa.exc.IntegrityError):
        go_on_inside_a_handler()
    assert attempts == [1]


class _OneThread(concurrent.futures.ThreadPoolExecutor):
    """A saturated default executor: one thread, and a count of the jobs submitted to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted, self.cond = 0, threading.Condition()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        with self.cond:
            self.submitted += 1
            self.cond.notify_all()
        return future

    def until(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.submitted >= n, timeout=10)


def _on_one_thread(scenario: Callable[[asyncio.AbstractEventLoop, _OneThread, Any], Any]) -> None:
    """Run `scenario(loop, executor, side)` with a one-thread default executor (`side`: another
    executor to wait on events in), then let every job it queued run."""
    side = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        executor = _OneThread()
        loop.set_default_executor(executor)
        await scenario(loop, executor, side)
        await loop.shutdown_default_executor()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())
    loop.close()
    side.shutdown()


async def _cancel(task: asyncio.Future[Any], kept: list[Any]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError as exc:
        kept.extend([task, exc])  # kept, as a REPL or a task list would


def test_a_tool_whose_job_was_still_queued_never_runs_and_its_lease_is_released(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """Cancelled while the tool's job waits in a saturated executor: asyncio used to drop the job
    and leave the flow suspended at the tool, its lease renewed for as long as the task was kept."""
    kept: list[Any] = []
    gate, ran, in_snapshot, go_on = _paused_in_its_claim(make_gate)
    token = _granted(gate).token

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await loop.run_in_executor(side, in_snapshot.wait, 10)  # the claim step has the thread
        unblock = threading.Event()
        blocked = loop.run_in_executor(None, unblock.wait, 10)  # queued behind it
        queued = executor.submitted
        go_on.set()  # the claim step ends; the blocker takes the thread
        await loop.run_in_executor(side, executor.until, queued + 1)  # the tool's job is queued
        await _cancel(task, kept)
        unblock.set()
        await blocked

    _on_one_thread(scenario)
    assert len(kept) == 2
    assert ran == []  # no tool starts for a cancelled call
    assert gate._settlement.leases._held == {}  # and its lease is left to run out for `recover`
    [record] = store.idempotency_records()
    assert record.status == "in_progress"


def test_a_tool_outcome_whose_store_step_was_queued_is_stored(make_gate: MakeGate, store: SQLStore) -> None:
    ran: list[int] = []
    kept: list[Any] = []
    in_tool, finish = threading.Event(), threading.Event()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        ran.append(amount)
        in_tool.set()
        assert finish.wait(10)
        return {"paid": amount}

    gate = make_gate(_table(pay), policy=Policy(lease_seconds=LEASE))
    token = _granted(gate).token

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await loop.run_in_executor(side, in_tool.wait, 10)
        unblock = threading.Event()
        blocked = loop.run_in_executor(None, unblock.wait, 10)  # queued behind the tool
        queued = executor.submitted
        finish.set()  # the tool returns; the blocker takes the thread
        await loop.run_in_executor(side, executor.until, queued + 1)  # the store step is queued
        await _cancel(task, kept)
        unblock.set()
        await blocked

    _on_one_thread(scenario)
    assert len(kept) == 2
    assert ran == [5]
    assert [e.status for e in store.executions()] == ["succeeded"]
    assert gate._settlement.leases._held == {}


def test_a_tool_outcome_the_cancelled_task_never_took_is_stored(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's job ended (its outcome handed over), and the task is cancelled before it takes
    it: the outcome is stored all the same."""
    ran: list[int] = []
    kept: list[Any] = []
    handed, cancelled = threading.Event(), threading.Event()
    ended = flow._Worker._ended

    def hand_over_then_wait(worker: Any, returned: bool, value: Any) -> None:
        ended(worker, returned, value)
        handed.set()
        assert cancelled.wait(10)  # the window, held open until the task saw its cancellation

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        ran.append(amount)
        return {"paid": amount}

    monkeypatch.setattr(flow._Worker, "_ended", hand_over_then_wait)
    gate = make_gate(_table(pay), policy=Policy(lease_seconds=LEASE))
    token = _granted(gate).token

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await loop.run_in_executor(side, handed.wait, 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            kept.extend([task, exc])
        cancelled.set()

    _on_one_thread(scenario)
    assert len(kept) == 2
    assert ran == [5]
    assert [e.status for e in store.executions()] == ["succeeded"]
    assert gate._settlement.leases._held == {}


def test_an_outcome_a_cancelled_call_could_not_store_is_logged(
    make_gate: MakeGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    started, finish = threading.Event(), threading.Event()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (slowly; meanwhile the store breaks)."""
        started.set()
        assert finish.wait(10)
        return {"paid": amount}

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk full")

    gate = make_gate(_table(pay), policy=Policy(lease_seconds=LEASE))
    kept: list[Any] = []
    with caplog.at_level("WARNING", logger="effectgate._execution"):
        loop = _cancel_while(gate, _granted(gate).token, started, kept)
        store.complete = broken  # type: ignore[method-assign]
        finish.set()
        _finish(loop)
    assert [r for r in caplog.records if "could not be stored" in r.getMessage()]
    [record] = store.idempotency_records()
    assert record.status == "in_progress"  # left for recover()
