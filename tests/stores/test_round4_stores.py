"""Round 4 review of the stores under real concurrency: threads and processes ordered by
barriers, events and pipes (never by sleeps), on SQLite and PostgreSQL. Effects are counted at
the tool and the final records asserted.

Defects found (each test failed before its fix):
- a session the server ends in the middle of a step's transaction surfaced as its ROLLBACK's
  "the connection is lost" (`store.lost_connection` said no) instead of the loss itself;
- `setup()` on a current PostgreSQL database deadlocked with a running gate (CREATE INDEX IF NOT
  EXISTS locks its table even when the index exists);
- a role without privileges on the tables was told "no effectgate schema: run setup";
- a store in memory (one connection) used by two threads (the gate's read-log writer, a
  notifier's thread, a web inbox) ran one thread's statements inside the other's transaction,
  and a connection given back rolled that transaction back half-way: an operation ran twice.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    Refused,
    ToolSpec,
    open_store,
)
from effectgate.errors import InProgress, LeaseLost, NeedsReconciliation, TokenError
from effectgate.examples.shop import context
from effectgate.stores import Claimed, SQLStore
from effectgate.testing import EffectRecorder, FakeClock
from tests.conformance.stores import approval_row

FINANCE = Approver("fiona", "finance")
HASH = "h" * 64
ARGS = {"account": "a", "amount": 5}


def _table(
    receiver: EffectRecorder, hold: threading.Event | None = None, entered: threading.Event | None = None
) -> EffectTable:
    """A money tool `pay` that records each run at `receiver`, sets `entered` and waits for `hold`."""

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        if entered is not None:
            entered.set()
        if hold is not None:
            assert hold.wait(30)
        return {"paid": amount}

    t = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    t.allow("support", ["pay"])
    return t


def _approved(gate: EffectGate) -> tuple[str, str]:
    """A pay call proposed and approved: (approval id, grant token)."""
    pending = gate.call("pay", ARGS, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return pending.approval_id, grant.token


class _Workers:
    """Gates on separate stores of one database (other workers, in effect), one keyring."""

    def __init__(self, url: str, clock: FakeClock, table: EffectTable, n: int = 2) -> None:
        self.stores = [open_store(url, clock=clock) for _ in range(n)]
        self.stores[0].setup()
        keyring = Keyring.generate()
        self.gates = [EffectGate(table, s, keyring=keyring, clock=clock) for s in self.stores]

    def close(self) -> None:
        for g in self.gates:
            g.close()
        for s in self.stores:
            s.close()


def _terminate(store: SQLStore, conn: sa.Connection) -> None:
    """End `conn`'s server session from another connection (pg_terminate_backend)."""
    pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool).connect() as admin:
        assert admin.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()


# -- defects


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    ("step", "kind"), [("propose", "proposed"), ("approve", "approved"), ("claim", "token_used")]
)
def test_a_session_terminated_inside_a_step_of_the_money_path_writes_none_of_it(
    step: str, kind: str, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the gate's session (pg_terminate_backend from another connection) between
    the statements of a step's transaction: the step raises the loss itself (`lost_connection`
    says so, as the protocol promises for an exception a transaction raised), not its ROLLBACK's
    "the connection is lost" that hid it; none of the step's rows is written; and the same step
    done again completes the call, which runs once."""
    receiver = EffectRecorder()
    gate = EffectGate(_table(receiver), store, keyring=Keyring.generate(), clock=clock)
    armed: list[bool] = []
    append_events = store.append_events

    def terminated_here(conn: Any, events: Any) -> None:
        if armed and any(e.get("kind") == kind for e in events):
            armed.clear()
            _terminate(store, conn)
        append_events(conn, events)

    monkeypatch.setattr(store, "append_events", terminated_here)
    try:
        before: list[str] = []
        approval_id = token = ""
        if step != "propose":
            pending = gate.call("pay", ARGS, context("m1"))
            assert isinstance(pending, Pending)
            approval_id, before = pending.approval_id, ["proposed"]
        if step == "claim":
            grant = gate.approve(approval_id, version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            token, before = grant.token, [*before, "approved", "token_minted"]
        steps: dict[str, Callable[[], object]] = {
            "propose": lambda: gate.call("pay", ARGS, context("m1")),
            "approve": lambda: gate.approve(approval_id, version=1, approver=FINANCE),
            "claim": lambda: gate.execute(token),
        }
        armed.append(True)
        with pytest.raises(sa.exc.DBAPIError) as lost:
            steps[step]()
        assert not armed
        assert store.lost_connection(lost.value)
        assert "ROLLBACK" not in str(lost.value)
        assert receiver.count("pay") == 0
        assert [e.kind for e in store.events()] == before
        assert [a.status for a in store.approvals()] == (
            [] if step == "propose" else ["pending" if step == "approve" else "approved"]
        )
        assert len(store.all_decisions()) == (1 if step == "claim" else 0)
        assert store.idempotency_records() == []
        assert all(a.token_used_at is None for a in store.approvals())
        # the same step again, then the rest of the call: it runs once
        if step != "claim":
            _, token = _approved(gate)
        assert gate.execute(token).result == {"paid": 5}
        assert receiver.count("pay") == 1
        assert [a.status for a in store.approvals()] == ["executed"]
        assert [r.status for r in store.idempotency_records()] == ["succeeded"]
        assert [e.status for e in store.executions()] == ["succeeded"]
    finally:
        gate.close()


def _waiting_for_a_lock(store: SQLStore) -> bool:
    """Whether a session of this database waits for a lock another session holds."""
    with sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool).connect() as admin:
        return bool(
            admin.exec_driver_sql(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE NOT l.granted AND d.datname = current_database()"
            ).scalar_one()
        )


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_setup_on_a_current_database_does_not_deadlock_a_running_gate(
    store: SQLStore, clock: FakeClock
) -> None:
    """A worker starts (its `setup()`, on the database the running workers use, already of this
    schema version) while another worker's transaction has written an approval and is about to
    append its event. Setup must neither wait for that transaction nor take a lock it waits for.
    Before, setup's CREATE INDEX IF NOT EXISTS took a SHARE lock on eg_events, then waited for
    eg_approvals; the gate then waited for eg_events, and PostgreSQL ended one of them with
    "deadlock detected" (here the starting worker's setup)."""
    store.run("warm", HASH, lambda: 0)
    starting = open_store(store.engine.url.render_as_string(hide_password=False), clock=clock)
    done = threading.Event()
    errors: list[BaseException] = []

    def set_up() -> None:
        try:
            starting.setup()
        except BaseException as exc:  # asserted below
            errors.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=set_up)
    try:
        with store.transaction() as conn:
            store.insert_approval(conn, approval_row("a1", created_at=clock.now()))
            worker.start()
            # setup is done, or it waits for a lock this transaction holds
            while not done.wait(0.01) and not _waiting_for_a_lock(store):
                pass
            store.append_events(conn, [{"at": clock.now(), "kind": "proposed", "approval_id": "a1"}])
        worker.join(60)
        assert errors == []
        assert [a.id for a in store.approvals()] == ["a1"]
        assert [e.kind for e in store.events()] == ["proposed"]
        assert starting.run("after", HASH, lambda: 1) == 1
    finally:
        worker.join(60)
        starting.close()


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_role_without_privileges_is_not_told_there_is_no_schema(store: SQLStore) -> None:
    """A worker connecting as a role that may not read the effectgate tables (a GRANT missing)
    gets the database's own "permission denied", not "no effectgate schema: run `effectgate
    setup`", which sent its operator to create tables that exist."""
    role = f"eg_noprivs_{os.getpid()}"
    admin = sa.create_engine(store.engine.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    worker = open_store(store.engine.url.set(username=role).render_as_string(hide_password=False))
    try:
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            worker.approvals()
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            worker.run("k", HASH, lambda: 1)
        assert store.idempotency_records() == []
    finally:
        worker.close()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


def test_a_missing_schema_is_still_named(store_url: str, clock: FakeClock) -> None:
    """The other side of the fix above: a database without the tables is still refused as "no
    effectgate schema", on both databases."""
    from effectgate.errors import StoreError

    empty = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="no effectgate schema"):
            empty.approvals()
        with pytest.raises(StoreError, match="no effectgate schema"):
            empty.run("k", HASH, lambda: 1)
    finally:
        empty.close()


# -- the same promises under real concurrency (these held)


def test_two_workers_claim_one_key_and_exactly_one_runs(store_url: str, clock: FakeClock) -> None:
    stores = [open_store(store_url, clock=clock) for _ in range(2)]
    stores[0].setup()
    barrier = threading.Barrier(2)
    runs: list[int] = []

    def work(i: int) -> object:
        barrier.wait()
        try:
            return stores[i].claim("k", HASH)
        except InProgress as exc:
            return exc

    try:
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(work, range(2)))
        [claimed] = [o for o in outs if isinstance(o, Claimed)]
        assert sum(isinstance(o, InProgress) for o in outs) == 1
        runs.append(1)
        stores[1].complete("k", claimed.owner, {"ran": 1})
        assert runs == [1]
        [record] = stores[0].idempotency_records()
        assert (record.status, record.result, record.attempts) == ("succeeded", {"ran": 1}, 1)
    finally:
        for s in stores:
            s.close()


def test_a_grant_presented_by_two_workers_runs_once(store_url: str, clock: FakeClock) -> None:
    receiver, inside, release = EffectRecorder(), threading.Event(), threading.Event()
    workers = _Workers(store_url, clock, _table(receiver, release, inside))

    def present(i: int) -> str:
        if i == 1:
            assert inside.wait(30)  # the first is running the tool
        try:
            workers.gates[i].execute(token)
            return "executed"
        except TokenError as exc:
            return exc.reason
        finally:
            if i == 1:
                release.set()

    try:
        _, token = _approved(workers.gates[0])
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(present, 0)
            assert pool.submit(present, 1).result(30) == "used"
            assert first.result(30) == "executed"
        assert receiver.count("pay") == 1
        assert [e.status for e in workers.stores[1].executions()] == ["succeeded"]
    finally:
        release.set()
        workers.close()


def test_many_threads_on_one_store_present_one_grant_once(store: SQLStore, clock: FakeClock) -> None:
    receiver = EffectRecorder()
    gate = EffectGate(_table(receiver), store, keyring=Keyring.generate(), clock=clock)
    try:
        _, token = _approved(gate)
        barrier = threading.Barrier(6)

        def present(_: int) -> str:
            barrier.wait()
            try:
                gate.execute(token)
                return "executed"
            except TokenError as exc:
                return exc.reason

        with ThreadPoolExecutor(6) as pool:
            outs = sorted(pool.map(present, range(6)))
        assert receiver.count("pay") == 1
        assert outs == ["executed"] + ["used"] * 5
        assert [e.status for e in store.executions()] == ["succeeded"]
    finally:
        gate.close()


def test_two_sessions_propose_on_one_subject_at_once(store_url: str, clock: FakeClock) -> None:
    receiver = EffectRecorder()
    workers = _Workers(store_url, clock, _table(receiver))
    barrier = threading.Barrier(2)

    def propose(i: int) -> object:
        barrier.wait()
        return workers.gates[i].call("pay", ARGS, context("m1", session_id=f"s-{i}"))

    try:
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(propose, range(2)))
        [pending] = [o for o in outs if isinstance(o, Pending)]
        [refused] = [o for o in outs if isinstance(o, Refused)]
        assert (refused.code, refused.approval_id) == ("subject_busy", pending.approval_id)
        assert [a.status for a in workers.stores[0].approvals()] == ["pending"]
    finally:
        workers.close()


def test_a_lease_that_expires_while_its_holder_runs_is_never_run_twice(
    store_url: str, clock: FakeClock
) -> None:
    """The holder's tool is still running when another worker's `recover` finds its lease expired:
    a second presentation runs nothing, and the holder's known outcome settles the record."""
    receiver, inside, release = EffectRecorder(), threading.Event(), threading.Event()
    workers = _Workers(store_url, clock, _table(receiver, release, inside))
    try:
        approval_id, token = _approved(workers.gates[0])
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(workers.gates[0].execute, token)
            assert inside.wait(30)
            clock.advance(workers.gates[0].policy.lease_seconds + 1)
            assert len(workers.gates[1].recover()) == 1
            with pytest.raises(NeedsReconciliation):
                workers.gates[1].execute(token)
            release.set()
            assert first.result(30).result == {"paid": 5}
        assert receiver.count("pay") == 1
        assert [r.status for r in workers.stores[1].idempotency_records()] == ["succeeded"]
        assert [e.status for e in workers.stores[1].executions()] == ["succeeded"]
        approval = workers.stores[1].get_approval(approval_id)
        assert approval is not None
        assert approval.status == "executed"
    finally:
        release.set()
        workers.close()


def test_a_late_holder_after_a_person_settled_did_not_happen(store_url: str, clock: FakeClock) -> None:
    """As above, but a person settled the reconciliation as "did not happen" before the holder
    returned: its completion is refused (LeaseLost) and recorded, the record needs
    reconciliation again, and nothing ran twice."""
    receiver, inside, release = EffectRecorder(), threading.Event(), threading.Event()
    workers = _Workers(store_url, clock, _table(receiver, release, inside))
    try:
        approval_id, token = _approved(workers.gates[0])
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(workers.gates[0].execute, token)
            assert inside.wait(30)
            clock.advance(workers.gates[0].policy.lease_seconds + 1)
            assert len(workers.gates[1].recover()) == 1
            workers.gates[1].settle(approval_id, happened=False, by="fiona")
            with pytest.raises(TokenError):
                workers.gates[1].execute(token)
            release.set()
            with pytest.raises(LeaseLost):
                first.result(30)
        assert receiver.count("pay") == 1
        store = workers.stores[1]
        assert [r.status for r in store.idempotency_records()] == ["needs_reconciliation"]
        assert [e.status for e in store.executions()] == ["failed", "needs_reconciliation"]
        assert [e.kind for e in store.events(kind="lease_lost")] == ["lease_lost"]
    finally:
        release.set()
        workers.close()


def _forked_execute(gate: EffectGate, token: str) -> None:
    """Present `token` in a forked child of this process (the store was used before the fork)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        try:
            gate.execute(token)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the worker was "killed" (os._exit(0))


def _runs(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("killed_in", ["tool", "completion"])
def test_a_worker_killed_between_claim_and_complete_is_never_run_again(
    killed_in: str, store_url: str, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked worker dies in the tool, or inside the transaction that stores its result
    (before COMMIT): the record stays in flight, `recover` makes it needs_reconciliation, and
    neither a presentation in between nor after runs the tool again."""
    runs, parent = tmp_path / "runs", os.getpid()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        with runs.open("a") as f:
            f.write(f"{os.getpid()}\n")
        if killed_in == "tool" and os.getpid() != parent:
            os._exit(0)
        return {"paid": amount}

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("support", ["pay"])
    store = open_store(store_url, clock=clock)
    store.setup()
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    append_execution = store.append_execution

    def killed(conn: Any, **values: Any) -> None:
        append_execution(conn, **values)
        if os.getpid() != parent:
            os._exit(0)

    if killed_in == "completion":
        monkeypatch.setattr(store, "append_execution", killed)
    try:
        approval_id, token = _approved(gate)
        _forked_execute(gate, token)
        assert _runs(runs) == 1
        assert [r.status for r in store.idempotency_records()] == ["in_progress"]
        assert store.executions() == []
        with pytest.raises(TokenError):
            gate.execute(token)  # its lease is live: executing now
        clock.advance(gate.policy.lease_seconds + 1)
        assert len(gate.recover()) == 1
        with pytest.raises(NeedsReconciliation):
            gate.execute(token)
        assert _runs(runs) == 1
        assert [r.status for r in store.idempotency_records()] == ["needs_reconciliation"]
        approval = store.get_approval(approval_id)
        assert approval is not None
        assert approval.token_used_at is not None
    finally:
        gate.close()
        store.close()


def test_sqlite_writers_queue_for_the_lock_another_process_holds(sqlite_url: str, clock: FakeClock) -> None:
    """Another process holds SQLite's write lock (BEGIN IMMEDIATE on a connection of its own)
    while the store claims a key: the claim waits for the lock (busy timeout) instead of failing
    with "database is locked", and is done once the other commits."""
    store = open_store(sqlite_url, clock=clock)
    store.setup()
    store.run("warm", HASH, lambda: 0)
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    started = threading.Event()
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE eg_idempotency SET error = 'held' WHERE \"key\" = 'warm'")
        with store._single() as conn:  # the connection the claim will take
            driver: Any = conn.connection.driver_connection
            driver.set_trace_callback(lambda sql: started.set() if "eg_idempotency" in sql else None)
        with ThreadPoolExecutor(1) as pool:
            claimed = pool.submit(store.claim, "k", HASH)
            assert started.wait(30)  # the claim's statement runs: it waits for the lock
            other.execute("COMMIT")
            assert isinstance(claimed.result(30), Claimed)
        k, warm = sorted(store.idempotency_records(), key=lambda r: r.key)
        assert (k.key, k.status, warm.error) == ("k", "in_progress", "held")
    finally:
        other.close()
        store.close()


def test_workers_setting_up_a_fresh_database_at_once(store_url: str, clock: FakeClock) -> None:
    stores = [open_store(store_url, clock=clock) for _ in range(3)]
    barrier = threading.Barrier(3)

    def start(i: int) -> Any:
        barrier.wait()
        stores[i].setup()
        return stores[i].run(f"k{i}", HASH, lambda: i)

    try:
        with ThreadPoolExecutor(3) as pool:
            assert sorted(pool.map(start, range(3))) == [0, 1, 2]
    finally:
        for s in stores:
            s.close()


def test_an_executed_approval_edited_back_to_approved_never_runs_again(
    store: SQLStore, clock: FakeClock
) -> None:
    """Someone with write access sets the executed approval back to approved with its
    token_used_at cleared and its expiries pushed out, and deletes its idempotency record (a
    mutable table): the append-only rows still say the grant was spent."""
    receiver = EffectRecorder()
    gate = EffectGate(_table(receiver), store, keyring=Keyring.generate(), clock=clock)
    try:
        approval_id, token = _approved(gate)
        gate.execute(token)
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE eg_approvals SET status = 'approved', token_used_at = NULL, "
                    "token_expires_at = :far, expires_at = :far WHERE id = :id"
                ),
                {"far": clock.now() + 10**6, "id": approval_id},
            )
            conn.execute(sa.text("DELETE FROM eg_idempotency"))
        with pytest.raises(TokenError) as refused:
            gate.execute(token)
        assert refused.value.reason == "used"
        assert receiver.count("pay") == 1
        assert store.idempotency_records() == []
        assert [e.status for e in store.executions()] == ["succeeded"]
    finally:
        gate.close()


class _WatchedLock:
    """A reentrant lock that says when a thread has to wait for it (`contended`)."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock, self._contended = threading.RLock(), contended

    def acquire(self) -> bool:
        if not self._lock.acquire(blocking=False):
            self._contended.set()
            self._lock.acquire()
        return True

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_an_in_memory_store_used_by_two_threads_runs_each_operation_once(clock: FakeClock) -> None:
    """A store in memory is one shared connection. A background thread of the process (the read
    log's writer, a notifier's delivery thread: both record in their own transactions) is in a
    transaction that ends rolled back, while the caller's thread runs an operation: the caller's
    claim and completion must not run inside that transaction and vanish with its rollback (then
    the same key ran again), nor fail with "cannot start a transaction within a transaction"."""
    store = open_store("sqlite://", clock=clock)
    store.setup()
    inside, release, progress = threading.Event(), threading.Event(), threading.Event()
    assert getattr(store._checkouts, "serial", None) is not None  # one thread at a time
    store._checkouts.serial = _WatchedLock(progress)  # the same, and it says when one waits
    runs: list[int] = []

    def rolled_back() -> None:
        with store.transaction() as conn:
            store.append_events(conn, [{"at": clock.now(), "kind": "webhook_failed"}])
            inside.set()
            assert release.wait(30)
            raise RuntimeError("this transaction rolls back")

    def background() -> None:
        with pytest.raises(RuntimeError, match="rolls back"):
            rolled_back()

    def pay() -> int:
        runs.append(1)
        return len(runs)

    def operation() -> object:
        return store.run("k", HASH, pay)

    try:
        with ThreadPoolExecutor(2) as pool:
            writer = pool.submit(background)
            assert inside.wait(30)
            first = pool.submit(operation)
            first.add_done_callback(lambda _: progress.set())
            assert progress.wait(30)  # the operation is done, or waits for the transaction
            release.set()
            writer.result(30)
            assert first.result(30) == 1
        assert operation() == 1  # the stored result: nothing runs again
        assert runs == [1]
        assert [(r.key, r.status) for r in store.idempotency_records()] == [("k", "succeeded")]
        assert store.events() == []
    finally:
        release.set()
        store.close()


def test_an_in_memory_gate_writing_its_read_log_while_a_call_is_proposed(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's read-log writer (its own thread) writes a batch to a store in memory while the
    caller's thread proposes a money call: both commit, whole (before, the proposal ran inside
    the writer's transaction, or failed with "cannot start a transaction within a transaction")."""
    store = open_store("sqlite://", clock=clock)
    store.setup()
    receiver = EffectRecorder()

    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"order_id": order_id}

    table = _table(receiver)
    table.register(ToolSpec(name="lookup", effect=Effect.READ, fn=lookup))
    table.allow("support", ["pay", "lookup"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    inside, release, progress = threading.Event(), threading.Event(), threading.Event()
    assert getattr(store._checkouts, "serial", None) is not None  # one thread at a time
    store._checkouts.serial = _WatchedLock(progress)  # the same, and it says when one waits
    append_reads = store.append_reads

    def held_reads(conn: Any, rows: Any) -> None:
        append_reads(conn, rows)
        inside.set()
        assert release.wait(30)

    monkeypatch.setattr(store, "append_reads", held_reads)
    try:
        gate.call("lookup", {"order_id": "o-1"}, context("m0"))
        with ThreadPoolExecutor(2) as pool:
            writer = pool.submit(gate.flush)
            assert inside.wait(30)
            proposed = pool.submit(gate.call, "pay", ARGS, context("m1"))
            proposed.add_done_callback(lambda _: progress.set())
            assert progress.wait(30)  # proposed, or waiting for the writer's transaction
            release.set()
            writer.result(30)
            assert isinstance(proposed.result(30), Pending)
        assert [e.kind for e in store.events(kind="read")] == ["read"]
        assert [e.kind for e in store.events(kind="proposed")] == ["proposed"]
        assert [a.status for a in store.approvals()] == ["pending"]
    finally:
        release.set()
        gate.close()
        store.close()
