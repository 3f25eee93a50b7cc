"""Round 14, stores: in-place upgrades of older databases, and what `open_store` leaves behind.
SQLite and PostgreSQL (the `store` fixtures)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Executed, Keyring
from effectgate.errors import StoreError
from effectgate.stores import SQLStore, _upgrade, open_store
from effectgate.stores.records import APPEND_ONLY, SCHEMA_VERSION
from effectgate.testing import FakeClock

from ..core.test_decision_records import Provider, paying_gate, run_payment

_V3_TABLES = ("eg_redacted", "eg_holds", "eg_chain")


@pytest.fixture
def paying(store: SQLStore, clock: FakeClock) -> Iterator[tuple[EffectGate, Provider]]:
    """A gate on `store` whose `pay` tool (money, finance approves) counts its effects."""
    provider, made = Provider(), []

    def make(table: Any) -> EffectGate:
        made.append(EffectGate(table, store, keyring=Keyring.generate(), clock=clock))
        return made[-1]

    yield paying_gate(make, provider), provider
    for gate in made:
        gate.close()


def _as_version_2(store: SQLStore) -> None:
    """What schema 2 left: no `model_id` columns, none of the tables version 3 added, and
    triggers that refuse every UPDATE and DELETE of the append-only tables."""
    with store.transaction() as conn:
        sqlite = conn.dialect.name == "sqlite"
        for table in APPEND_ONLY:
            if sqlite:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_update")
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_delete")
            else:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        for table in _V3_TABLES:
            conn.exec_driver_sql(f"DROP TABLE {table}")
        for table in ("eg_approvals", "eg_executions", "eg_events"):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN model_id")
        conn.exec_driver_sql("UPDATE eg_schema_version SET version = 2")


def _rows(store: SQLStore) -> dict[str, list[tuple[object, ...]]]:
    return {
        "approvals": [(a.id, a.status, a.seal) for a in store.approvals()],
        "events": [(e.id, e.kind) for e in store.events()],
        "executions": [(e.id, e.status) for e in store.executions()],
    }


def test_a_version_2_database_is_upgraded_in_place_and_every_seal_still_verifies(
    paying: tuple[EffectGate, Provider], store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    gate, provider = paying
    _, done = run_payment(gate)
    assert isinstance(done, Executed)
    before = _rows(store)
    _as_version_2(store)
    old = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="schema version 2; run `effectgate setup`"):
            old.check()
        old.setup()
        old.check()
        assert _rows(old) == before
        report = gate.audit()
        assert report.findings == [], report.findings
        # a new payment on the upgraded database runs once
        _, again = run_payment(gate, "m2")
        assert isinstance(again, Executed)
        assert len(provider.effects) == 2
    finally:
        old.close()


def _schema(store: SQLStore) -> dict[str, list[str]]:
    with store.engine.connect() as conn:  # not `reading`: it refuses another version
        inspector = sa.inspect(conn)
        return {t: sorted(c["name"] for c in inspector.get_columns(t)) for t in inspector.get_table_names()}


def test_an_upgrade_that_fails_half_way_leaves_the_old_database_as_it_was(
    paying: tuple[EffectGate, Provider],
    store: SQLStore,
    store_url: str,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, _ = paying
    assert isinstance(run_payment(gate)[1], Executed)
    before = _rows(store)
    _as_version_2(store)
    schema = _schema(store)

    def crash(conn: sa.Connection) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setitem(_upgrade.STEPS, 3, crash)  # after 2 -> 3 ran
    old = open_store(store_url, clock=clock)
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            old.setup()
        assert _schema(old) == schema
        with pytest.raises(StoreError, match="schema version 2"):
            old.check()
        monkeypatch.undo()
        old.setup()
        assert _rows(old) == before
        assert gate.audit().findings == []
    finally:
        old.close()


def test_a_database_of_a_newer_version_is_refused_and_nothing_is_written(
    store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    with store.transaction() as conn:
        conn.exec_driver_sql(f"UPDATE eg_schema_version SET version = {SCHEMA_VERSION + 1}")
        conn.exec_driver_sql("DROP TABLE eg_holds")
    schema = _schema(store)
    newer = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
            newer.setup()
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
            newer.check()
    finally:
        newer.close()
    assert _schema(store) == schema


# -- open_store: what a SQLite URL or path that cannot be used leaves behind (SQLite only)


@pytest.mark.parametrize("query", ["mode=ro", "mode=ro&cache=shared", "immutable=1", "vfs=memdb"])
def test_sqlite_uri_options_without_uri_true_are_refused(tmp_path: Path, query: str) -> None:
    """Without `uri=true` SQLAlchemy drops the URI's options with a warning: `?mode=ro`, a
    read-only audit of a copy, opened it read-write (and `setup` created and wrote the file)."""
    made = open_store(f"sqlite:///{tmp_path / 'kept.db'}")
    made.setup()
    made.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for name in ("kept.db", "new.db"):
        with pytest.raises(StoreError, match="uri=true"):
            open_store(f"sqlite:///{tmp_path / name}?{query}").setup()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_store_on_a_missing_sqlite_file_refuses_without_creating_it(tmp_path: Path) -> None:
    """`open_store` opens, it does not create: a mistyped path read by the CLI's library users
    (or a gate) was refused as having no schema, and left an empty file behind."""
    store = open_store(f"sqlite:///{tmp_path / 'typo.db'}")
    try:
        with pytest.raises(StoreError, match="no effectgate schema"):
            store.approvals()
        with pytest.raises(StoreError, match="no effectgate schema"):
            store.check()
    finally:
        store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_directory_or_a_file_that_is_not_sqlite_is_refused_as_a_store_error(tmp_path: Path) -> None:
    """sqlite3's bare "unable to open database file" / "file is not a database" (a driver
    traceback, naming no path) is now a StoreError naming the database, and nothing is changed."""
    (tmp_path / "dir.db").mkdir()
    (tmp_path / "notes.db").write_bytes(b"not a database\n" * 100)
    for name, says in (
        ("dir.db", "is a directory"),
        ("notes.db", "file is not a database"),
        ("no/x.db", "no/"),
    ):
        store = open_store(f"sqlite:///{tmp_path / name}")
        try:
            with pytest.raises(StoreError, match=says):
                store.setup()
            if name != "no/x.db":
                with pytest.raises(StoreError, match=says):
                    store.check()
        finally:
            store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.db", "notes.db"]
    assert list((tmp_path / "dir.db").iterdir()) == []
    assert (tmp_path / "notes.db").read_bytes() == b"not a database\n" * 100


def test_two_workers_upgrading_one_version_2_database_at_once(
    paying: tuple[EffectGate, Provider], store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    gate, _ = paying
    assert isinstance(run_payment(gate)[1], Executed)
    before = _rows(store)
    _as_version_2(store)
    workers = [open_store(store_url, clock=clock) for _ in range(2)]
    start, errors = threading.Barrier(2), []

    def upgrade(worker: SQLStore) -> None:
        start.wait()
        try:
            worker.setup()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upgrade, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        for worker in workers:
            worker.check()
            assert _rows(worker) == before
        assert gate.audit().findings == []
    finally:
        for worker in workers:
            worker.close()


@pytest.mark.parametrize(
    ("query", "waits_ms"), [("", 30_000), ("?timeout=0.25", 250), ("?timeout=120", 120_000)]
)
def test_a_sqlite_urls_timeout_is_how_long_a_writer_waits(tmp_path: Path, query: str, waits_ms: int) -> None:
    """`?timeout=` is checked as a number (`check_driver`) and was then dropped: the store's
    connect arguments and its `busy_timeout` pragma fixed every wait at 30 s."""
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}{query}")
    try:
        store.setup()
        with store.transaction() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == waits_ms
    finally:
        store.close()


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e12"])
def test_a_sqlite_timeout_out_of_range_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(StoreError, match="timeout must be seconds"):
        open_store(f"sqlite:///{tmp_path / 'x.db'}?timeout={value}")
    assert list(tmp_path.iterdir()) == []
