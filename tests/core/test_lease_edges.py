"""Lease renewal at its edges, found by a second review of the keeper: an async call cancelled while
its work runs in a worker thread (the thread cannot be stopped: the flow is left to it, never
closed under it), `close()` while a beat hangs, the window between storing an outcome and the end
of the hold, and a lost-connection check that must not read what the caller was handling. On
SQLite and PostgreSQL; waits are events and executor shutdowns, never sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectTable, Policy
from effectgate._leases import LeaseKeeper
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_lease_renewal import LEASE, _counting_renewals, _granted, _outlive_three_leases, _table


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
    in_snapshot, go_on = threading.Event(), threading.Event()
    ran: list[int] = []

    def snapshot(args: Any) -> dict[str, int]:
        if not ran:  # the before-snapshot, in the claim's step (a worker thread)
            in_snapshot.set()
            assert go_on.wait(10)
        return {"balance": 0}

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        ran.append(amount)
        return {"paid": amount}

    table = _table(pay)
    table = EffectTable([dataclasses.replace(table.get("pay"), snapshot=snapshot)])  # type: ignore[arg-type]
    table.allow("support", ["pay"])
    gate = make_gate(table, policy=Policy(lease_seconds=LEASE))
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
