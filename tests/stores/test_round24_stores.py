"""Round 24, stores under concurrency and failure (each reproduced first; real threads, and a
real PostgreSQL server where two transactions must overlap). Four defects, fixed:

- Two reconciliations of one call raced on PostgreSQL: one whose provider said "not found" read
  the record (its attempts) without locking it, and its release's compare-and-set looked at the
  status alone; when the other ran the call again and that run ended unknown (its reply lost)
  before the release, the stale "not found" ran the call again: paid twice. Now the settlement
  reads the record under its row lock (`IdempotencyStore.awaiting`): the other waits, then finds
  it run again (stale) or settled.
- A call a person settled "did not happen", reopened by a late run of its grant, was run again by
  `reconcile` once the approval's status column (no seal covers it) was edited back to `approved`.
  Now its append-only `failed` execution decides (`_reconciled.ended`).
- `recover()` stopped at an in-flight record edited so that it cannot be read (a result that is
  not JSON): no other lapsed lease was handled. Now that record is logged and the others go on.
- `recover()` whose commit (the record needs reconciliation, with its event) landed with its reply
  lost (a failover) raised, and no later pass announced or reconciled the record (it was no longer
  in flight). Now the record is read back (`_reconciled.expiry_landed`) and that pass goes on.

Probes that hold (kept): two workers presenting one grant at once; a session ended before each
statement of `recover` and the reconciliation it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
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
    ReconciliationNotice,
    ToolContext,
    ToolSpec,
)
from effectgate._ledger import Ledger
from effectgate.errors import (
    ApprovalExpired,
    LeaseLost,
    NeedsReconciliation,
    PolicyViolation,
    StoreError,
    TokenError,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.stores.base import Claimed
from effectgate.testing import EffectRecorder, FakeClock

from .test_round16_lost_connection import Killer, LostReply, _outcome, _rows

FINANCE = Approver("fiona", "finance")


class Provider:
    """A payment provider that does not dedupe on the key: every run that reaches it pays (the
    receiver counts each). `lose` replies are lost (TimeoutError); `reach` says whether a run
    reaches the provider at all."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.lose = 0
        self.reach: list[bool] = []
        self.hold: threading.Event | None = None  # a run waits for it before it pays
        self.during: list[Callable[[], None]] = []  # run inside the next run, before it pays

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        if self.hold is not None:
            assert self.hold.wait(10)
        if self.during:
            self.during.pop()()
        if not self.reach or self.reach.pop(0):
            self.receiver.record("pay", idempotency_key=tool_context.idempotency_key, account=account)
        if self.lose:
            self.lose -= 1
            raise TimeoutError("the reply was lost")
        return {"paid": amount}

    def lookup(self, key: str) -> Reconciled | None:
        if self.receiver.count("pay", idempotency_key=key):
            return Reconciled(found=True, result={"paid": 0})
        return Reconciled(found=False)

    def table(self, *, hook: bool = True) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=self.lookup if hook else None,
                )
            ]
        )
        table.allow_all("support")
        return table


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, provider: Provider) -> Iterator[EffectGate]:
    g = EffectGate(provider.table(), store, keyring=Keyring.generate(), clock=clock)
    yield g
    g.close()


def grant_of(gate: EffectGate, account: str = "a1", message: str = "m1") -> Grant:
    out = gate.call("pay", {"account": account, "amount": 5}, context(message))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_stale_not_found_never_runs_the_call_again_after_another_run(
    gate: EffectGate, provider: Provider, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    grant = grant_of(gate)
    provider.reach, provider.lose = [False], 1  # the first run never reached the provider
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert provider.receiver.count("pay") == 0
    read, other_done = threading.Event(), threading.Event()
    granted = Ledger.granted

    def paused(self: Ledger, conn: Any, row: Any) -> None:  # B, inside its settlement, after its read
        granted(self, conn, row)
        if threading.current_thread().name == "B":
            read.set()
            assert other_done.wait(10)

    monkeypatch.setattr(Ledger, "granted", paused)
    outcome: dict[str, object] = {}

    def reconcile() -> None:
        try:
            outcome[threading.current_thread().name] = gate.reconcile(grant.approval_id)
        except Exception as exc:
            outcome[threading.current_thread().name] = exc

    b, c = (threading.Thread(target=reconcile, name=n) for n in "BC")
    b.start()
    try:
        assert read.wait(10)
        provider.lose = 1  # the run again reaches the provider; its reply is lost
        c.start()  # the other reconcile: it runs the call again, unless it waits for B
        while c.is_alive() and not _waiting_on_a_lock(store):
            c.join(0.01)
    finally:
        other_done.set()
        b.join(10)
        c.join(10)
    assert provider.receiver.count("pay") == 1  # one run again: the other's "not found" is stale
    ran, refused = sorted(outcome.values(), key=lambda o: isinstance(o, PolicyViolation))
    assert isinstance(ran, NeedsReconciliation), outcome
    assert isinstance(refused, PolicyViolation), outcome
    assert refused.code == "not_reconcilable"
    record = store.get(f"eg_{grant.approval_id}_v1")
    assert record is not None
    assert (record.status, record.attempts) == ("needs_reconciliation", 2)


def _waiting_on_a_lock(store: SQLStore) -> bool:
    with store.engine.connect() as conn:
        sql = "SELECT 1 FROM pg_locks WHERE NOT granted AND locktype <> 'virtualxid' LIMIT 1"
        return conn.exec_driver_sql(sql).first() is not None


def test_two_workers_presenting_one_grant_at_once_pay_once(
    gate: EffectGate, provider: Provider, store: SQLStore
) -> None:
    grant = grant_of(gate)
    start, decided = threading.Barrier(2), threading.Event()
    outcome: dict[str, object] = {}
    provider.hold = decided  # the other worker's presentation is decided while this one runs
    other = EffectGate(provider.table(), store, keyring=gate.keyring, clock=gate.clock)

    def present(worker: EffectGate, name: str) -> None:
        start.wait(10)
        try:
            outcome[name] = worker.execute(grant.token)
        except Exception as exc:
            outcome[name] = exc
            decided.set()

    threads = [threading.Thread(target=present, args=(g, n)) for g, n in ((gate, "a"), (other, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    other.close()
    assert provider.receiver.count("pay") == 1
    ran, refused = sorted(outcome.values(), key=lambda o: isinstance(o, Exception))
    assert isinstance(ran, Executed), outcome
    assert isinstance(refused, TokenError), outcome
    assert refused.reason == "used"
    [execution] = store.executions(approval_id=grant.approval_id)
    assert execution.status == "succeeded"


def test_recover_is_not_stopped_by_another_records_edited_result(
    gate: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    for key in ("dead-1", "dead-2"):
        assert isinstance(store.claim(key, "h", lease_seconds=1), Claimed)
    with store.engine.begin() as conn:  # edited outside effectgate: not JSON
        conn.exec_driver_sql("UPDATE eg_idempotency SET result_json = 'not json' WHERE \"key\" = 'dead-1'")
    clock.advance(2)
    with pytest.raises(StoreError):
        store.get("dead-1")
    assert "dead-2" in gate.recover()
    record = store.get("dead-2")
    assert record is not None
    assert record.status == "needs_reconciliation"


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_session_ended_before_each_statement_of_recover_leaves_nothing_half_done(
    gate: EffectGate, provider: Provider, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recover` of a worker that died, its hook finding nothing and running the call again: the
    session ended before each statement in turn. Nothing half written; in the end the call ran
    once and its record succeeded (`settle` and `reconcile` on their own held as well)."""
    killer = Killer(store, monkeypatch)
    for n in range(1, 60):
        grant = grant_of(gate, account=f"a{n}", message=f"m{n}")
        key = f"eg_{grant.approval_id}_v1"
        row = store.get_approval(grant.approval_id)
        assert row is not None
        assert isinstance(store.claim(key, row.args_hash, lease_seconds=1), Claimed)  # it died
        clock.advance(2)
        before = _rows(store)
        killer.arm(n)
        outcome = _outcome(gate.recover)
        killer.armed = False
        if isinstance(outcome, sa.exc.DBAPIError):
            assert killer.killed
            assert store.lost_connection(outcome)
            assert _rows(store) == before, n  # never half a settlement
            gate.recover()
        record = store.get(key)
        assert record is not None
        if record.status == "needs_reconciliation":  # its reconcile was killed: recorded, done by hand
            assert store.events(kind="reconcile_failed")
            gate.reconcile(grant.approval_id)
            record = store.get(key)
            assert record is not None
        assert record.status == "succeeded", (n, record)
        assert provider.receiver.count("pay", idempotency_key=key) == 1, n
        if not killer.killed:
            break
    assert n > 3


def test_a_grant_settled_as_not_happened_never_runs_again_whatever_its_status_column_says(
    gate: EffectGate, provider: Provider, store: SQLStore, clock: FakeClock
) -> None:
    """A late run of a grant settled "did not happen" reopens its record; reconciled, "not found"
    releases it and never runs it again (its approval ended). The approval's status column, which
    no seal covers, edited back to `approved`, does not make reconcile run it again."""
    grant = grant_of(gate)
    other = EffectGate(provider.table(hook=False), store, keyring=gate.keyring, clock=clock)
    key = f"eg_{grant.approval_id}_v1"

    def stall() -> None:  # the worker stalls past its lease: another recovers it, a person settles
        clock.advance(gate.policy.lease_seconds + 1)
        assert other.recover() == [key]
        other.settle(grant.approval_id, happened=False, by="fiona")

    provider.during.append(stall)
    provider.reach, provider.lose = [False], 1  # the late run never reached the provider
    with pytest.raises(LeaseLost):
        gate.execute(grant.token)
    other.close()
    with store.engine.begin() as conn:  # edited outside effectgate
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'approved' WHERE id = :i"), {"i": grant.approval_id}
        )
    assert gate.reconcile(grant.approval_id) is None
    assert provider.receiver.count("pay") == 0  # it did not happen, and never runs again
    record = store.get(key)
    assert record is not None
    assert record.status == "failed"


def test_recover_whose_commit_landed_with_its_reply_lost_still_announces_and_reconciles(
    provider: Provider, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    notices: list[ReconciliationNotice] = []
    gate = EffectGate(
        provider.table(),
        store,
        keyring=Keyring.generate(),
        clock=clock,
        on_needs_reconciliation=notices.append,
    )
    grant = grant_of(gate)
    key = f"eg_{grant.approval_id}_v1"
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert isinstance(store.claim(key, row.args_hash, lease_seconds=1), Claimed)  # a worker that died
    clock.advance(2)
    lost = LostReply(monkeypatch)
    lost.armed = True  # recover's commit lands; its reply is lost (a failover)
    touched = _outcome(gate.recover)
    if isinstance(touched, sa.exc.DBAPIError):
        assert store.lost_connection(touched)
        touched = gate.recover()  # the operator's next pass
    gate.close()
    assert touched == [key]
    assert [n.key for n in notices] == [key]  # announced once
    record = store.get(key)
    assert record is not None
    assert record.status == "succeeded"  # not found at the provider: run again, once
    assert provider.receiver.count("pay") == 1


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_expire_racing_an_approval_leaves_one_of_them_and_a_clear_answer(
    gate: EffectGate, provider: Provider, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending)
    later = FakeClock(clock.now() + gate.policy.pending_ttl)  # another worker: the deadline has come
    sweeper = EffectGate(provider.table(), store, keyring=gate.keyring, clock=later)
    read, swept = threading.Event(), threading.Event()
    decided = Ledger.decided

    def paused(self: Ledger, *args: Any, **kwargs: Any) -> Any:  # the approver read it pending
        found = decided(self, *args, **kwargs)
        if threading.current_thread().name == "A":
            read.set()
            assert swept.wait(10)
        return found

    monkeypatch.setattr(Ledger, "decided", paused)
    outcome: dict[str, object] = {}

    def approve() -> None:
        try:
            outcome["a"] = gate.approve(out.approval_id, version=1, approver=FINANCE)
        except Exception as exc:
            outcome["a"] = exc

    thread = threading.Thread(target=approve, name="A")
    thread.start()
    try:
        assert read.wait(10)
        sweeper.expire()
    finally:
        swept.set()
        thread.join(10)
    sweeper.close()
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("expired", 0)  # holds: one of them, nothing half-written
    assert isinstance(outcome["a"], ApprovalExpired), outcome  # not "version 1 does not exist yet"
