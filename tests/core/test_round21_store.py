"""Round 21, the store under failure and concurrency: lost connections, racing workers, forks.

- An unknown outcome (the tool raised `OutcomeUnknown`) whose connection the server dropped while
  the tool ran: the driver's error was raised in place of `NeedsReconciliation`, the record was
  left in flight and the approver was not told until a `recover` pass found its lease run out.
  Now it is stored once more on a fresh connection, as a result or a definite failure is; and
  when that commit had landed (its reply lost), it is not written twice.
- A write whose tool got the provider's reference and could not store it (the database lost):
  the store's error reached the write as a definite failure, its record `failed`, and the next
  call of the same message ran the effect again. Now `set_provider_ref` raises `OutcomeUnknown`
  with the reference: the write needs reconciliation, and is not run again.
- `IdempotencyStore.run` on its own lost the result of a function that ran (the completion's
  connection dropped: the record stayed in flight), and never ran a function whose claim landed
  with its reply lost (every retry `InProgress`). Both are read back now (`stores/_run.py`).
- A proposal that marks its session's lapsed approvals expired (newest first) and `expire()` in
  another worker (in the database's order) each held a row the other wanted: PostgreSQL ended one
  with a raw deadlock error. Both read them newest first now (`_statements`).
- A child forked while another thread of its parent was inside a pool checkout or checkin waited
  forever for the pool's lock that thread held: it gets a pool of its own now (`_fork`).

The connections are ended from another session with `pg_terminate_backend` (PostgreSQL); a
reply lost after its COMMIT landed is simulated as tests/core/test_lost_connection.py does.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
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
    ReconciliationNotice,
    ToolContext,
    ToolSpec,
    open_store,
)
from effectgate.errors import NeedsReconciliation, OutcomeUnknown
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")


def _drop_connections(store: SQLStore) -> None:
    """End every session of the store's database but this one's (the store's kept connections)."""
    with sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool).connect() as admin:
        dropped = admin.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert dropped >= 1


def _pay_gate(make_gate: MakeGate, pay: Any, notices: list[ReconciliationNotice]) -> EffectGate:
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("support", ["pay"])
    return make_gate(table, on_needs_reconciliation=notices.append)


def _granted(gate: EffectGate) -> tuple[str, Grant]:
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return pending.approval_id, grant


def _unknown_once(store: SQLStore, approval_id: str, notices: list[ReconciliationNotice]) -> None:
    """The execution needs reconciliation: its record, one execution row, one event, one notice."""
    [execution] = store.executions(approval_id=approval_id)
    assert execution.status == "needs_reconciliation"
    record = store.get(execution.idempotency_key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert record.error == "OutcomeUnknown: the provider timed out"
    assert [e.kind for e in store.events(kind="needs_reconciliation")] == ["needs_reconciliation"]
    assert [(n.approval_id, n.key) for n in notices] == [(approval_id, execution.idempotency_key)]


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_an_unknown_outcome_is_stored_after_the_server_dropped_the_connection(
    make_gate: MakeGate, store: SQLStore
) -> None:
    receiver = EffectRecorder()
    notices: list[ReconciliationNotice] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """The payment is sent; the server drops the gate's connections; the reply never comes."""
        receiver.record("pay", account=account, amount=amount)
        _drop_connections(store)
        raise OutcomeUnknown("the provider timed out")

    gate = _pay_gate(make_gate, pay, notices)
    approval_id, grant = _granted(gate)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert receiver.count("pay") == 1
    _unknown_once(store, approval_id, notices)


def test_an_unknown_outcome_whose_commit_landed_is_not_written_again(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT that marks it lands and its reply is lost (a failover, as
    tests/core/test_lost_connection.py loses it): the record, read back, says it landed."""
    receiver = EffectRecorder()
    notices: list[ReconciliationNotice] = []
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def commit_then_lose(conn: Any, driver: Any, *, commit: bool) -> None:
        driver_end(conn, driver, commit=commit)
        if armed and commit:
            armed.clear()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    def pay(account: str, amount: int) -> dict[str, int]:
        receiver.record("pay", account=account, amount=amount)
        armed.append(True)
        raise OutcomeUnknown("the provider timed out")

    monkeypatch.setattr(_dialect, "driver_end", commit_then_lose)
    gate = _pay_gate(make_gate, pay, notices)
    approval_id, grant = _granted(gate)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert receiver.count("pay") == 1
    _unknown_once(store, approval_id, notices)
    assert store.events(kind="lease_lost") == []


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_write_whose_provider_reference_could_not_be_stored_is_not_run_again(
    make_gate: MakeGate, store: SQLStore
) -> None:
    receiver = EffectRecorder()

    def ship(order_id: str, tool_context: ToolContext) -> dict[str, str]:
        """The carrier accepts the shipment (its reference) while the gate's database goes away."""
        receiver.record("ship", order_id=order_id)
        _drop_connections(store)
        tool_context.set_provider_ref("shp_1")  # the store's error, as any tool would let it rise
        return {"shipment": "shp_1"}

    table = EffectTable([ToolSpec(name="ship", effect=Effect.WRITE, fn=ship)])
    table.allow("support", ["ship"])
    gate = make_gate(table)
    first: Any
    try:
        first = gate.call("ship", {"order_id": "o-1"}, context("m1"))
    except Exception as exc:
        first = exc
    assert isinstance(first, NeedsReconciliation), first
    again = gate.call("ship", {"order_id": "o-1"}, context("m1"))  # the same message, replayed
    assert receiver.count("ship") == 1, again
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert record.provider_ref == "shp_1"


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_store_run_keeps_the_result_of_a_function_that_ran_while_the_connection_was_lost(
    store: SQLStore,
) -> None:
    """`IdempotencyStore.run` on its own: the function charged, the server dropped the connection
    the completion was to use. Its result is stored on a fresh connection (before, the driver's
    error was raised and the record left in flight: a retry was `InProgress` until the lease ran
    out, then needed reconciliation for an outcome that was known)."""
    receiver = EffectRecorder()

    def charge() -> dict[str, str]:
        receiver.record("charge")
        _drop_connections(store)
        return {"charge_id": "ch_1"}

    assert store.run("k", "h" * 64, charge) == {"charge_id": "ch_1"}
    assert store.run("k", "h" * 64, charge) == {"charge_id": "ch_1"}  # stored: nothing runs
    assert receiver.count("charge") == 1
    record = store.get("k")
    assert record is not None
    assert record.status == "succeeded"


def test_store_run_whose_claim_landed_with_its_reply_lost_runs_the_function_once(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's INSERT commits and its reply is lost (a failover): the record, read back, is in
    flight under this run's lease, so the function runs now (before, the error was raised and
    every retry was `InProgress` for a function that never ran)."""
    receiver = EffectRecorder()
    x = store._x
    armed = [True]

    def claim_then_lose(conn: Any, sql: str, params: Any) -> Any:
        cursor = x(conn, sql, params)
        if armed and sql.startswith("INSERT INTO eg_idempotency"):
            armed.clear()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError(sql, None, lost, connection_invalidated=True)
        return cursor

    monkeypatch.setattr(store, "_x", claim_then_lose)

    def charge() -> dict[str, str]:
        receiver.record("charge")
        return {"charge_id": "ch_1"}

    assert store.run("k", "h" * 64, charge) == {"charge_id": "ch_1"}
    assert receiver.count("charge") == 1
    record = store.get("k")
    assert record is not None
    assert record.status == "succeeded"
    assert record.attempts == 1


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_proposal_and_an_expiry_pass_in_two_workers_do_not_deadlock(
    store: SQLStore, store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker proposes in a session with two lapsed approvals (it marks them expired, newest
    first); another runs `expire()` (every lapsed approval, in the order the database read them:
    oldest first). Each held the row the other wanted next: PostgreSQL ended one of them with a
    deadlock error. Both now take the rows in one order (newest first), so one waits, both end."""
    keyring = Keyring.generate()
    other = open_store(store_url, clock=clock)

    def pay(account: str, amount: int) -> dict[str, int]:
        return {"paid": amount}

    def gate_on(s: SQLStore) -> EffectGate:
        spec = ToolSpec(
            name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",)
        )
        table = EffectTable([spec])
        table.allow("support", ["pay"])
        return EffectGate(table, s, keyring=keyring, clock=clock)

    proposer, expirer = gate_on(store), gate_on(other)
    for n in (1, 2):
        assert isinstance(proposer.call("pay", {"account": f"a-{n}", "amount": n}, context(f"m{n}")), Pending)
    clock.advance(2 * 24 * 3600)
    first_taken, second_taken = threading.Event(), threading.Event()
    waits = _lock_waits(store)

    def holding_first(s: SQLStore, taken: threading.Event, then: Callable[[], None]) -> None:
        update = s.update_approval
        seen: list[bool] = []

        def update_approval(conn: Any, approval_id: str, **kw: Any) -> bool:
            changed = update(conn, approval_id, **kw)
            if not seen:
                seen.append(True)
                taken.set()
                then()
            return changed

        monkeypatch.setattr(s, "update_approval", update_approval)

    def until_taken_or_waiting() -> None:
        for _ in range(2000):  # until the expiry pass holds its first row, or waits for ours
            if second_taken.wait(0.005) or waits():
                return

    holding_first(store, first_taken, until_taken_or_waiting)
    holding_first(other, second_taken, lambda: None)
    outcomes: dict[str, Any] = {}

    def run(name: str, op: Callable[[], Any], after: threading.Event | None) -> None:
        if after is not None:
            after.wait(5)
        try:
            outcomes[name] = op()
        except Exception as exc:  # compared below
            outcomes[name] = exc

    threads = [
        threading.Thread(
            target=run,
            args=(
                "propose",
                lambda: proposer.call("pay", {"account": "a-3", "amount": 3}, context("m3")),
                None,
            ),
        ),
        threading.Thread(target=run, args=("expire", expirer.expire, first_taken)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    proposer.close()
    expirer.close()
    other.close()
    assert isinstance(outcomes["propose"], Pending), outcomes
    assert outcomes["expire"] is None, outcomes
    assert sorted(a.status for a in store.approvals()) == ["expired", "expired", "pending"]


def _lock_waits(store: SQLStore) -> Callable[[], bool]:
    """Whether a session of the store's database waits for a lock (read from another session)."""
    admin = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)

    def waiting() -> bool:
        with admin.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    )
                ).scalar_one()
            )

    return waiting


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_is_in_the_pool_still_connects(store: SQLStore) -> None:
    """A worker forked while another thread of its parent was inside a pool checkout or checkin
    (here: that thread holds the pool's lock across the fork). The child's copy of the lock
    stayed held by a thread it does not have, and its first checkout waited forever. The child
    now has a pool of its own; the parent's connections are neither used nor closed by it."""
    store.run("warm", "h" * 64, lambda: 0)  # the parent keeps a connection
    with store.reading():
        pass  # and the pool holds one
    lock = store.engine.pool._pool.mutex  # type: ignore[attr-defined]
    held, done = threading.Event(), threading.Event()

    def in_the_pool() -> None:
        with lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=in_the_pool)
    thread.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's: it ends the child
            signal.alarm(5)  # a hung child ends, and reports it
            ran = store.run("child", "h" * 64, lambda: "c") == "c"
            code = 0 if ran and len(store.approvals()) == 0 else 2
        finally:
            os._exit(code)
    done.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.run("parent", "h" * 64, lambda: "p") == "p"  # its connections still work
    record = store.get("child")
    assert record is not None
    assert record.result == "c"
