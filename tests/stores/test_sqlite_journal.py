"""SQLite's journal mode: WAL for every effectgate database, and nothing changed in one refused.

WAL is written in the file's header, so switching a database to it is a write: a database the
store refuses (no effectgate schema, another schema version) must keep its bytes and its mode.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from effectgate import open_store
from effectgate.cli import main
from effectgate.stores.records import SCHEMA_VERSION


def _mode(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


def _foreign(db: Path, version: int | None = None) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (id INTEGER)")
    if version is not None:
        conn.execute(
            "CREATE TABLE eg_schema_version (id INTEGER PRIMARY KEY, version INTEGER, applied_at REAL)"
        )
        conn.execute("INSERT INTO eg_schema_version VALUES (1, ?, 0)", (version,))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("version", [None, SCHEMA_VERSION + 1])
@pytest.mark.parametrize("argv", [["report"], ["pending"], ["show", "a" * 32], ["hold"]])
def test_refused_database_is_not_switched_to_wal(
    tmp_path: Path, argv: list[str], version: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "foreign.db"
    _foreign(db, version)
    before = db.read_bytes()
    assert main(["--db", f"sqlite:///{db}", *argv]) == 5
    err = capsys.readouterr().err
    assert ("no effectgate schema" if version is None else "schema version") in err
    assert db.read_bytes() == before
    assert _mode(db) == "delete"


def test_effectgate_database_is_wal_after_setup_in_the_same_process(tmp_path: Path) -> None:
    db = tmp_path / "eg.db"
    store = open_store(f"sqlite:///{db}")
    try:
        store.setup()
        assert _mode(db) == "wal"
    finally:
        store.close()


def test_effectgate_database_in_another_mode_becomes_wal_on_open(tmp_path: Path) -> None:
    db = tmp_path / "eg.db"
    assert main(["--db", f"sqlite:///{db}", "setup"]) == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    assert main(["--db", f"sqlite:///{db}", "report"]) == 0
    assert _mode(db) == "wal"
