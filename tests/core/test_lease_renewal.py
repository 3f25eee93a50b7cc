"""A tool that runs longer than `lease_seconds` keeps its lease: the gate renews it while the tool
runs, so `recover` in another worker does not take a live operation over (and a reconcile that
finds nothing at the provider does not run it a second time). Before, the lease ran out under a
slow tool and the operation ran twice. A worker that stops renewing still loses its lease. On
SQLite and PostgreSQL; the renewals are awaited as events, never timed with sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Policy,
    Reconciled,
    ToolSpec,
    open_store,
)
from effectgate._leases import LeaseKeeper
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")
LEASE = 0.3  # seconds: the keeper renews every 0.1 s of real time; the fake clock moves the lease


def _table(pay: Any) -> EffectTable:
    def not_at_provider(key: str) -> Reconciled:
        return Reconciled(found=False)

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        subject=("account",),
        reconcile=not_at_provider,
    )
    table = EffectTable([spec])
    table.allow("support", ["pay"])
    return table


def _granted(gate: EffectGate) -> Grant:
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def _counting_renewals(store: SQLStore) -> tuple[list[bool], threading.Event]:
    """Record the outcome of every renewal the store makes, and signal each one."""
    outcomes: list[bool] = []
    renewed = threading.Event()
    renew = store.renew_lease

    def counted(key: str, owner: str, *, lease_seconds: float) -> bool:
        ok = renew(key, owner, lease_seconds=lease_seconds)
        outcomes.append(ok)
        renewed.set()
        return ok

    store.renew_lease = counted  # type: ignore[method-assign]
    return outcomes, renewed


def _outlive_three_leases(clock: FakeClock, renewed: threading.Event) -> None:
    """Three leases' worth of (fake) time, each step renewed (awaited) before the next."""
    for _ in range(3):
        clock.advance(LEASE * 2 / 3)
        renewed.clear()
        assert renewed.wait(10), "the lease was not renewed while the tool ran"


def test_a_slow_tool_keeps_its_lease_and_runs_once(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    receiver = EffectRecorder()
    gates: list[EffectGate] = []
    outcomes, renewed = _counting_renewals(store)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (slowly: it outlives its first lease)."""
        receiver.record("pay", account=account, amount=amount)
        if receiver.count("pay") == 1:
            _outlive_three_leases(clock, renewed)
            assert gates[1].recover() == []  # another worker: the lease is live, nothing to take over
        return {"paid": amount}

    policy = Policy(lease_seconds=LEASE)
    first = make_gate(_table(pay), policy=policy)
    gates += [first, make_gate(_table(pay), keyring=first.keyring, policy=policy)]
    outcome = first.execute(_granted(first).token)
    assert isinstance(outcome, Executed)
    assert receiver.count("pay") == 1
    assert outcomes
    assert all(outcomes)
    [execution] = first.store.executions()
    assert execution.status == "succeeded"
    assert first.store.events(kind="needs_reconciliation") == []
    assert first.store.idempotency_records(status="in_progress") == []


def test_a_worker_that_stops_renewing_still_loses_its_lease(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """What renewal must not break: a lease that is not renewed runs out and is recovered (here the
    renewal is stopped, as a worker's would be by its death, while the tool still runs)."""
    receiver = EffectRecorder()
    gates: list[EffectGate] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (its worker stops renewing, then the lease runs out)."""
        receiver.record("pay", account=account, amount=amount)
        if receiver.count("pay") == 1:
            gates[0]._settlement.leases.close()  # the worker's renewals stop
            clock.advance(LEASE + 1)
            assert len(gates[1].recover()) == 1
        return {"paid": amount}

    policy = Policy(lease_seconds=LEASE)
    first = make_gate(_table(pay), policy=policy)
    gates += [first, make_gate(_table(pay), keyring=first.keyring, policy=policy)]
    with pytest.raises(LeaseLost):
        first.execute(_granted(first).token)
    assert receiver.count("pay") == 2  # recovered, reconciled as not found, and run again
    assert sorted(e.status for e in first.store.executions()) == ["needs_reconciliation", "succeeded"]


def test_a_renewal_after_the_lease_was_taken_over_stops(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A beat that finds the record no longer this owner's in flight (`recover` expired it)
    reports it lost, logs it, and renews it no more."""
    seen: list[list[str]] = []
    gates: list[EffectGate] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (its lease is taken over while it runs)."""
        if not seen:
            keeper = gates[0]._settlement.leases
            [key] = list(keeper._held)
            clock.advance(keeper.lease_seconds + 1)
            assert store.expire_lease(key, now=clock.now(), reason="taken over")
            seen.append(keeper.beat())
            seen.append(keeper.beat())
        return {"paid": amount}

    policy = Policy(lease_seconds=LEASE * 1000)  # the thread stays out of the way: beats by hand
    gates.append(make_gate(_table(pay), policy=policy))
    with caplog.at_level("WARNING", logger="effectgate._execution"):
        outcome = gates[0].execute(_granted(gates[0]).token)
    # nobody ran it again: its own completion still settles the record it was taken from
    assert isinstance(outcome, Executed)
    assert len(seen[0]) == 1
    assert seen[1] == []
    assert any("lease lost while the tool runs" in r.getMessage() for r in caplog.records)


def test_renew_lease_is_the_owners_and_in_flight_only(store: SQLStore, clock: FakeClock) -> None:
    claim = store.claim("k1", "h1", lease_seconds=10)
    owner = claim.owner  # type: ignore[union-attr]
    clock.advance(8)
    assert store.renew_lease("k1", owner, lease_seconds=10)
    record = store.get("k1")
    assert record is not None
    assert record.lease_expires_at == pytest.approx(clock.now() + 10)
    assert not store.renew_lease("k1", "someone-else", lease_seconds=10)
    assert not store.renew_lease("missing", owner, lease_seconds=10)
    store.complete("k1", owner, {"ok": True})
    assert not store.renew_lease("k1", owner, lease_seconds=10)  # settled: nothing to renew
    record = store.get("k1")
    assert record is not None
    assert record.status == "succeeded"
    assert record.lease_expires_at is None


def test_a_closed_gate_leaves_no_renewal_thread(make_gate: MakeGate, store: SQLStore) -> None:
    started = threading.Event()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        started.set()
        return {"paid": amount}

    gate = make_gate(_table(pay))
    gate.execute(_granted(gate).token)
    assert started.is_set()
    keeper = gate._settlement.leases
    thread = keeper._thread
    assert thread is not None  # started with the tool, lingering after it
    gate.close()
    assert keeper._thread is None
    # this gate's thread (other tests' gates, in memory too, may still have theirs lingering)
    assert not thread.is_alive()


def test_a_store_in_memory_is_renewed_too(clock: FakeClock) -> None:
    """SQLite in memory is one connection that threads share, one at a time: the renewal thread
    runs beside the call (a `recover` in another thread would otherwise take a live run over:
    test_round11_leases), and the call runs once."""
    store = open_store("sqlite://", clock=clock)
    store.setup()
    runs: list[int] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        runs.append(amount)
        return {"paid": amount}

    with EffectGate(_table(pay), store, clock=clock) as gate:
        assert isinstance(gate.execute(_granted(gate).token), Executed)
        assert runs == [5]
        assert gate._settlement.leases._thread is not None
    assert gate._settlement.leases._thread is None
    store.close()


def test_a_renewal_that_lands_after_the_run_settled_is_not_a_lost_lease(
    make_gate: MakeGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A beat takes the held leases, then the tool returns and its result is stored before the
    renewal runs: the renewal finds nothing in flight, which is no lost lease (no warning)."""
    keeper = make_gate(
        _table(lambda account, amount: {}), policy=Policy(lease_seconds=1000)
    )._settlement.leases
    claim = store.claim("k1", "h1", lease_seconds=1000)
    owner = claim.owner  # type: ignore[union-attr]
    keeper.hold("k1", owner)
    renew = store.renew_lease

    def settled_first(key: str, owner: str, *, lease_seconds: float) -> bool:
        keeper.release(key)  # the tool returned meanwhile
        store.complete(key, owner, {"ok": True})  # and its result was stored
        return renew(key, owner, lease_seconds=lease_seconds)

    store.renew_lease = settled_first  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="effectgate._execution"):
        assert keeper.beat() == []
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
    keeper.close()


def test_a_slow_after_snapshot_keeps_its_lease(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """The lease is renewed from the claim to the stored outcome, not only while the tool runs: a
    slow snapshot (it reads the provider's state) is part of the run."""
    receiver = EffectRecorder()
    gates: list[EffectGate] = []
    snapshots: list[int] = []
    _, renewed = _counting_renewals(store)

    def snapshot(args: Any) -> dict[str, int]:
        snapshots.append(1)
        if len(snapshots) == 2:  # the after-snapshot of the first run
            _outlive_three_leases(clock, renewed)
            assert gates[1].recover() == []
        return {"balance": 0}

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    table = _table(pay)
    table = EffectTable([dataclasses.replace(table.get("pay"), snapshot=snapshot)])  # type: ignore[arg-type]
    table.allow("support", ["pay"])
    policy = Policy(lease_seconds=LEASE)
    first = make_gate(table, policy=policy)
    gates += [first, make_gate(table, keyring=first.keyring, policy=policy)]
    assert isinstance(first.execute(_granted(first).token), Executed)
    assert receiver.count("pay") == 1
    assert [e.status for e in first.store.executions()] == ["succeeded"]


def test_a_gate_used_after_close_still_renews(make_gate: MakeGate, store: SQLStore, clock: FakeClock) -> None:
    """close() stops the thread; a tool run later starts it again (it is not left unrenewed)."""
    gates: list[EffectGate] = []
    _, renewed = _counting_renewals(store)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (slowly)."""
        _outlive_three_leases(clock, renewed)
        assert gates[1].recover() == []
        return {"paid": amount}

    policy = Policy(lease_seconds=LEASE)
    first = make_gate(_table(pay), policy=policy)
    gates += [first, make_gate(_table(pay), keyring=first.keyring, policy=policy)]
    first.close()
    assert isinstance(first.execute(_granted(first).token), Executed)


def test_a_run_that_ends_leaves_a_later_runs_hold_alone(store: SQLStore) -> None:
    """Run A (taken over) and run B (a reconcile that ran it again) share a key: A's end must not
    stop B's renewal."""
    keeper = LeaseKeeper(store, 1000)
    keeper.hold("k", "owner-a")
    keeper.hold("k", "owner-b")  # B's claim took the key over
    keeper.release("k", "owner-a")  # A's tool returns afterwards
    assert keeper._held == {"k": "owner-b"}
    keeper.release("k", "owner-b")
    assert keeper._held == {}
    keeper.close()


def test_an_interrupted_tool_is_no_longer_renewed(make_gate: MakeGate, store: SQLStore) -> None:
    """A tool interrupted by a BaseException (Ctrl-C) leaves the flow at its `yield`: the driver
    closes it, so its lease is released now, not when a kept exception is finally collected."""
    kept: list[BaseException] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (interrupted)."""
        raise KeyboardInterrupt

    gate = make_gate(_table(pay))
    try:
        gate.execute(_granted(gate).token)
    except KeyboardInterrupt as exc:
        kept.append(exc)  # as a REPL keeps the last exception
    assert kept
    assert gate._settlement.leases._held == {}


def test_a_cancelled_async_tool_is_no_longer_renewed(make_gate: MakeGate, store: SQLStore) -> None:
    async def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (never answers)."""
        started.set()
        await asyncio.Event().wait()
        return {"paid": amount}

    gate = make_gate(_table(pay))
    token = _granted(gate).token
    kept: list[BaseException] = []

    async def main() -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            kept.append(exc)

    started = asyncio.Event()
    asyncio.run(main())
    assert kept
    assert gate._settlement.leases._held == {}
