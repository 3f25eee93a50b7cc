"""The database connection lost while a tool's result is stored (a PostgreSQL failover, a dropped
socket): the effect happened, so the result is stored on a fresh connection, once, and the call
returns executed. Before, the completion raised the driver's error and left the record in flight
until `recover` made it needs_reconciliation and a person had to settle an outcome that was
known. When the lost commit had in fact landed, the record says so and nothing is written twice."""

from __future__ import annotations

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
    Pending,
    Policy,
    Reconciled,
    ToolSpec,
)
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")


def _gate(make_gate: MakeGate, pay: Any) -> EffectGate:
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("support", ["pay"])
    return make_gate(table)


def _execute(gate: EffectGate) -> tuple[Any, str]:
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return gate.execute(grant.token), pending.approval_id


def _recorded_once(store: SQLStore, approval_id: str) -> None:
    [execution] = store.executions(approval_id=approval_id)
    assert execution.status == "succeeded"
    assert [e.kind for e in store.events(kind="executed")] == ["executed"]
    record = store.get(execution.idempotency_key)
    assert record is not None
    assert record.status == "succeeded"
    approval = store.get_approval(approval_id)
    assert approval is not None
    assert approval.status == "executed"


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_the_server_drops_every_connection_while_the_tool_runs(make_gate: MakeGate, store: SQLStore) -> None:
    receiver = EffectRecorder()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account; meanwhile the server drops the gate's connections."""
        receiver.record("pay", account=account, amount=amount)
        with sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool).connect() as admin:
            dropped = admin.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        assert dropped >= 1  # the connection the claim ran on, kept for the completion
        return {"paid": amount}

    outcome, approval_id = _execute(_gate(make_gate, pay))
    assert isinstance(outcome, Executed)
    assert outcome.result == {"paid": 5}
    assert receiver.count("pay") == 1
    _recorded_once(store, approval_id)


def test_a_commit_that_landed_before_the_connection_went_is_not_written_again(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = EffectRecorder()
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def commit_then_lose(conn: Any, driver: Any, *, commit: bool) -> None:
        driver_end(conn, driver, commit=commit)
        if armed and commit:
            armed.clear()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account; the reply to the next COMMIT is lost."""
        receiver.record("pay", account=account, amount=amount)
        armed.append(True)
        return {"paid": amount}

    monkeypatch.setattr(_dialect, "driver_end", commit_then_lose)
    outcome, approval_id = _execute(_gate(make_gate, pay))
    assert isinstance(outcome, Executed)
    assert outcome.result == {"paid": 5}
    assert receiver.count("pay") == 1
    _recorded_once(store, approval_id)  # no second execution row, no lease_lost
    assert store.events(kind="lease_lost") == []


def test_an_error_that_is_not_a_lost_connection_is_raised_as_before(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure to store the result that is not a lost connection is not retried."""
    attempts: list[int] = []
    append_execution = store.append_execution

    def failing(conn: Any, **values: Any) -> None:
        attempts.append(1)
        raise sa.exc.IntegrityError("INSERT", None, ValueError("constraint"))

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        monkeypatch.setattr(store, "append_execution", failing)
        return {"paid": amount}

    with pytest.raises(sa.exc.IntegrityError):
        _execute(_gate(make_gate, pay))
    monkeypatch.setattr(store, "append_execution", append_execution)
    assert attempts == [1]
    [record] = store.idempotency_records()
    assert record.status == "in_progress"  # left for `recover`, as before


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_the_connection_dropped_in_the_middle_of_storing_the_result(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped between the transaction's statements: its ROLLBACK fails too, and the loss itself
    surfaces (the failing ROLLBACK does not replace it), recognised as a lost connection."""
    receiver = EffectRecorder()
    armed: list[bool] = []
    append_execution = store.append_execution

    def dropped_here(conn: Any, **values: Any) -> None:
        if armed:
            armed.clear()
            pid = _dialect.run(conn, "SELECT pg_backend_pid()").fetchone()[0]
            with sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool).connect() as admin:
                admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        append_execution(conn, **values)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        armed.append(True)
        return {"paid": amount}

    monkeypatch.setattr(store, "append_execution", dropped_here)
    outcome, approval_id = _execute(_gate(make_gate, pay))
    assert isinstance(outcome, Executed)
    assert receiver.count("pay") == 1
    _recorded_once(store, approval_id)


def test_a_record_a_reconciliation_settled_is_not_this_runs_commit(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's COMMIT is lost (it did not land) while another worker's `recover` found the lease
    expired and the reconcile found the payment at the provider: the record is succeeded, but not
    by this run. Its run is recorded as a lease lost (as without a lost connection), not returned
    as the reconciler's result."""
    gates: list[EffectGate] = []
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def commit_lost(conn: Any, driver: Any, *, commit: bool) -> None:
        if not (armed and commit):
            driver_end(conn, driver, commit=commit)
            return
        armed.clear()
        driver_end(conn, driver, commit=False)  # the COMMIT did not land
        clock.advance(gates[0].policy.lease_seconds + 1)
        assert len(gates[1].recover()) == 1  # meanwhile: expired, reconciled as found
        lost = ConnectionError("server closed the connection unexpectedly")
        raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account; the reply to the next COMMIT is lost."""
        armed.append(True)
        return {"paid": amount}

    def table() -> EffectTable:
        spec = ToolSpec(
            name="pay",
            effect=Effect.MONEY,
            fn=pay,
            approver_role="finance",
            subject=("account",),
            reconcile=lambda key: Reconciled(found=True, result={"found": True}),
        )
        t = EffectTable([spec])
        t.allow("support", ["pay"])
        return t

    monkeypatch.setattr(_dialect, "driver_end", commit_lost)
    policy = Policy(lease_seconds=1000)
    gates += [make_gate(table(), policy=policy)]
    gates += [make_gate(table(), keyring=gates[0].keyring, policy=policy)]
    with pytest.raises(LeaseLost):
        _execute(gates[0])
    assert len(store.events(kind="lease_lost")) == 1
    assert ("needs_reconciliation", '{"paid":5}') in {(e.status, e.result_json) for e in store.executions()}
