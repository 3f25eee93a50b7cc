"""Schema 4: the ids of the append-only tables are 64-bit on PostgreSQL too, so a busy ledger
goes on past 2^31 rows; a version 3 database (SERIAL ids on PostgreSQL) is refused until
`setup` widens it in place, keeping every row. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Executed
from effectgate.chain import seal_chain
from effectgate.errors import StoreError
from effectgate.stores import SQLStore, open_store
from effectgate.stores.records import BIG_ID_COLUMNS, BIG_ID_TABLES, SCHEMA_VERSION
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_decision_records import Provider, paying_gate, run_payment

PAST = 2**31 - 1  # the last id an int4 holds: the next row's id needs 64 bits


def _continue_ids_after(store: SQLStore, last_id: int) -> None:
    """Make the next id of the append-only tables `last_id + 1`, as a ledger that has written
    that many rows."""
    if store.engine.dialect.name == "sqlite":
        _sqlite_rows_at(store, last_id)
        return
    with store.transaction() as conn:
        for table in BIG_ID_TABLES:
            conn.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {last_id})")


def _sqlite_rows_at(store: SQLStore, last_id: int) -> None:
    """SQLite's next rowid is one past the largest: a copy of a row at `last_id` in each table
    stands for the rows before it."""
    with store.transaction() as conn:
        for table in ("eg_events", "eg_decisions", "eg_executions"):
            columns = [r[1] for r in conn.exec_driver_sql(f"PRAGMA table_info({table})") if r[1] != "id"]
            listed = ", ".join(columns)
            conn.exec_driver_sql(
                f"INSERT INTO {table} (id, {listed}) SELECT {last_id}, {listed} FROM {table} LIMIT 1"
            )


def _pay_past_2_31(gate: EffectGate, store: SQLStore, provider: Provider) -> None:
    """A whole money cycle whose decision, execution and events all get ids beyond int4."""
    _, done = run_payment(gate, "m-big")
    assert isinstance(done, Executed)
    assert len(provider.effects) == 2
    with store.reading() as conn:
        for table in ("eg_decisions", "eg_events", "eg_executions"):
            top = conn.exec_driver_sql(f"SELECT max(id) FROM {table}").scalar()
            assert top is not None, table
            assert top > PAST, table


def test_a_money_cycle_runs_after_two_billion_rows_of_each_table(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    provider = Provider()
    gate = paying_gate(make_gate, provider)
    _, done = run_payment(gate)
    assert isinstance(done, Executed)
    _continue_ids_after(store, PAST)
    _pay_past_2_31(gate, store, provider)
    # the chain checkpoints id ranges beyond int4 too
    seal_chain(store, gate.keyring, now=clock.now() + 61)
    with store.reading() as conn:
        assert conn.exec_driver_sql("SELECT max(last_id) FROM eg_chain").scalar() > PAST


def _as_version_3(store: SQLStore) -> None:
    """What schema 3 left: on PostgreSQL, SERIAL (int4) ids and int4 sequences, and int4 id
    ranges in the chain; on SQLite the same tables (its ids were 64-bit already)."""
    with store.transaction() as conn:
        if conn.dialect.name == "postgresql":
            for table, columns in BIG_ID_COLUMNS.items():
                narrow = ", ".join(f"ALTER COLUMN {c} TYPE INTEGER" for c in columns)
                conn.exec_driver_sql(f"ALTER TABLE {table} {narrow}")
                sequence = conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{table}', 'id')").scalar()
                conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} AS INTEGER")
        conn.exec_driver_sql("UPDATE eg_schema_version SET version = 3")


def _id_types(store: SQLStore) -> set[str]:
    with store.reading() as conn:
        rows = conn.exec_driver_sql(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE column_name IN ('id', 'first_id', 'last_id', 'count')"
        )
        return {f"{t}.{c}:{d}" for t, c, d in rows if t in BIG_ID_TABLES}


def test_a_version_3_database_is_widened_in_place_keeping_every_row(
    make_gate: MakeGate, store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    provider = Provider()
    gate = paying_gate(make_gate, provider)
    _, done = run_payment(gate)
    assert isinstance(done, Executed)
    seal_chain(store, gate.keyring, now=clock.now() + 61)
    before = {
        "approvals": [(a.id, a.status) for a in store.approvals()],
        "events": [(e.id, e.kind) for e in store.events()],
        "executions": [(e.id, e.status) for e in store.executions()],
    }
    _as_version_3(store)
    postgres = store.engine.dialect.name == "postgresql"
    if postgres:
        assert all(kind.endswith(":integer") for kind in _id_types(store))
    old = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="schema version 3; run `effectgate setup`"):
            old.check()
        old.setup()
        old.check()
        with old.reading() as conn:
            assert conn.execute(sa.text("SELECT version FROM eg_schema_version")).scalar() == SCHEMA_VERSION
        assert {
            "approvals": [(a.id, a.status) for a in old.approvals()],
            "events": [(e.id, e.kind) for e in old.events()],
            "executions": [(e.id, e.status) for e in old.executions()],
        } == before
        if postgres:
            types = _id_types(old)
            assert len(types) == len(BIG_ID_TABLES) + 3
            assert all(kind.endswith(":bigint") for kind in types)
        # still append-only after the rewrite
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), old.transaction() as conn:
            conn.exec_driver_sql("DELETE FROM eg_executions")
    finally:
        old.close()
    _continue_ids_after(store, PAST)
    _pay_past_2_31(gate, store, provider)
