"""An erasure over more records than one statement may bind: the lists of ids, keys and hashes a
redaction or retention pass reads are split into batches (SQLite binds at most 32,766 parameters
by default, PostgreSQL 65,535; a user's or a rule's reads alone can outnumber both). SQLite's
limit is lowered here so that a few hundred records cross it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from effectgate import CallContext, Effect, EffectGate, EffectTable, Executed, Keyring, ToolSpec, open_store
from effectgate.audit import audit
from effectgate.redact import redact, retain
from effectgate.testing import FakeClock

LIMIT = 1000  # bound parameters per statement here (the read log binds 64 rows x 14 = 896)
CALLS = 1100  # more than LIMIT: one list of them in a statement fails


def look_up(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "shipped"}


def note(order_id: str, text: str) -> dict[str, Any]:
    return {"order_id": order_id, "noted": text}


def ledger(path: Path) -> tuple[EffectGate, Any]:
    store = open_store(f"sqlite:///{path}")

    @sa.event.listens_for(store.engine, "connect")
    def _lower(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, LIMIT)

    store.setup()
    table = EffectTable(
        [
            ToolSpec(name="look_up", effect=Effect.READ, fn=look_up),
            ToolSpec(name="note", effect=Effect.WRITE, fn=note),
        ]
    )
    table.allow("support", ["look_up", "note"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=FakeClock())
    for i in range(CALLS):
        ctx = CallContext(session_id="s1", origin_message_id=f"m{i}", user_id="u1", agent_id="support")
        assert isinstance(gate.call("look_up", {"order_id": f"o{i}"}, ctx), Executed)
        assert isinstance(gate.call("note", {"order_id": f"o{i}", "text": "ada@example.com"}, ctx), Executed)
    gate.flush()
    return gate, store


def test_retention_over_more_reads_and_writes_than_a_statement_binds(tmp_path: Path) -> None:
    gate, store = ledger(tmp_path / "a.db")
    now = gate.clock.now() + 86_400
    done = retain(store, gate.keyring, {"read": 0, "write": 0}, by="dpo", now=now)
    assert done.rows >= 3 * CALLS  # each write's execution and event, each read's event
    assert all("ada@example.com" not in (e.args_json or "") for e in store.executions())
    assert audit(store, gate.table, keyring=gate.keyring).clean
    gate.close()


def test_a_redaction_of_more_records_than_a_statement_binds(tmp_path: Path) -> None:
    gate, store = ledger(tmp_path / "b.db")
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="request 9")
    assert done.rows >= 3 * CALLS
    assert all("ada@example.com" not in (e.args_json or "") for e in store.executions())
    assert audit(store, gate.table, keyring=gate.keyring).clean
    gate.close()
