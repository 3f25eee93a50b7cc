"""Round 14: the read log and the audit.

The read log must lose no record silently: while the database is down its buffer is bounded (the
read that finds it full is refused loudly, its record kept), and records that cannot be written at
exit are reported. The audit must report every gated execution it cannot prove: an execution row
whose status column was edited to a value the gate never writes is checked as one that ran, never
skipped. Each test runs on SQLite and PostgreSQL (`shop_gate`, `store`); the clock is injected.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import pytest
import sqlalchemy as sa

import effectgate._readlog as readlog_module
from effectgate import Executed, Grant, Pending
from effectgate._readlog import ReadLog
from effectgate.audit import audit
from effectgate.errors import StoreError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import ShopGate
from .test_round12_audit import FINANCE, REFUND, edit, refund  # a refund run; a ledger edit


def down(store: SQLStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The database refuses read records until the test undoes the patch; the attempts made."""
    attempts: list[int] = []

    def refuse(conn: Any, rows: Any) -> None:
        attempts.append(len(rows))
        raise sa.exc.OperationalError("INSERT", {}, Exception("the database is down"))

    monkeypatch.setattr(store, "append_reads", refuse)
    return attempts


def reads_written(store: SQLStore) -> int:
    return len(store.events(kind="read"))


# -- the read log


def test_reads_are_refused_loudly_once_the_buffer_is_full_and_none_is_lost(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the database is down, reads are served and their records buffered, but only up to
    the log's limit: the read that finds it full writes the buffer itself, and when that fails it
    raises StoreError (its record kept). Once the database is back every record is written."""
    monkeypatch.setattr(readlog_module, "LIMIT", 5, raising=False)
    _, gate = shop_gate
    gate.close()  # the fixture's gate: its log was made before the limit was set
    log = ReadLog(store, batch=1000, interval=3600.0)
    monkeypatch.setattr(gate, "_reads", log)
    monkeypatch.setattr(gate._calls, "reads", log)
    down(store, monkeypatch)
    for i in range(4):
        assert isinstance(gate.call("get_order", {"order_id": "1042"}, context(f"m{i}")), Executed)
    with pytest.raises(StoreError, match="read records"):
        gate.call("get_order", {"order_id": "1042"}, context("m4"))
    with pytest.raises(StoreError, match="read records"):  # still down: refused again
        gate.call("get_order", {"order_id": "1042"}, context("m5"))
    assert reads_written(store) == 0
    monkeypatch.undo()
    log.close()
    assert reads_written(store) == 6  # the refused reads' records too: nothing lost


def test_a_full_buffer_is_written_on_the_callers_path_when_the_database_is_up(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full buffer with a writable database: the read that fills it writes it (no error)."""
    rows = _rows(store, 7)
    monkeypatch.setattr(readlog_module, "LIMIT", 3, raising=False)
    log = ReadLog(store, batch=1000, interval=3600.0)
    for row in rows:
        log.add(row)
    assert reads_written(store) >= 6
    log.close()
    assert reads_written(store) == 7


def test_records_not_written_at_exit_are_reported_not_dropped_silently(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At exit the database is down: the records that cannot be written are logged as lost, with
    their count (an ERROR), never dropped without a word."""
    log = ReadLog(store, batch=1000, interval=3600.0)
    for row in _rows(store, 3):
        log.add(row)
    down(store, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="effectgate"):
        readlog_module._close_at_exit(weakref.ref(log))
    monkeypatch.undo()
    log.close()  # the database is back: written after all (the test's own cleanup)
    lost = [r for r in caplog.records if r.levelno >= logging.ERROR and "3 read records" in r.getMessage()]
    assert lost, [r.getMessage() for r in caplog.records]


def _rows(store: SQLStore, n: int) -> list[tuple[Any, ...]]:
    """`n` read records as a gate builds them (`records.READ_COLUMNS` order)."""
    from effectgate import Keyring
    from effectgate.examples.shop import app

    gate = app(store, keyring=Keyring.generate(), clock=store.clock)
    spec = gate.table.get("get_order")
    assert spec is not None
    rows = [gate._events.read_row("read", spec, context(f"m{i}"), f"{i:064x}", 1) for i in range(n)]
    gate.close()
    return rows


# -- the audit


@pytest.mark.parametrize("status", ["SUCCEEDED", "done", ""])
def test_an_execution_whose_status_was_edited_to_an_unknown_value_is_still_checked(
    shop_gate: ShopGate, status: str
) -> None:
    """A refund ran; its execution row was edited to name no approval and to a status the gate
    never writes. The audit must not skip it as if nothing ran: a money execution with no
    approval is `no_approval` (the gate writes succeeded, needs_reconciliation or failed only)."""
    shop, gate = shop_gate
    approval_id = refund(gate, "m1")
    assert shop.receiver.count("refund") == 1
    assert audit(gate.store, keyring=gate.keyring).clean
    sql = "UPDATE eg_executions SET approval_id = NULL, status = :s WHERE approval_id = :a"
    edit(gate.store, sql, a=approval_id, s=status)
    kinds = [f.kind for f in audit(gate.store, keyring=gate.keyring).findings]
    assert "no_approval" in kinds


def test_a_second_run_of_one_approval_under_an_unknown_status_is_executed_twice(shop_gate: ShopGate) -> None:
    """The execution row of a refund copied (a second run of one grant) with a status the gate
    never writes: still a second run of the approval, `executed_twice`."""
    _, gate = shop_gate
    approval_id = refund(gate, "m1")
    columns = (
        "at, approval_id, version, tool, effect, args_hash, args_json, idempotency_key, session_id, "
        "origin_message_id, user_id, agent_id, run_id, table_fingerprint, row_fingerprint, "
        "policy_fingerprint, model_id"
    )
    sql = (
        f"INSERT INTO eg_executions ({columns}, status) SELECT {columns}, 'Succeeded' "
        "FROM eg_executions WHERE approval_id = :a"
    )
    edit(gate.store, sql, a=approval_id)
    kinds = [f.kind for f in audit(gate.store, keyring=gate.keyring).findings]
    assert kinds == ["executed_twice"]


def test_an_execution_moved_to_another_approval_of_the_same_call_is_a_finding(shop_gate: ShopGate) -> None:
    """Two identical refunds approved; only the first ran (its key, `eg_<id>_v1`, is the one the
    provider saw) and the second was never presented. The execution row edited to name the second
    approval says that one ran, under the first's key: the gate writes every execution under its
    own grant's key, so a run under another grant's key is `not_approved`, never clean."""
    shop, gate = shop_gate
    first = refund(gate, "m1")
    pending = gate.call("refund_order", REFUND, context("m2"))
    assert isinstance(pending, Pending)
    second = pending.approval_id
    assert isinstance(gate.approve(second, version=pending.version, approver=FINANCE), Grant)
    assert shop.receiver.count("refund") == 1
    assert audit(gate.store, keyring=gate.keyring).clean
    edit(gate.store, "UPDATE eg_executions SET approval_id = :b WHERE approval_id = :a", a=first, b=second)
    findings = audit(gate.store, keyring=gate.keyring).findings
    assert [(f.kind, f.approval_id) for f in findings] == [("not_approved", second)]
