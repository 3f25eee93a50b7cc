"""A definite failure whose COMMIT landed although its reply was lost (a failover) is final for
that attempt: when another worker claimed the key again before the read-back (a failed write may
run again under the same key), the run that failed neither stores its failure a second time nor
records a lost lease, and never touches the other attempt's record (before, `record_failure`
retried, got LeaseLost, and `record_lease_lost` reopened the other attempt's failed record as an
unknown outcome and notified the approver)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Effect, EffectGate, EffectTable, ToolContext, ToolSpec
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.stores.base import Claimed
from effectgate.testing import EffectRecorder

from .conftest import MakeGate


class Declined(Exception):
    """The downstream service refused the write: nothing happened (a definite failure)."""


def _table(receiver: EffectRecorder, keys: list[str], armed: list[bool] | None = None) -> EffectTable:
    def note(text: str, tool_context: ToolContext) -> None:
        """Write a note; the service declines it (and the reply to the next COMMIT is lost, if armed)."""
        receiver.record("note", text=text)
        keys.append(tool_context.idempotency_key)
        if armed is not None:
            armed.append(True)
        raise Declined("the service declined the note")

    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note)])
    table.allow("support", ["note"])
    return table


def _lose_next_commit(monkeypatch: pytest.MonkeyPatch, meanwhile: Any) -> list[bool]:
    """Arm with `armed.append(True)`: the next COMMIT lands, `meanwhile()` runs, and the reply is lost."""
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def commit_then_lose(conn: Any, driver: Any, *, commit: bool) -> None:
        driver_end(conn, driver, commit=commit)
        if armed and commit:
            armed.clear()
            meanwhile()
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    monkeypatch.setattr(_dialect, "driver_end", commit_then_lose)
    return armed


def _no_lease_lost(store: SQLStore) -> None:
    assert store.events(kind="lease_lost") == []
    assert [e.status for e in store.executions(tool="note")] == ["failed"] * len(
        store.executions(tool="note")
    )


def test_a_landed_failure_is_final_when_a_new_attempt_failed_meanwhile(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt's failure landed; a second worker ran the same write again and it failed
    too: the record stays failed (attempt 2), never reopened as an unknown outcome."""
    receiver, keys = EffectRecorder(), []
    gates: list[EffectGate] = []
    armed = _lose_next_commit(monkeypatch, lambda: _fails(gates[1]))
    gates += [make_gate(_table(receiver, keys, armed)), make_gate(_table(receiver, keys))]
    with pytest.raises(Declined):
        gates[0].call("note", {"text": "hello"}, context("m1"))
    record = store.get(keys[0])
    assert record is not None
    assert (record.status, record.attempts) == ("failed", 2)
    assert receiver.count("note") == 2
    assert len(store.executions(tool="note")) == 2
    _no_lease_lost(store)


def _fails(gate: EffectGate) -> None:
    with pytest.raises(Declined):
        gate.call("note", {"text": "hello"}, context("m1"))


def test_a_landed_failure_leaves_a_new_attempt_in_flight_alone(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt's failure landed; another worker claimed the key again and is running
    it: the first run raises its own error, and the second one's lease and record are untouched."""
    receiver, keys = EffectRecorder(), []
    claims: list[Any] = []

    def claim_again() -> None:
        record = store.get(keys[0])
        assert record is not None
        claims.append(store.claim(keys[0], record.payload_hash))

    armed = _lose_next_commit(monkeypatch, claim_again)
    gate = make_gate(_table(receiver, keys, armed))
    with pytest.raises(Declined):
        gate.call("note", {"text": "hello"}, context("m1"))
    [claim] = claims
    assert isinstance(claim, Claimed)
    assert claim.attempt == 2
    record = store.get(keys[0])
    assert record is not None
    assert (record.status, record.lease_owner, record.attempts) == ("in_progress", claim.owner, 2)
    assert len(store.executions(tool="note")) == 1
    _no_lease_lost(store)
    store.complete(keys[0], claim.owner, {"noted": True})  # the second attempt still holds its lease


def test_a_failure_whose_commit_did_not_land_is_stored_once_more(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT did not land and nobody else took the key: the failure is stored on a fresh
    connection, once (the retry the fix keeps)."""
    receiver, keys = EffectRecorder(), []
    armed: list[bool] = []
    driver_end = _dialect.driver_end

    def commit_lost(conn: Any, driver: Any, *, commit: bool) -> None:
        if not (armed and commit):
            driver_end(conn, driver, commit=commit)
            return
        armed.clear()
        driver_end(conn, driver, commit=False)
        lost = ConnectionError("server closed the connection unexpectedly")
        raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

    monkeypatch.setattr(_dialect, "driver_end", commit_lost)
    gate = make_gate(_table(receiver, keys, armed))
    with pytest.raises(Declined):
        gate.call("note", {"text": "hello"}, context("m1"))
    record = store.get(keys[0])
    assert record is not None
    assert (record.status, record.attempts) == ("failed", 1)
    assert len(store.executions(tool="note")) == 1
    _no_lease_lost(store)
    with pytest.raises(LeaseLost):  # settled: the lease is no one's
        store.fail(keys[0], "nobody", "again")
