"""Round 18, stores under concurrency. Five defects, fixed:

- The streamed reads (`_dialect.stream`: the audit's queries, the ledger's hash chain, erased
  values) ran on the driver's own cursor without `_dialect.run`'s wrapping: a PostgreSQL
  statement or lock timeout (another session holding a lock on the table), or an interrupted
  SQLite statement, reached the caller as the driver's raw error (`psycopg.errors.QueryCanceled`),
  which the CLI reported as "unexpected ... (a bug)" instead of "store unavailable", and which
  no caller that handles SQLAlchemy's errors recognised. Now it is raised as SQLAlchemy's error,
  as every other statement's is.
- A write whose claim's COMMIT landed with its reply lost (a failover) never ran: the call
  raised, the same call again was refused `in_progress` until the lease ran out, then a person
  was asked about a write that never started (round 17 fixed this for `execute` only). Now the
  record is read back (`_deps.claim_landed`): in flight under this call's lease, the tool runs.
- The same for `reconcile` running a call again (its release and new claim in one commit):
  reconciling again was refused `not_reconcilable` until the lease ran out.
- A definite failure whose COMMIT was lost (not landed) left its record in flight: the caller
  got the database's error, not the tool's, and a person was later asked about a call known to
  have failed. Now it is stored once more on a fresh connection, as a result is.
- `recover` committed a record's needs_reconciliation before recording its event: a pass that
  failed in between left an unknown outcome no later pass announced. Now one commit.

Probes that hold (kept): two threads claiming one key, a renewal racing `recover`, a store
closed while its call runs, a child forked after open.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import InProgress, NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.stores.base import Claimed
from effectgate.testing import EffectRecorder, FakeClock


@contextmanager
def _statement_fails(store: SQLStore, conn: sa.Connection) -> Iterator[None]:
    """Make the next statement read on `conn` (a reading transaction) fail as a timeout does:
    PostgreSQL, another session holds the events table locked and this one's statement timeout
    is 1 ms; SQLite, the driver interrupts every statement (a progress handler)."""
    driver = conn.connection.driver_connection
    assert driver is not None
    if store.engine.dialect.name == "sqlite":
        driver.set_progress_handler(lambda: 1, 1)
        try:
            yield
        finally:
            driver.set_progress_handler(None, 1)
        return
    admin = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)
    with admin.connect() as other, other.begin():
        other.exec_driver_sql("LOCK TABLE eg_events IN ACCESS EXCLUSIVE MODE")
        conn.exec_driver_sql("SET LOCAL statement_timeout = 1")
        yield
    admin.dispose()


def test_a_streamed_read_that_times_out_raises_sqlalchemys_error(store: SQLStore) -> None:
    with store.reading() as conn, _statement_fails(store, conn), pytest.raises(sa.exc.DBAPIError):
        list(store.chain_rows(conn, "eg_events", after_id=None))
    assert store.idempotency_records() == []  # the store is usable afterwards


# -- probes that hold today (kept as regression tests)


def test_two_threads_claiming_one_key_run_it_once(store: SQLStore) -> None:
    ran: list[str] = []
    start = threading.Barrier(2)
    tried = threading.Event()  # the loser's claim was decided while the winner's tool runs
    outcomes: dict[str, object] = {}

    def work(name: str) -> None:
        def fn() -> str:
            ran.append(name)
            assert tried.wait(5)
            return name

        start.wait(5)
        try:
            outcomes[name] = store.run("k", "h", fn)
        except InProgress as exc:
            outcomes[name] = exc
            tried.set()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(ran) == 1
    assert sorted(type(o).__name__ for o in outcomes.values()) == ["InProgress", "str"]
    record = store.get("k")
    assert record is not None
    assert (record.status, record.result) == ("succeeded", ran[0])


def test_a_store_closed_while_its_call_runs_stores_the_result(store: SQLStore) -> None:
    assert store.run("k", "h", lambda: store.close() or "done") == "done"
    record = store.get("k")
    assert record is not None
    assert record.status == "succeeded"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_open_uses_its_own_connections(store: SQLStore) -> None:
    claim = store.claim("parent", "h")  # the parent keeps a connection checked out between uses
    assert isinstance(claim, Claimed)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if store.run("child", "h", lambda: "c") == "c" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.complete("parent", claim.owner, "p")
    assert {r.key: (r.status, r.result) for r in store.idempotency_records()} == {
        "parent": ("succeeded", "p"),
        "child": ("succeeded", "c"),
    }


# -- a write whose claim committed while the reply was lost (a failover)


def test_a_write_whose_claim_landed_with_its_reply_lost_runs_once(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's COMMIT landed and the connection went before its reply (simulated as
    tests/core/test_lost_connection.py does): the record is in flight under this call's lease.
    Before, the call raised, the tool never ran, the same call again was refused `in_progress`
    until the lease ran out, and then a person was asked about a write that never started."""
    receiver = EffectRecorder()

    def note(text: str) -> dict[str, str]:
        receiver.record("note", text=text)
        return {"noted": text}

    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note)])
    table.allow("support", ["note"])
    armed = [True]
    driver_end = _dialect.driver_end

    def commit_then_lose(conn: Any, driver: Any, *, commit: bool) -> None:
        driver_end(conn, driver, commit=commit)
        if armed and commit:
            armed.clear()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    monkeypatch.setattr(_dialect, "driver_end", commit_then_lose)
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        try:
            outcome: object = gate.call("note", {"text": "hi"}, context("m1"))
        except sa.exc.DBAPIError:
            outcome = gate.call("note", {"text": "hi"}, context("m1"))  # the caller retries
        assert isinstance(outcome, Executed), outcome
        assert outcome.result == {"noted": "hi"}
    assert receiver.count("note") == 1
    [record] = store.idempotency_records()
    assert record.status == "succeeded"


# -- recover: an expired lease and its announcement


def test_recover_announces_a_lapsed_lease_even_after_a_failed_pass(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recover` committed the record's needs_reconciliation, then recorded its event in a
    transaction of its own: when that one failed (the connection lost), the pass raised and the
    next pass found nothing in flight, so the unknown outcome was never announced (no event, no
    notice). Now the record and its event commit together: a failed pass changes nothing."""
    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=lambda text: text)])
    claim = store.claim("dead-worker", "h", lease_seconds=1)
    assert isinstance(claim, Claimed)
    clock.advance(2)
    append_events = store.append_events
    failing = [True]

    def append_once_lost(conn: Any, events: Any) -> None:
        if failing:
            failing.clear()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("INSERT", None, lost, connection_invalidated=True)
        append_events(conn, events)

    monkeypatch.setattr(store, "append_events", append_once_lost)
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        with pytest.raises(sa.exc.DBAPIError):
            gate.recover()
        assert gate.recover() == ["dead-worker"]
    [event] = store.events(kind="needs_reconciliation")
    assert json.loads(event.detail_json)["key"] == "dead-worker"
    record = store.get("dead-worker")
    assert record is not None
    assert record.status == "needs_reconciliation"


def test_recover_racing_a_renewal_leaves_one_of_them_in_charge(store: SQLStore, clock: FakeClock) -> None:
    claim = store.claim("k", "h", lease_seconds=1)
    assert isinstance(claim, Claimed)
    clock.advance(1)  # the lease ends now: the renewal and the expiry race for the record
    start = threading.Barrier(2)
    won: dict[str, bool] = {}

    def renew() -> None:
        start.wait(5)
        won["renew"] = store.renew_lease("k", claim.owner, lease_seconds=1)

    def expire() -> None:
        start.wait(5)
        won["expire"] = store.expire_lease("k", now=clock.now(), reason="lapsed")

    threads = [threading.Thread(target=f) for f in (renew, expire)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(won.values()) == [False, True]
    record = store.get("k")
    assert record is not None
    assert record.status == ("in_progress" if won["renew"] else "needs_reconciliation")


def test_a_reconcile_whose_claim_landed_with_its_reply_lost_runs_once(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reconcile` found nothing at the provider and committed the release and its new claim in
    one transaction whose reply was lost: the run again never started, and reconciling again was
    refused (`not_reconcilable`: the record is in flight) until its lease ran out."""
    receiver = EffectRecorder()
    applied: dict[str, dict[str, int]] = {}
    drop = [True]

    def pay(account: str, amount: int, tool_context: ToolContext) -> dict[str, int]:
        if drop:
            drop.clear()
            raise TimeoutError("connection reset before the request was sent")
        receiver.record("pay", account=account)
        return applied.setdefault(tool_context.idempotency_key, {"paid": amount})

    def lookup(key: str) -> Reconciled:
        return Reconciled(found=key in applied, result=applied.get(key))

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        subject=("account",),
        reconcile=lookup,
    )
    table = EffectTable([spec])
    table.allow("support", ["pay"])
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        pending = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)
        armed = [True]
        driver_end = _dialect.driver_end

        def commit_then_lose(conn: Any, driver: Any, *, commit: bool) -> None:
            driver_end(conn, driver, commit=commit)
            if armed and commit:
                armed.clear()
                lost = ConnectionError("server closed the connection unexpectedly")
                raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

        monkeypatch.setattr(_dialect, "driver_end", commit_then_lose)
        try:
            outcome = gate.reconcile(pending.approval_id)
        except sa.exc.DBAPIError:
            outcome = gate.reconcile(pending.approval_id)  # the caller retries
        assert isinstance(outcome, Executed), outcome
    assert receiver.count("pay") == 1
    [record] = store.idempotency_records()
    assert record.status == "succeeded"


def test_a_writes_definite_failure_whose_commit_was_lost_is_stored_once_more(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failed definitely (nothing happened) and the connection went while its failure was
    stored, the COMMIT not landed: the record stayed in flight, the same call again was refused
    `in_progress` until the lease ran out, then a person was asked about a call known to have
    failed. Now the failure is stored once more on a fresh connection (as a result is) and the
    tool's error is raised as before; the next call runs it."""
    receiver = EffectRecorder()
    fail = [True]

    def note(text: str) -> dict[str, str]:
        if fail:
            fail.clear()
            armed.append(True)  # the failure's COMMIT is lost
            raise ValueError("the notebook is full")
        receiver.record("note", text=text)
        return {"noted": text}

    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note)])
    table.allow("support", ["note"])
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def lose(conn: Any, driver: Any, *, commit: bool) -> None:
        if armed and commit:
            armed.clear()
            driver_end(conn, driver, commit=False)
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)
        driver_end(conn, driver, commit=commit)

    monkeypatch.setattr(_dialect, "driver_end", lose)
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        with pytest.raises(ValueError, match="notebook is full"):
            gate.call("note", {"text": "hi"}, context("m1"))
        outcome = gate.call("note", {"text": "hi"}, context("m1"))
        assert isinstance(outcome, Executed), outcome
    assert receiver.count("note") == 1
    [record] = store.idempotency_records()
    assert (record.status, record.attempts) == ("succeeded", 2)
    assert sorted(e.status for e in store.executions()) == ["failed", "succeeded"]
