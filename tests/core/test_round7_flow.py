"""Round 7: the flows and their drivers under cancellation and interruption, the read log and the
lease keeper. Each test's docstring tells the defect it was written against (it failed before its
fix). On SQLite and PostgreSQL; waits are events and executor shutdowns, never sleeps."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any, ClassVar

import pytest

from effectgate import (
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Keyring,
    Reconciled,
    ToolContext,
    ToolSpec,
    _readlog,
    flow,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_lease_edges import _cancel, _cancel_while, _on_one_thread, _OneThread
from .test_lease_renewal import _granted, _table


def _read_then_write(started: threading.Event, finish: threading.Event, saved: list[str]) -> EffectTable:
    def look(q: str) -> str:
        """Look something up (slowly)."""
        started.set()
        assert finish.wait(10)
        return q

    def save(note: str) -> None:
        """Save a note."""
        saved.append(note)

    table = EffectTable(
        [
            ToolSpec(name="look", effect=Effect.READ, fn=look),
            ToolSpec(name="save", effect=Effect.WRITE, fn=save),
        ]
    )
    table.allow("support", ["look", "save"])
    return table


def test_a_step_cancelled_under_its_first_calls_sync_tool_claims_none_of_the_next(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`acall_step([look, save])` cancelled while `look` (a sync read) runs in its worker thread:
    the read's outcome was stored by sending it into the flow, which went on to the step's next
    call and claimed the write `save` (committed, after the cancellation) before it was closed at
    its tool. The write never ran, yet its record sat in flight: the same call made again was
    refused `in_progress`, then `needs_reconciliation`, and a person was asked about a write that
    never happened."""
    started, finish = threading.Event(), threading.Event()
    saved: list[str] = []
    gate = make_gate(_read_then_write(started, finish, saved))
    kept: list[Any] = []

    async def main() -> None:
        task = asyncio.ensure_future(
            gate.acall_step([("look", {"q": "a"}), ("save", {"note": "n"})], context("m1"))
        )
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            kept.extend([task, exc])

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())
    finish.set()
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    gate.flush()
    assert len(kept) == 2
    assert saved == []
    assert store.idempotency_records() == []  # nothing claimed for a cancelled step
    assert [e.kind for e in store.events(kind="read")] == ["read"]  # the read that ran, once
    out = gate.call("save", {"note": "n"}, context("m1"))
    assert saved == ["n"], out


def _no_write_claimed(gate: Any, store: SQLStore, saved: list[str]) -> None:
    gate.flush()
    assert saved == []
    assert store.idempotency_records() == []  # nothing claimed for a cancelled step
    assert [e.kind for e in store.events(kind="read")] == ["read"]  # the read that ran, once
    gate.call("save", {"note": "n"}, context("m1"))
    assert saved == ["n"]


def test_a_step_whose_read_outcome_the_cancelled_task_never_took_claims_none_of_the_next(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with the read's outcome handed over and the task cancelled before it took it:
    `abandon` stored it and the step's write was claimed, never to run."""
    started, finish, handed, cancelled = (threading.Event() for _ in range(4))
    finish.set()
    saved: list[str] = []
    kept: list[Any] = []
    ended = flow._Worker._ended

    def hand_over_then_wait(worker: Any, returned: bool, value: Any) -> None:
        ended(worker, returned, value)
        handed.set()
        assert cancelled.wait(10)

    monkeypatch.setattr(flow._Worker, "_ended", hand_over_then_wait)
    gate = make_gate(_read_then_write(started, finish, saved))

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        calls = [("look", {"q": "a"}), ("save", {"note": "n"})]
        task = asyncio.ensure_future(gate.acall_step(calls, context("m1")))
        await loop.run_in_executor(side, handed.wait, 10)
        await _cancel(task, kept)
        cancelled.set()

    _on_one_thread(scenario)
    assert len(kept) == 2
    _no_write_claimed(gate, store, saved)


def test_a_step_cancelled_while_its_reads_outcome_step_was_queued_claims_none_of_the_next(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """As above, cancelled while the step storing the read's outcome waited for a thread: that
    step runs (it stores an outcome), and went on to claim the write."""
    started, finish = threading.Event(), threading.Event()
    saved: list[str] = []
    kept: list[Any] = []
    gate = make_gate(_read_then_write(started, finish, saved))

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        calls = [("look", {"q": "a"}), ("save", {"note": "n"})]
        task = asyncio.ensure_future(gate.acall_step(calls, context("m1")))
        await loop.run_in_executor(side, started.wait, 10)
        unblock = threading.Event()
        blocked = loop.run_in_executor(None, unblock.wait, 10)  # queued behind the tool
        queued = executor.submitted
        finish.set()  # the tool returns; the blocker takes the thread
        await loop.run_in_executor(side, executor.until, queued + 1)  # the outcome step is queued
        await _cancel(task, kept)
        unblock.set()
        await blocked

    _on_one_thread(scenario)
    assert len(kept) == 2
    _no_write_claimed(gate, store, saved)


def test_an_execution_cancelled_before_its_claim_keeps_the_grant(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`aexecute` cancelled (a timeout) while its first step, in a worker thread, still verified
    the grant: the step went on to claim the key and spend the grant, then its flow was closed
    before the tool. The payment never ran, yet its record sat in flight, `recover` turned it into
    needs_reconciliation and a person had to settle it; the grant could not be presented again."""
    receiver = EffectRecorder()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    gate = make_gate(_table(pay))
    grant = _granted(gate)
    in_step, go_on = threading.Event(), threading.Event()
    locked = store.locked_decided  # execute's first read: the approval with its decisions

    def slow_locked_decided(conn: Any, approval_id: str) -> Any:
        if not in_step.is_set():
            in_step.set()
            assert go_on.wait(10)
        return locked(conn, approval_id)

    store.locked_decided = slow_locked_decided  # type: ignore[method-assign]
    kept: list[Any] = []
    loop = _cancel_while(gate, grant.token, in_step, kept)
    go_on.set()
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    assert receiver.count("pay") == 0
    assert store.idempotency_records() == []  # nothing claimed: the grant is kept
    executed = gate.execute(grant.token)
    assert isinstance(executed, Executed)
    assert receiver.count("pay") == 1
    assert [e.status for e in store.executions()] == ["succeeded"]


def test_a_gate_dropped_without_close_keeps_no_thread_and_loses_no_read(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gate made per request (or per notebook cell) and dropped without `close()`: its read
    writer's thread waited for rows for ever, holding the read log and the store, so each such
    gate kept a thread and its store alive until the process ran out of threads. The lease keeper
    ends its thread when nothing is held for `IDLE` seconds; the read writer did not."""
    monkeypatch.setattr(_readlog, "IDLE", 0.0, raising=False)  # idle after one empty round
    started, finish = threading.Event(), threading.Event()
    finish.set()
    gate = EffectGate(_read_then_write(started, finish, []), store, keyring=Keyring.generate(), clock=clock)
    gate.call("look", {"q": "a"}, context("m1"))
    first = gate._reads._thread
    assert first is not None
    first.join(10)
    assert not first.is_alive()  # it ended, having written the read
    assert len(store.events(kind="read")) == 1
    gate.call("look", {"q": "b"}, context("m2"))  # a later read starts another
    second = gate._reads._thread
    assert second is not None
    assert second is not first
    second.join(10)
    assert not second.is_alive()
    assert len(store.events(kind="read")) == 2
    log = weakref.ref(gate._reads)
    del gate
    gc.collect()
    assert log() is None


def test_a_hook_a_cancelled_calls_outcome_calls_reconciles_as_it_would_otherwise(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The outcome of a cancelled call's tool is stored by its worker thread, which refuses
    further claims of that flow (above); a hook that the storing calls (`on_needs_reconciliation`
    reconciling at once) is a call of its own, and runs as it would for any other call."""
    started, finish = threading.Event(), threading.Event()
    runs: list[str] = []

    def pay(account: str, amount: int, tool_context: ToolContext) -> dict[str, int]:
        """Pay `amount` to an account (the first attempt times out before the provider saw it)."""
        runs.append(tool_context.idempotency_key)
        if len(runs) == 1:
            started.set()
            assert finish.wait(10)
            raise TimeoutError("no answer")
        return {"paid": amount}

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
    reconciled: list[Any] = []
    gate = make_gate(
        table, on_needs_reconciliation=lambda n: reconciled.append(gate.reconcile(n.approval_id))
    )
    grant = _granted(gate)
    kept: list[Any] = []
    loop = _cancel_while(gate, grant.token, started, kept)
    finish.set()
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    assert len(runs) == 2  # the hook ran it again under the same key
    assert [type(r).__name__ for r in reconciled] == ["Executed"]
    record = store.get(runs[0])
    assert record is not None
    assert record.status == "succeeded"


class _NoThreadOnce(threading.Thread):
    """A thread whose first start fails as under a process's thread limit ("can't start new
    thread"); later ones start."""

    failed: ClassVar[list[str]] = []

    def start(self) -> None:
        if not _NoThreadOnce.failed:
            _NoThreadOnce.failed.append(self.name)
            raise RuntimeError("can't start new thread")
        super().start()


@pytest.fixture
def no_thread_once(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    _NoThreadOnce.failed = []
    monkeypatch.setattr(threading, "Thread", _NoThreadOnce)
    return _NoThreadOnce.failed


def test_a_lease_thread_that_could_not_start_neither_strands_the_call_nor_stops_renewal(
    make_gate: MakeGate, store: SQLStore, no_thread_once: list[str]
) -> None:
    """The lease keeper's thread failing to start (the process at its thread limit) raised out of
    the claimed call before its tool ran, leaving its record in flight and its key held, and left
    the unstarted thread as the keeper's: no later hold started one, so no lease was renewed again
    for the life of the process (a slow tool's lease then ran out, and `recover` elsewhere could
    take it over and run it a second time)."""
    saved: list[str] = []
    gate = make_gate(_read_then_write(threading.Event(), threading.Event(), saved))
    gate.call("save", {"note": "a"}, context("m1"))
    assert no_thread_once == ["effectgate-leases"]
    assert saved == ["a"]
    assert [r.status for r in store.idempotency_records()] == ["succeeded"]
    keeper = gate._settlement.leases
    assert keeper._held == {}
    keeper.hold("k", "o")  # a later run's hold starts the thread
    try:
        assert keeper._thread is not None
        assert keeper._thread.is_alive()
    finally:
        keeper.release("k", "o")


def test_a_read_writer_that_could_not_start_neither_fails_the_read_nor_stops_writing(
    make_gate: MakeGate, store: SQLStore, no_thread_once: list[str]
) -> None:
    """The read writer's thread failing to start raised out of a read that had run (its caller
    told it failed), and left the unstarted thread as the writer's: no later read started one, so
    reads were written only by an explicit flush or at a clean exit."""
    finish = threading.Event()
    finish.set()
    gate = make_gate(_read_then_write(threading.Event(), finish, []))
    out = gate.call("look", {"q": "a"}, context("m1"))
    assert isinstance(out, Executed)
    assert no_thread_once == ["effectgate-readlog"]
    gate.call("look", {"q": "b"}, context("m2"))
    writer = gate._reads._thread
    assert writer is not None
    assert writer.is_alive()
    gate.flush()
    assert len(store.events(kind="read")) == 2
