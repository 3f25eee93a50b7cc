"""Round 16, stores: processes (not threads) setting up or upgrading one SQLite file at once, as
workers of a deployment booting together. SQLite's locks are per file across processes, and
`setup` switches a database it created to WAL (a change to the file's header): every process
must end with one schema row, the append-only triggers, WAL, and its rows kept. This holds today;
these guard it."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest

from effectgate.stores import open_store
from effectgate.stores.records import APPEND_ONLY, SCHEMA_VERSION

from .test_round14_stores import _as_version_2

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
WORKERS = 4


def _boot(url: str, barrier: multiprocessing.synchronize.Barrier) -> None:  # pragma: no cover - a child
    store = open_store(url)
    barrier.wait(timeout=60)
    store.setup()
    store.check()
    store.close()


def _boot_together(url: str) -> None:
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(WORKERS)
    workers = [fork.Process(target=_boot, args=(url, barrier)) for _ in range(WORKERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * WORKERS


def _state(path: Path) -> tuple[object, ...]:
    with sqlite3.connect(path) as db:
        return (
            db.execute("SELECT id, version FROM eg_schema_version").fetchall(),
            db.execute("PRAGMA journal_mode").fetchone()[0],
            sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")),
        )


def _triggers() -> list[str]:
    return sorted(f"{t}_no_{op}" for t in APPEND_ONLY for op in ("delete", "update"))


def test_processes_setting_up_a_new_file_together_make_one_schema(tmp_path: Path) -> None:
    """Four processes run setup on a file none has created: each succeeds, one schema row, WAL."""
    path = tmp_path / "new.db"
    _boot_together(f"sqlite:///{path}")
    assert _state(path) == ([(1, SCHEMA_VERSION)], "wal", _triggers())


def test_processes_upgrading_an_old_file_together_upgrade_it_once(tmp_path: Path) -> None:
    """Four processes run setup on a version 2 file with rows: it is upgraded once, rows kept."""
    path = tmp_path / "old.db"
    store = open_store(f"sqlite:///{path}")
    store.setup()
    store.claim("pay-1", "h" * 64)
    _as_version_2(store)
    store.close()
    _boot_together(f"sqlite:///{path}")
    assert _state(path) == ([(1, SCHEMA_VERSION)], "wal", _triggers())
    reopened = open_store(f"sqlite:///{path}")
    try:
        assert [r.key for r in reopened.idempotency_records()] == ["pay-1"]
    finally:
        reopened.close()
