"""The store contracts: every backend subclasses these, never copies them.

A backend's test module is a few lines per contract: a subclass that provides the `make_store`
fixture, a zero-argument callable. Its first call returns an empty, set-up `SQLStore` bound to the
test's `clock`; later calls open more stores on the same database (another process, in effect).
`store_factory` below builds one from a URL. A backend may opt out of a test only with
`pytest.mark.xfail(reason=...)` on an override.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import SQLModel

from effectgate import open_store
from effectgate.errors import (
    IdempotencyConflict,
    InProgress,
    LeaseLost,
    NeedsReconciliation,
    OutcomeUnknown,
    StoreError,
)
from effectgate.stores import Claimed, SQLStore, Stored
from effectgate.stores.records import APPEND_ONLY, SCHEMA_VERSION, ApprovalRow, HoldRow
from effectgate.testing import FakeClock

StoreFactory = Callable[[], SQLStore]

HASH = "sha256:payload-a"
OTHER_HASH = "sha256:payload-b"


@contextmanager
def store_factory(url: str, clock: FakeClock) -> Iterator[StoreFactory]:
    """A `make_store` for `url`: each call opens and sets up a store bound to `clock`; all close."""
    opened: list[SQLStore] = []

    def make() -> SQLStore:
        store = open_store(url, clock=clock)
        opened.append(store)
        store.setup()
        return store

    try:
        yield make
    finally:
        for store in opened:
            store.close()


def _count(store: SQLStore, table: str) -> int:
    with store.reading() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def _assert_empty(store: SQLStore) -> None:
    assert store.idempotency_records() == []
    assert store.approvals() == []
    assert store.events() == []
    assert store.executions() == []
    assert store.all_decisions() == []
    assert _count(store, "eg_intent_keys") == 0
    assert store.rules() == {}


def _fill(store: SQLStore) -> None:
    """One row in every table, so a database shared between tests is caught by the next one."""
    claim = store.claim("sentinel", HASH)
    assert isinstance(claim, Claimed)
    store.complete("sentinel", claim.owner, {"ok": True})
    with store.transaction() as conn:
        store.insert_approval(conn, approval_row("sentinel", created_at=store.clock.now()))
        assert store.add_key(conn, "sentinel", "sentinel", 1, "m-sentinel")
        store.add_decision(
            conn, approval_id="sentinel", version=1, approver_id="u", role="r", decision="approve"
        )
        store.append_events(conn, [{"at": store.clock.now(), "kind": "sentinel"}])
        _append_execution(store, conn)
        store.add_rules(conn, [("sentinel", "row", "{}")])
        now = store.clock.now()
        sentinel = {"redaction_id": "r-s", "table_name": "eg_events", "row_key": "1", "column_name": "x"}
        store.append_redacted(conn, [{**sentinel, "commitment": "k.c", "at": now, "seal": "s"}])
        store.append_checkpoint(
            conn,
            {
                "table_name": "eg_events",
                "first_id": 1,
                "last_id": 1,
                "count": 1,
                "start": "0",
                "head": "h",
                "key_id": "k",
                "at": now,
                "signature": "s",
            },
        )
        store.add_hold(conn, HoldRow(id="h-s", user_id="u", reason="r", placed_by="b", at=now))


def _append_execution(
    store: SQLStore, conn: sa.Connection, *, approval_id: str | None = None, status: str = "succeeded"
) -> None:
    store.append_execution(
        conn,
        approval_id=approval_id,
        tool="refund",
        effect="money",
        args_hash="sha256:args",
        args_json="{}",
        idempotency_key="sentinel",
        status=status,
        session_id="s1",
        origin_message_id="m1",
        user_id="u1",
        agent_id="a1",
        table_fingerprint="table-fp",
        row_fingerprint="row-fp",
    )


def approval_row(
    approval_id: str,
    *,
    created_at: float,
    session_id: str = "s1",
    tool: str = "refund",
    subject_key: str = "order:1042",
    status: str = "pending",
    version: int = 1,
    expires_at: float | None = None,
    token_expires_at: float | None = None,
    token_used_at: float | None = None,
) -> ApprovalRow:
    """An approval as the gate would insert it, with only what a test varies exposed."""
    return ApprovalRow(
        id=approval_id,
        session_id=session_id,
        origin_message_id=f"m-{approval_id}",
        user_id="u1",
        agent_id="a1",
        tool=tool,
        effect="money",
        reversibility="compensable",
        subject_key=subject_key,
        subject_json='{"order_id": "1042"}',
        args_json='{"amount_cents": 500}',
        args_hash="sha256:args",
        approver_role="support_lead",
        approvals_required=1,
        status=status,
        version=version,
        created_at=created_at,
        updated_at=created_at,
        expires_at=created_at + 3600 if expires_at is None else expires_at,
        row_fingerprint="row-fp",
        table_fingerprint="table-fp",
        token_expires_at=token_expires_at,
        token_used_at=token_used_at,
    )


class _StoreContract:
    @pytest.fixture
    def store(self, make_store: StoreFactory) -> SQLStore:
        return make_store()

    @pytest.mark.parametrize("round_", [1, 2])
    def test_store_starts_empty(self, store: SQLStore, round_: int) -> None:
        """A new store holds no records, approvals or events, whatever ran before it."""
        _assert_empty(store)
        _fill(store)


class Receipt(BaseModel):
    refund_id: str
    amount_cents: int
    tags: list[str]


@dataclass
class Shipment:
    carrier: str
    parcels: int


def _claim(store: SQLStore, key: str, **kwargs: Any) -> Claimed:
    outcome = store.claim(key, HASH, **kwargs)
    assert isinstance(outcome, Claimed)
    return outcome


class IdempotencyStoreContract(_StoreContract):
    """`IdempotencyStore` semantics (stores/base.py), checked against the final record state."""

    def test_claim_new_key(self, store: SQLStore, clock: FakeClock) -> None:
        """A new key is claimed on the first attempt and recorded in flight under the lease owner."""
        claim = store.claim("k", HASH, owner="w1", lease_seconds=30)
        assert claim == Claimed("k", "w1", 1)
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_owner, record.attempts) == ("in_progress", "w1", 1)
        assert record.lease_expires_at == clock.now() + 30

    def test_completed_key_is_replayed(self, store: SQLStore) -> None:
        """A completed record is replayed, not re-executed."""
        calls: list[int] = []

        def charge() -> dict[str, Any]:
            calls.append(1)
            return {"charge_id": "ch_1"}

        assert store.run("k", HASH, charge) == {"charge_id": "ch_1"}
        assert store.run("k", HASH, charge) == {"charge_id": "ch_1"}
        again = store.claim("k", HASH)
        assert isinstance(again, Stored)
        assert again.result == {"charge_id": "ch_1"}
        assert len(calls) == 1
        record = store.get("k")
        assert record is not None
        assert (record.status, record.attempts) == ("succeeded", 1)

    def test_different_payload_conflicts(self, store: SQLStore) -> None:
        """A key reused with a different payload is refused, in flight or done, and nothing changes."""
        claim = _claim(store, "k")
        with pytest.raises(IdempotencyConflict):
            store.claim("k", OTHER_HASH)
        store.complete("k", claim.owner, 1)
        with pytest.raises(IdempotencyConflict):
            store.claim("k", OTHER_HASH)
        record = store.get("k")
        assert record is not None
        assert (record.payload_hash, record.status, record.result) == (HASH, "succeeded", 1)

    def test_live_lease_is_in_progress(self, store: SQLStore, clock: FakeClock) -> None:
        """While the lease is live a second claim is refused and the holder keeps the lease."""
        _claim(store, "k", owner="w1", lease_seconds=30)
        clock.advance(29)
        with pytest.raises(InProgress):
            store.claim("k", HASH, owner="w2", on_expired_lease="reclaim")
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_owner, record.attempts) == ("in_progress", "w1", 1)

    def test_expired_lease_needs_reconciliation(self, store: SQLStore, clock: FakeClock) -> None:
        """A lease that expired in flight means an unknown outcome: parked, never re-run by default."""
        _claim(store, "k", owner="w1", lease_seconds=30)
        clock.advance(31)
        with pytest.raises(NeedsReconciliation):
            store.claim("k", HASH, owner="w2")
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_owner, record.attempts) == ("needs_reconciliation", "w1", 1)
        with pytest.raises(NeedsReconciliation):
            store.claim("k", HASH, owner="w3", on_expired_lease="reclaim")

    def test_expired_lease_reclaim(self, store: SQLStore, clock: FakeClock) -> None:
        """With on_expired_lease="reclaim" a new worker takes over and the old one is fenced out."""
        _claim(store, "k", owner="w1", lease_seconds=30)
        clock.advance(31)
        assert store.claim("k", HASH, owner="w2", on_expired_lease="reclaim") == Claimed("k", "w2", 2)
        with pytest.raises(LeaseLost):
            store.complete("k", "w1", "stale")
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_owner, record.attempts, record.result) == (
            "in_progress",
            "w2",
            2,
            None,
        )
        store.complete("k", "w2", "fresh")
        assert store.run("k", HASH, lambda: pytest.fail("must not run")) == "fresh"

    def test_wrong_owner_is_fenced(self, store: SQLStore) -> None:
        """Only the lease owner may complete, fail, park or annotate a record; others change nothing."""
        _claim(store, "k", owner="w1")
        before = store.get("k")
        with pytest.raises(LeaseLost):
            store.complete("k", "intruder", {"stolen": True})
        with pytest.raises(LeaseLost):
            store.fail("k", "intruder", "boom")
        with pytest.raises(LeaseLost):
            store.mark_needs_reconciliation("k", "intruder", "timeout")
        with pytest.raises(LeaseLost):
            store.set_provider_ref("k", "intruder", "ref-x")
        assert store.get("k") == before

    def test_fail_then_retry_same_key(self, store: SQLStore) -> None:
        """A definite failure leaves the record failed, and the same key may be claimed again."""
        claim = _claim(store, "k", owner="w1")
        store.fail("k", claim.owner, "card declined")
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_expires_at) == ("failed", None)
        assert store.claim("k", HASH, owner="w2") == Claimed("k", "w2", 2)
        record = store.get("k")
        assert record is not None
        assert (record.status, record.lease_owner, record.error) == ("in_progress", "w2", None)

    def test_run_outcome_unknown_needs_reconciliation(self, store: SQLStore) -> None:
        """An unknown outcome is parked as needs_reconciliation, never failed, and never re-run."""
        calls: list[int] = []

        def timeout() -> None:
            calls.append(1)
            raise OutcomeUnknown("read timeout", provider_ref="pay_77")

        with pytest.raises(NeedsReconciliation) as info:
            store.run("k", HASH, timeout)
        assert info.value.provider_ref == "pay_77"
        with pytest.raises(NeedsReconciliation):
            store.run("k", HASH, timeout)
        assert len(calls) == 1
        record = store.get("k")
        assert record is not None
        assert (record.status, record.provider_ref, record.attempts) == ("needs_reconciliation", "pay_77", 1)

    def test_run_exception_fails_and_keeps_record(self, store: SQLStore) -> None:
        """A plain exception leaves the record failed, never deleted; a retry is attempt 2."""

        def boom() -> None:
            raise ValueError("declined")

        with pytest.raises(ValueError, match="declined"):
            store.run("k", HASH, boom)
        record = store.get("k")
        assert record is not None
        assert (record.status, record.attempts) == ("failed", 1)
        assert store.run("k", HASH, lambda: "ok") == "ok"
        record = store.get("k")
        assert record is not None
        assert (record.status, record.attempts, record.result) == ("succeeded", 2, "ok")

    def test_resolve(self, store: SQLStore) -> None:
        """Reconciliation that finds the effect happened stores its result; it is then replayed."""
        claim = _claim(store, "k")
        store.mark_needs_reconciliation("k", claim.owner, "lost reply")
        resolved = store.resolve("k", {"refund_id": "re_9"}, provider_ref="re_9")
        assert (resolved.status, resolved.result, resolved.provider_ref) == (
            "succeeded",
            {"refund_id": "re_9"},
            "re_9",
        )
        assert store.get("k") == resolved
        replay = store.claim("k", HASH)
        assert isinstance(replay, Stored)
        assert replay.result == {"refund_id": "re_9"}
        with pytest.raises(StoreError):
            store.resolve("k", "again")
        assert store.get("k") == resolved

    def test_release_makes_key_claimable(self, store: SQLStore) -> None:
        """Reconciliation that finds nothing happened releases the key to run again, same key."""
        claim = _claim(store, "k")
        with pytest.raises(StoreError):
            store.release("k", "not parked yet")
        store.mark_needs_reconciliation("k", claim.owner, "lost reply")
        store.release("k", "provider never saw the key")
        record = store.get("k")
        assert record is not None
        assert record.status == "failed"
        assert store.claim("k", HASH, owner="w2") == Claimed("k", "w2", 2)

    def test_set_provider_ref_persists(self, store: SQLStore, make_store: StoreFactory) -> None:
        """A provider reference saved in flight survives, through completion, in another store handle."""
        claim = _claim(store, "k")
        store.set_provider_ref("k", claim.owner, "proc_202")
        record = make_store().get("k")
        assert record is not None
        assert (record.status, record.provider_ref) == ("in_progress", "proc_202")
        store.complete("k", claim.owner, "done")
        record = make_store().get("k")
        assert record is not None
        assert (record.status, record.provider_ref) == ("succeeded", "proc_202")

    @pytest.mark.parametrize(
        ("result", "expected"),
        [
            ({"id": "ch_1", "amount": {"cents": 500}}, {"id": "ch_1", "amount": {"cents": 500}}),
            (["a", 1, 2.5, None, True, {"x": []}], ["a", 1, 2.5, None, True, {"x": []}]),
            (
                Receipt(refund_id="re_1", amount_cents=500, tags=["vip"]),
                {"refund_id": "re_1", "amount_cents": 500, "tags": ["vip"]},
            ),
            (Shipment(carrier="dhl", parcels=2), {"carrier": "dhl", "parcels": 2}),
            ("plain text", "plain text"),
            (None, None),
        ],
        ids=["dict", "list", "pydantic", "dataclass", "str", "none"],
    )
    def test_result_round_trips_as_json(
        self, store: SQLStore, make_store: StoreFactory, result: Any, expected: Any
    ) -> None:
        """A result is stored as JSON and read back as plain JSON values, models as dicts."""
        claim = _claim(store, "k")
        assert store.complete("k", claim.owner, result).result == expected
        record = make_store().get("k")
        assert record is not None
        assert record.result == expected
        replay = make_store().claim("k", HASH)
        assert isinstance(replay, Stored)
        assert replay.result == expected

    def test_original_owner_completes_after_reconciliation(self, store: SQLStore, clock: FakeClock) -> None:
        """A slow worker whose expired lease was parked may still store its result; nothing is lost."""
        _claim(store, "k", owner="slow", lease_seconds=10)
        clock.advance(11)
        with pytest.raises(NeedsReconciliation):
            store.claim("k", HASH, owner="w2")
        done = store.complete("k", "slow", {"refund_id": "re_5"}, provider_ref="re_5")
        assert (done.status, done.result, done.provider_ref, done.attempts) == (
            "succeeded",
            {"refund_id": "re_5"},
            "re_5",
            1,
        )
        replay = store.claim("k", HASH, owner="w3")
        assert isinstance(replay, Stored)
        assert replay.result == {"refund_id": "re_5"}

    def test_racing_claims_have_one_winner(self, make_store: StoreFactory) -> None:
        """Sixteen workers racing on one key: one runs, the others wait or replay, none is left in flight."""
        outcomes = _race(make_store, "race", complete=True)
        winners = [o for o in outcomes if isinstance(o, Claimed)]
        assert len(winners) == 1
        assert winners[0].attempt == 1
        others = [o for o in outcomes if o is not winners[0]]
        assert all(isinstance(o, InProgress | Stored) for o in others), others
        assert all(o.result == {"by": winners[0].owner} for o in others if isinstance(o, Stored))
        store = make_store()
        assert store.idempotency_records(status="in_progress") == []
        record = store.get("race")
        assert record is not None
        assert (record.status, record.attempts, record.lease_owner) == ("succeeded", 1, winners[0].owner)

    def test_racing_retries_have_one_winner(self, make_store: StoreFactory) -> None:
        """Sixteen workers retrying one failed key: exactly one claims attempt 2."""
        store = make_store()
        store.fail("retry", _claim(store, "retry").owner, "declined")
        outcomes = _race(make_store, "retry", complete=False)
        winners = [o for o in outcomes if isinstance(o, Claimed)]
        assert len(winners) == 1
        assert winners[0].attempt == 2
        assert all(isinstance(o, InProgress) for o in outcomes if o is not winners[0])
        record = store.get("retry")
        assert record is not None
        assert (record.status, record.attempts, record.lease_owner) == ("in_progress", 2, winners[0].owner)

    def test_racing_reclaims_have_one_winner(self, make_store: StoreFactory, clock: FakeClock) -> None:
        """Sixteen workers reclaiming one expired lease: exactly one takes it over."""
        store = make_store()
        _claim(store, "lease", owner="gone", lease_seconds=10)
        clock.advance(11)
        outcomes = _race(make_store, "lease", complete=False, on_expired_lease="reclaim")
        winners = [o for o in outcomes if isinstance(o, Claimed)]
        assert len(winners) == 1
        assert winners[0].attempt == 2
        assert all(isinstance(o, InProgress) for o in outcomes if o is not winners[0])
        record = store.get("lease")
        assert record is not None
        assert (record.status, record.attempts, record.lease_owner) == ("in_progress", 2, winners[0].owner)

    def test_parallel_distinct_keys(self, store: SQLStore) -> None:
        """Eight workers running fifty distinct keys each: all 400 succeed, each exactly once."""
        ran: list[str] = []
        lock = threading.Lock()

        def worker(w: int) -> None:
            for i in range(50):
                key = f"w{w}-k{i}"

                def effect(key: str = key) -> str:
                    with lock:
                        ran.append(key)
                    return key

                assert store.run(key, HASH, effect) == key

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(worker, range(8)))
        assert len(ran) == len(set(ran)) == 400
        records = store.idempotency_records()
        assert len(records) == 400
        assert {r.status for r in records} == {"succeeded"}
        assert sorted(r.result for r in records) == sorted(ran)


def _race(make_store: StoreFactory, key: str, *, complete: bool, **claim: Any) -> list[Any]:
    """Sixteen stores (own engines, as separate processes would have) claim `key` at once;
    the winner completes at once when `complete`. Returns each Claimed, Stored or InProgress."""
    stores = [make_store() for _ in range(16)]
    barrier = threading.Barrier(len(stores), timeout=60)

    def attempt(store: SQLStore) -> Any:
        barrier.wait()
        try:
            outcome = store.claim(key, HASH, **claim)
        except InProgress as exc:
            return exc
        if complete and isinstance(outcome, Claimed):
            store.complete(key, outcome.owner, {"by": outcome.owner})
        return outcome

    with ThreadPoolExecutor(len(stores)) as pool:
        return list(pool.map(attempt, stores))


def _advisory_lock_awaited(store: SQLStore) -> bool:
    """Whether a PostgreSQL session comes to wait for an advisory lock (polled, up to 30 s)."""
    deadline = threading.Event()
    for _ in range(3000):
        with store.reading() as conn:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).scalar_one()
        if waiting:
            return True
        deadline.wait(0.01)
    return False


class ApprovalStoreContract(_StoreContract):
    """The schema and the approval-ledger primitives of `SQLStore` that the gate composes."""

    def test_setup_is_idempotent(self, store: SQLStore, make_store: StoreFactory) -> None:
        """Setting up an existing store again, from the same or another handle, changes nothing."""
        _fill(store)
        store.setup()
        make_store().setup()
        assert _count(store, "eg_schema_version") == 1
        assert len(store.approvals()) == 1
        assert len(store.idempotency_records()) == 1

    def test_setup_races_on_fresh_database(self, store: SQLStore) -> None:
        """Workers booting together on a database without the tables all set it up, exactly once."""
        SQLModel.metadata.drop_all(
            store.engine, tables=[t for t in SQLModel.metadata.sorted_tables if t.name.startswith("eg_")]
        )
        booting = [open_store(store.url, clock=store.clock) for _ in range(8)]
        barrier = threading.Barrier(len(booting), timeout=60)

        def boot(worker: SQLStore) -> None:
            barrier.wait()
            worker.setup()

        try:
            with ThreadPoolExecutor(len(booting)) as pool:
                list(pool.map(boot, booting))
        finally:
            for worker in booting:
                worker.close()
        assert _count(store, "eg_schema_version") == 1
        _fill(store)
        with pytest.raises(sa.exc.DatabaseError), store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM eg_events"))
        assert len(store.events()) == 1

    def test_schema_version_row(self, store: SQLStore, clock: FakeClock) -> None:
        """Setup records this release's schema version once."""
        with store.reading() as conn:
            rows = conn.execute(sa.text("SELECT id, version, applied_at FROM eg_schema_version")).all()
        assert [tuple(r) for r in rows] == [(1, SCHEMA_VERSION, clock.now())]

    def test_schema_version_mismatch(self, store: SQLStore, make_store: StoreFactory) -> None:
        """A database of another schema version is refused at setup, by every handle."""
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE eg_schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
        with pytest.raises(StoreError):
            store.setup()
        with pytest.raises(StoreError):
            make_store()

    @pytest.mark.parametrize("table", APPEND_ONLY)
    @pytest.mark.parametrize(
        "statement", ["UPDATE {table} SET at = at + 1", "DELETE FROM {table}"], ids=["update", "delete"]
    )
    def test_audit_tables_are_append_only(self, store: SQLStore, table: str, statement: str) -> None:
        """The database itself refuses UPDATE and DELETE on the audit tables."""
        _fill(store)
        with store.reading() as conn:
            before = conn.execute(sa.text(f"SELECT * FROM {table}")).all()
        assert len(before) == 1
        with pytest.raises(sa.exc.DatabaseError), store.engine.begin() as conn:
            conn.execute(sa.text(statement.format(table=table)))
        with store.reading() as conn:
            assert conn.execute(sa.text(f"SELECT * FROM {table}")).all() == before

    def test_insert_and_find_by_key(self, store: SQLStore, clock: FakeClock) -> None:
        """An approval reads back field for field, by id and by each intent key; a key maps once."""
        row = approval_row("ap1", created_at=clock.now())
        with store.transaction() as conn:
            store.insert_approval(conn, row)
            store.insert_approval(conn, approval_row("ap2", created_at=clock.now()))
            assert store.add_key(conn, "intent-1", "ap1", 1, "m1")
            assert store.add_key(conn, "intent-2", "ap1", 2, "m2")
            assert not store.add_key(conn, "intent-1", "ap2", 1, "m3")
        with store.reading() as conn:
            found = store.approval(conn, "ap1")
            assert found is not None
            assert found.model_dump() == row.model_dump()
            for key in ("intent-1", "intent-2"):
                by_key = store.approval_for_key(conn, key)
                assert by_key is not None
                assert by_key.id == "ap1"
            assert store.approval(conn, "missing") is None
            assert store.approval_for_key(conn, "missing") is None
        assert _count(store, "eg_intent_keys") == 2

    def test_locked_approval_waits_for_the_subject_lock(self, store: SQLStore, clock: FakeClock) -> None:
        """An approval read under its subject lock waits for the holder and sees what it committed."""
        row = approval_row("ap1", created_at=clock.now())
        with store.transaction() as conn:
            store.insert_approval(conn, row)
        with store.transaction() as conn:
            assert store.locked_approval(conn, "missing") is None
        seen: list[str] = []

        def reader() -> None:
            with store.transaction() as conn:
                found = store.locked_approval(conn, "ap1")
                seen.append("missing" if found is None else found.status)

        with store.transaction() as conn:
            store.lock(conn, f"subject:{row.subject_key}")
            store.update_approval(conn, "ap1", expect_status=["pending"], values={"status": "denied"})
            thread = threading.Thread(target=reader)
            thread.start()
            if store.engine.dialect.name == "postgresql":  # SQLite's reader waits at BEGIN IMMEDIATE
                assert _advisory_lock_awaited(store), "the read did not wait for the subject lock"
                assert not seen
        thread.join(timeout=30)
        assert seen == ["denied"]  # read after the holder committed, not before

    def test_failed_transaction_leaves_nothing(self, store: SQLStore, clock: FakeClock) -> None:
        """A transaction that raises is rolled back whole."""

        def propose_then_crash() -> None:
            with store.transaction() as conn:
                store.insert_approval(conn, approval_row("ap1", created_at=clock.now()))
                store.add_key(conn, "intent-1", "ap1", 1, "m1")
                raise RuntimeError("crash")

        with pytest.raises(RuntimeError):
            propose_then_crash()
        _assert_empty(store)

    def test_update_approval_is_compare_and_set(self, store: SQLStore, clock: FakeClock) -> None:
        """An update applies only at the expected status and version; a mismatch changes nothing."""
        with store.transaction() as conn:
            store.insert_approval(conn, approval_row("ap1", created_at=clock.now()))
        original = store.get_approval("ap1")
        assert original is not None
        change = {"status": "approved", "version": 2, "updated_at": clock.now() + 5}
        with store.transaction() as conn:
            assert not store.update_approval(conn, "ap1", expect_status=["approved"], values=change)
            assert not store.update_approval(
                conn, "ap1", expect_status=["pending"], expect_version=2, values=change
            )
            assert not store.update_approval(conn, "missing", expect_status=["pending"], values=change)
        assert store.get_approval("ap1") == original
        with store.transaction() as conn:
            assert store.update_approval(
                conn, "ap1", expect_status=["pending", "approved"], expect_version=1, values=change
            )
            assert not store.update_approval(
                conn, "ap1", expect_status=["pending"], expect_version=1, values={"status": "denied"}
            )
        updated = store.get_approval("ap1")
        assert updated is not None
        assert (updated.status, updated.version, updated.updated_at) == ("approved", 2, clock.now() + 5)

    def _insert(self, store: SQLStore, *rows: ApprovalRow) -> None:
        with store.transaction() as conn:
            for row in rows:
                store.insert_approval(conn, row)

    def test_pending_of_session(self, store: SQLStore, clock: FakeClock) -> None:
        """The session's pending approvals of any tool and subject, lapsed too, newest first."""
        t = clock.now()
        self._insert(
            store,
            approval_row("old", created_at=t),
            approval_row("new", created_at=t + 2),
            approval_row("decided", created_at=t + 3, status="approved"),
            approval_row("expired", created_at=t + 3, status="expired"),
            approval_row("other-session", created_at=t + 4, session_id="s2"),
            approval_row("other-tool", created_at=t + 5, tool="cancel"),
            approval_row("lapsed", created_at=t + 6, subject_key="order:7", expires_at=t - 1),
        )
        with store.reading() as conn:
            found = store.pending_of_session(conn, "s1")
            assert [r.id for r in found] == ["lapsed", "other-tool", "new", "old"]
            assert found[0] == store.approval(conn, "lapsed")
            assert [r.id for r in store.pending_of_session(conn, "s2")] == ["other-session"]
            assert store.pending_of_session(conn, "s3") == []

    def test_in_flight_elsewhere(self, store: SQLStore, clock: FakeClock) -> None:
        """The oldest approval on the subject from another session that is pending, or granted and
        still usable (grant unexpired, or presented and executing), of any tool."""
        t = clock.now()
        self._insert(
            store,
            approval_row("mine", created_at=t - 1, session_id="s1"),
            approval_row("done", created_at=t - 1, session_id="s2", status="executed"),
            approval_row("denied", created_at=t - 1, session_id="s2", status="denied"),
            approval_row(
                "grant", created_at=t + 1, session_id="s2", status="approved", token_expires_at=t + 5
            ),
            approval_row(
                "presented",
                created_at=t + 2,
                session_id="s3",
                tool="cancel",
                status="approved",
                token_expires_at=t + 5,
                token_used_at=t + 4,
            ),
            approval_row("pending", created_at=t + 3, session_id="s3"),
            approval_row("elsewhere", created_at=t - 1, session_id="s2", subject_key="order:7"),
        )
        with store.reading() as conn:

            def busy(session_id: str, subject_key: str = "order:1042") -> str | None:
                row = store.in_flight_elsewhere(conn, subject_key, session_id, clock.now())
                return None if row is None else row.id

            assert busy("s1") == "grant"
            assert busy("s2") == "mine"
            assert busy("s2", "order:7") is None
            assert busy("s1", "order:9") is None
            clock.advance(5)  # the unused grant expires at exactly this instant
            assert busy("s1") == "presented"
            assert busy("s3") == "mine"

    def test_approvals_due(self, store: SQLStore, clock: FakeClock) -> None:
        """Pending approvals whose deadline has passed (at the deadline too)."""
        t = clock.now()
        self._insert(
            store,
            approval_row("soon", created_at=t, expires_at=t + 10),
            approval_row("later", created_at=t, expires_at=t + 20),
            approval_row("decided", created_at=t, expires_at=t + 5, status="approved"),
            approval_row("s2-soon", created_at=t, expires_at=t + 10, session_id="s2"),
        )
        with store.reading() as conn:
            assert store.approvals_due(conn, clock.now()) == []
            clock.advance(10)
            due = store.approvals_due(conn, clock.now())
            assert sorted(r.id for r in due) == ["s2-soon", "soon"]
            clock.advance(10)
            due = store.approvals_due(conn, clock.now())
            assert sorted(r.id for r in due) == ["later", "s2-soon", "soon"]

    def test_approvals_expiring(self, store: SQLStore, clock: FakeClock) -> None:
        """Pending approvals still open whose deadline falls within the window, soonest first."""
        t = clock.now()
        self._insert(
            store,
            approval_row("later", created_at=t, expires_at=t + 20),
            approval_row("soon", created_at=t, expires_at=t + 10),
            approval_row("lapsed", created_at=t, expires_at=t),
            approval_row("decided", created_at=t, expires_at=t + 5, status="approved"),
            approval_row("far", created_at=t, expires_at=t + 100),
        )
        with store.reading() as conn:
            assert [r.id for r in store.approvals_expiring(conn, t, t + 20)] == ["soon", "later"]
            assert [r.id for r in store.approvals_expiring(conn, t, t + 19)] == ["soon"]
            assert store.approvals_expiring(conn, t + 20, t + 50) == []

    def test_has_event(self, store: SQLStore, clock: FakeClock) -> None:
        """An event is found by kind, approval and version, and by nothing less."""
        event = {"at": clock.now(), "kind": "expiry_warning", "approval_id": "a", "version": 2}
        with store.transaction() as conn:
            assert not store.has_event(conn, "expiry_warning", "a", 2)
            store.append_events(conn, [event])
        with store.reading() as conn:
            assert store.has_event(conn, "expiry_warning", "a", 2)
            assert not store.has_event(conn, "expiry_warning", "a", 1)
            assert not store.has_event(conn, "expiry_warning", "b", 2)
            assert not store.has_event(conn, "proposed", "a", 2)

    def test_subject_history(self, store: SQLStore, clock: FakeClock) -> None:
        """Every approval of this tool on this subject, any session or status, oldest first."""
        t = clock.now()
        self._insert(
            store,
            approval_row("third", created_at=t + 3, status="pending"),
            approval_row("first", created_at=t + 1, status="executed", session_id="s2"),
            approval_row("second", created_at=t + 2, status="denied"),
            approval_row("other-tool", created_at=t, tool="cancel"),
            approval_row("other-subject", created_at=t, subject_key="order:7"),
        )
        with store.reading() as conn:
            assert [r.id for r in store.subject_history(conn, "refund", "order:1042", None)] == [
                "first",
                "second",
                "third",
            ]
            assert [r.id for r in store.subject_history(conn, "refund", "order:1042", "third")] == [
                "first",
                "second",
            ]
            assert store.subject_history(conn, "refund", "order:9", None) == []

    def test_execution_outcomes(self, store: SQLStore) -> None:
        """Per listed approval: "succeeded" once any execution succeeded, else its latest
        execution's status, else "presented" when its grant was presented (a token_used event);
        an approval with none of these, or not listed, is absent."""
        with store.transaction() as conn:
            store.append_events(
                conn,
                [
                    {"at": 1.0, "kind": kind, "approval_id": approval_id, "version": 1}
                    for kind, approval_id in [
                        ("token_used", "presented"),
                        ("token_used", "ran"),
                        ("token_minted", "minted"),
                        ("token_used", "not-listed"),
                    ]
                ],
            )
            for approval_id, status in [
                ("ran", "succeeded"),
                ("unknown", "needs_reconciliation"),
                ("settled", "needs_reconciliation"),
                ("settled", "failed"),
                ("retried", "needs_reconciliation"),
                ("retried", "succeeded"),
                ("not-listed", "succeeded"),
            ]:
                _append_execution(store, conn, approval_id=approval_id, status=status)
        with store.reading() as conn:
            listed = ["ran", "unknown", "settled", "retried", "presented", "minted", "none"]
            assert store.execution_outcomes(conn, listed) == {
                "presented": "presented",
                "ran": "succeeded",
                "unknown": "needs_reconciliation",
                "settled": "failed",
                "retried": "succeeded",
            }
            assert store.execution_outcomes(conn, []) == {}

    def test_first_proposed(self, store: SQLStore, clock: FakeClock) -> None:
        """Each approval's first "proposed" event id orders the approvals by when they were first
        proposed; other kinds, other approvals and approvals with no proposal are left out."""

        def event(kind: str, approval_id: str | None, version: int = 1) -> dict[str, Any]:
            return {"at": clock.now(), "kind": kind, "approval_id": approval_id, "version": version}

        with store.transaction() as conn:
            store.append_events(conn, [event("proposed", "first"), event("read", None)])
        with store.transaction() as conn:
            store.append_events(
                conn,
                [
                    event("proposed", "second"),
                    event("amended", "first", 2),
                    event("proposed", "first", 3),  # a second "proposed" does not move it
                    event("rejected", "refused"),
                    event("proposed", "other"),
                ],
            )
        ids = {(e.kind, e.approval_id, e.version): e.id for e in store.events()}
        found = store.first_proposed(["second", "first", "refused", "unknown"])
        assert found == {"first": ids["proposed", "first", 1], "second": ids["proposed", "second", 1]}
        assert found["first"] < found["second"]
        assert store.first_proposed(("first", "first")) == {"first": found["first"]}
        assert store.first_proposed([]) == {}

    def test_events_of_one_session(self, store: SQLStore, clock: FakeClock) -> None:
        """`events` narrows by kind, approval and session together (what an adapter's lookup of
        its own thread's records reads), in order."""

        def event(kind: str, session: str, approval_id: str | None = None) -> dict[str, Any]:
            return {"at": clock.now(), "kind": kind, "session_id": session, "approval_id": approval_id}

        with store.transaction() as conn:
            store.append_events(
                conn,
                [
                    event("shown", "s1"),
                    event("shown", "s2"),
                    event("other", "s1"),
                    event("shown", "s1", "a1"),
                ],
            )
        assert [(e.kind, e.session_id) for e in store.events(kind="shown", session_id="s1")] == [
            ("shown", "s1"),
            ("shown", "s1"),
        ]
        assert [e.approval_id for e in store.events(session_id="s1", approval_id="a1")] == ["a1"]
        assert [e.kind for e in store.events(session_id="s1")] == ["shown", "other", "shown"]
        assert store.events(kind="shown", session_id="s3") == []
