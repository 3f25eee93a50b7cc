"""Round 27, stores: many workers and processes on one ledger at schema 5 (`eg_idempotency.user_id`,
`_upgrade._4_to_5`). Real processes (fork) and threads on SQLite files and PostgreSQL.

Reproduced first:
- PostgreSQL: `setup` upgrading a version 4 database while a worker of version 4 runs (a
  transaction that wrote an audit table, then touches eg_idempotency) deadlocked with it: the
  upgrade held eg_idempotency (ALTER TABLE) and then replaced the append-only triggers, which
  waits for the worker's lock on eg_events. PostgreSQL aborted the setup. The triggers were the
  same: now a table whose trigger is this release's (same personal columns) is left alone
  (`_dialect.append_only_ddl`), and the upgrade no longer locks the audit tables.
- A call whose record schema 4 wrote (no user) that `reconcile` found not to have happened ran
  again with its record still naming no user (the gate's own retry names it). Now `reconcile`'s
  claim passes the approval's user.

Probes that hold (kept): two processes upgrading one version 4 database at once (one upgrade,
no row lost); two workers recovering one expired lease at once, and a write's replay racing
`recover` (announced once); a worker of version 4 inserting a claim into a version 5 database
mid-run; a claim whose COMMIT reply was lost (runs once, names its user); a forked child on its
parent's store; a stalled worker renewing before another's `recover`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Executed, Keyring, Reconciled
from effectgate.errors import NeedsReconciliation
from effectgate.stores import SQLStore, open_store
from effectgate.stores.records import SCHEMA_VERSION
from effectgate.testing import FakeClock

from ..core.test_round7_erasure import Notes, _ctx, _Died
from .test_round16_lost_connection import LostReply, _outcome
from .test_round24_stores import Provider, grant_of

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _as_version_4(store: SQLStore) -> None:
    with store.transaction() as conn:  # what schema 4 left: no user_id column
        conn.exec_driver_sql("ALTER TABLE eg_idempotency DROP COLUMN user_id")
        conn.exec_driver_sql("UPDATE eg_schema_version SET version = 4")


def _boot(url: str, barrier: multiprocessing.synchronize.Barrier) -> None:  # pragma: no cover - a child
    store = open_store(url)
    barrier.wait(timeout=60)
    store.setup()
    store.check()
    store.close()


def _columns(store: SQLStore) -> list[str]:
    with store.reading() as conn:
        return [c["name"] for c in sa.inspect(conn).get_columns("eg_idempotency")]


def test_two_processes_upgrading_a_version_4_database_at_once_upgrade_it_once(
    store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    for i in range(3):
        store.claim(f"pay-{i}", "h" * 64, user_id=f"u{i}")
    store.complete("pay-0", store.get("pay-0").lease_owner or "", {"ok": 1})  # type: ignore[union-attr]
    before = [(r.key, r.status, r.result) for r in store.idempotency_records()]
    _as_version_4(store)
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(2)
    workers = [fork.Process(target=_boot, args=(store_url, barrier)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0]
    after = open_store(store_url, clock=clock)
    try:
        after.check()
        with after.reading() as conn:
            assert conn.exec_driver_sql("SELECT id, version FROM eg_schema_version").fetchall() == [
                (1, SCHEMA_VERSION)
            ]
        assert _columns(after).count("user_id") == 1
        assert [(r.key, r.status, r.result) for r in after.idempotency_records()] == before
        assert [r.user_id for r in after.idempotency_records()] == [None, None, None]  # written by 4
    finally:
        after.close()


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        sql = (
            "SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'relation' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
        )
        return conn.exec_driver_sql(sql).first() is not None


@pytest.mark.postgres
def test_setup_upgrading_while_a_version_4_worker_runs_does_not_deadlock_with_it(
    pg_url: str, clock: FakeClock
) -> None:
    store = open_store(pg_url, clock=clock)
    store.setup()
    _as_version_4(store)
    worker_engine = sa.create_engine(pg_url)
    wrote_events, setup_waits = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def worker() -> None:  # a version 4 worker's transaction: an audit row, then its claim
        try:
            with worker_engine.begin() as conn:
                conn.exec_driver_sql("LOCK TABLE eg_events IN ROW EXCLUSIVE MODE")  # as its INSERT
                wrote_events.set()
                setup_waits.wait(10)
                conn.exec_driver_sql(
                    "INSERT INTO eg_idempotency (key, payload_hash, status, lease_owner, "
                    "lease_expires_at, attempts, created_at, updated_at) "
                    "VALUES ('w:old', 'h', 'in_progress', 'o', 100.0, 1, 1.0, 1.0)"
                )
            outcome["worker"] = "committed"
        except Exception as exc:
            outcome["worker"] = exc

    def upgrade() -> None:
        try:
            open_store(pg_url, clock=clock).setup()
            outcome["setup"] = "done"
        except Exception as exc:
            outcome["setup"] = exc

    threads = [threading.Thread(target=worker), threading.Thread(target=upgrade)]
    threads[0].start()
    assert wrote_events.wait(10)
    threads[1].start()
    for _ in range(2000):  # the setup waits on a lock the worker holds, or finished
        if _waiting_on_a_lock(worker_engine) or not threads[1].is_alive():
            break
    setup_waits.set()
    for t in threads:
        t.join(30)
    worker_engine.dispose()
    assert outcome == {"worker": "committed", "setup": "done"}, outcome
    store._ready = False
    store.check()
    record = store.get("w:old")
    assert record is not None
    assert (record.status, record.user_id) == ("in_progress", None)
    store.close()


def test_a_version_4_workers_claim_in_a_version_5_database_is_read_and_settled(
    store: SQLStore,
) -> None:
    """A worker of version 4 that keeps running after the upgrade inserts its claims without the
    user: the record is read (user None), and a retry of its call by version 5 names the user."""
    with store.transaction() as conn:
        conn.exec_driver_sql(
            "INSERT INTO eg_idempotency (key, payload_hash, status, lease_owner, "
            "lease_expires_at, attempts, created_at, updated_at, error) "
            "VALUES ('w:old', 'h', 'failed', 'o', NULL, 1, 1.0, 1.0, 'boom')"
        )
    record = store.get("w:old")
    assert record is not None
    assert (record.status, record.user_id) == ("failed", None)
    claimed = store.claim("w:old", "h", user_id="u1")
    after = store.get("w:old")
    assert after is not None
    assert (after.user_id, after.attempts, after.lease_owner) == ("u1", 2, claimed.owner)  # type: ignore[union-attr]


def _died_write(store: SQLStore, clock: FakeClock, notes: Notes, keyring: Keyring) -> str:
    """A write of u1 whose worker died mid-run: its record in flight, its lease to run out."""

    def die() -> None:
        raise _Died

    gate = EffectGate(notes.table(), store, keyring=keyring, clock=clock)
    notes.during = die
    with pytest.raises(_Died):
        gate.call("post", {"ticket_id": "t-1", "text": "x"}, _ctx("m1"))
    notes.during = None
    gate.close()
    [record] = store.idempotency_records(status="in_progress")
    assert record.user_id == "u1"
    return record.key


def test_two_workers_recovering_one_expired_lease_at_once_announce_it_once(
    store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    notes, keyring = Notes(), Keyring.generate()
    key = _died_write(store, clock, notes, keyring)
    clock.advance(60 * 60)
    listed = threading.Barrier(2)  # both read the record in flight before either expires it
    notices: list[object] = []
    touched: dict[int, list[str]] = {}
    stores = [open_store(store_url, clock=clock) for _ in range(2)]
    lookups = 0

    def lookup(key: str) -> Reconciled | None:
        nonlocal lookups
        lookups += 1
        return Notes.lookup(notes, key)

    notes.lookup = lookup  # type: ignore[method-assign]
    gates = [
        EffectGate(notes.table(), s, keyring=keyring, clock=clock, on_needs_reconciliation=notices.append)
        for s in stores
    ]
    for s in stores:
        listing = s.idempotency_records

        def after_listing(*a: Any, _listing: Any = listing, **kw: Any) -> Any:
            found = _listing(*a, **kw)
            listed.wait(10)
            return found

        s.idempotency_records = after_listing  # type: ignore[method-assign]

    def recover(i: int) -> None:
        touched[i] = gates[i].recover()

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for g in gates:
        g.close()
    for s in stores:
        s.close()
    assert sorted(touched.values()) == [[], [key]]
    assert len(notices) == 1
    assert lookups == 1
    assert len(store.events(kind="needs_reconciliation")) == 1
    record = store.get(key)
    assert record is not None
    assert (record.status, record.user_id, record.attempts) == ("succeeded", "u1", 1)
    assert notes.calls == 1  # never run again


def test_a_rerun_by_reconcile_of_a_record_version_4_wrote_names_its_user(
    store: SQLStore, clock: FakeClock
) -> None:
    """A call whose record schema 4 wrote (no user), found not to have happened, runs again by
    `reconcile`: while that run is in flight its record names the approval's user (as a retry
    by the gate does), so a redaction of that user finds the call in flight."""
    provider = Provider()
    gate = EffectGate(provider.table(), store, keyring=Keyring.generate(), clock=clock)
    grant = grant_of(gate)
    key = f"eg_{grant.approval_id}_v1"
    provider.reach, provider.lose = [False], 1  # never reached the provider, its reply lost
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    with store.transaction() as conn:  # as schema 4 wrote it, before the upgrade
        conn.exec_driver_sql("UPDATE eg_idempotency SET user_id = NULL")
    seen: list[object] = []
    provider.during.append(lambda: seen.append(store.get(key).user_id))  # type: ignore[union-attr]
    assert isinstance(gate.reconcile(grant.approval_id), Executed)
    gate.close()
    [row] = store.approvals()
    assert seen == [row.user_id]
    assert provider.receiver.count("pay") == 1
    record = store.get(key)
    assert record is not None
    assert (record.status, record.user_id, record.attempts) == ("succeeded", row.user_id, 2)


def test_a_writes_claim_whose_commit_landed_with_its_reply_lost_runs_once_naming_its_user(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = Notes()
    gate = EffectGate(notes.table(), store, keyring=Keyring.generate(), clock=clock)
    lost = LostReply(monkeypatch)
    lost.armed = True  # the claim's transaction is the call's first commit
    outcome = _outcome(lambda: gate.call("post", {"ticket_id": "t-1", "text": "x"}, _ctx("m1")))
    if not isinstance(outcome, Executed):
        assert isinstance(outcome, sa.exc.DBAPIError)
        assert store.lost_connection(outcome)
        outcome = gate.call("post", {"ticket_id": "t-1", "text": "x"}, _ctx("m1"))
    assert isinstance(outcome, Executed)
    gate.close()
    assert notes.calls == 1
    [record] = store.idempotency_records()
    assert (record.status, record.user_id, record.attempts) == ("succeeded", "u1", 1)


def _child_claims(store: SQLStore, done: Any) -> None:  # pragma: no cover - a forked child
    try:
        claimed = store.claim("child", "h", user_id="u2")
        store.complete("child", claimed.owner, {"by": "child"})  # type: ignore[union-attr]
        store.close()  # forgets the parent's connections, closes none of them
        done.put("ok")
    except BaseException as exc:
        done.put(repr(exc))


def test_a_forked_child_claiming_on_its_parents_store_leaves_the_parents_session_alone(
    store: SQLStore,
) -> None:
    parent = store.claim("parent", "h", user_id="u1")  # the parent's connection kept checked out
    fork = multiprocessing.get_context("fork")
    done = fork.Queue()
    child = fork.Process(target=_child_claims, args=(store, done))
    child.start()
    assert done.get(timeout=60) == "ok"
    child.join(timeout=60)
    assert child.exitcode == 0
    store.complete("parent", parent.owner, {"by": "parent"})  # type: ignore[union-attr]
    records = {r.key: (r.status, r.user_id, r.result) for r in store.idempotency_records()}
    assert records == {
        "parent": ("succeeded", "u1", {"by": "parent"}),
        "child": ("succeeded", "u2", {"by": "child"}),
    }


def test_a_stalled_worker_that_renews_before_another_recovers_keeps_its_run(
    store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    """A worker stalled past its lease (a process paused) renews it before another worker's
    `recover` reads it: nothing is recovered, the run completes once, naming its user."""
    notes, keyring = Notes(), Keyring.generate()
    other_store = open_store(store_url, clock=clock)
    other = EffectGate(notes.table(), other_store, keyring=keyring, clock=clock)
    gate = EffectGate(notes.table(), store, keyring=keyring, clock=clock)
    recovered: list[list[str]] = []

    def stall() -> None:
        keeper = gate._settlement.leases
        clock.advance(keeper.lease_seconds * 2)  # the process was paused: no beat ran
        assert keeper.beat() == []  # its first beat after the pause renews it
        recovered.append(other.recover())

    notes.during = stall
    assert isinstance(gate.call("post", {"ticket_id": "t-1", "text": "x"}, _ctx("m1")), Executed)
    gate.close()
    other.close()
    other_store.close()
    assert recovered == [[]]
    assert notes.calls == 1
    assert store.events(kind="needs_reconciliation") == []
    [record] = store.idempotency_records()
    assert (record.status, record.user_id, record.attempts) == ("succeeded", "u1", 1)


def test_a_writes_replay_racing_recover_on_its_dead_workers_lease_announces_it_once(
    store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    """`recover` in one worker has read the dead write in flight when its replay, in another,
    finds the lease run out and turns it needs_reconciliation: announced once (event, notice)."""
    notes, keyring = Notes(), Keyring.generate()
    key = _died_write(store, clock, notes, keyring)
    clock.advance(60 * 60)
    notices: list[object] = []
    replayed: list[object] = []
    recover_store = open_store(store_url, clock=clock)
    recovering = EffectGate(
        notes.table(), recover_store, keyring=keyring, clock=clock, on_needs_reconciliation=notices.append
    )
    replaying = EffectGate(
        notes.table(), store, keyring=keyring, clock=clock, on_needs_reconciliation=notices.append
    )
    listing = recover_store.idempotency_records

    def after_listing(*a: Any, **kw: Any) -> Any:
        found = listing(*a, **kw)
        replayed.append(replaying.call("post", {"ticket_id": "t-1", "text": "x"}, _ctx("m1")))
        return found

    recover_store.idempotency_records = after_listing  # type: ignore[method-assign]
    touched = recovering.recover()
    recovering.close()
    replaying.close()
    recover_store.close()
    assert touched == []
    assert len(replayed) == 1
    assert len(notices) == 1
    assert len(store.events(kind="needs_reconciliation")) == 1
    record = store.get(key)
    assert record is not None
    assert (record.status, record.user_id) == ("needs_reconciliation", "u1")
    assert notes.calls == 1
