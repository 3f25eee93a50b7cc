"""Round 5 adversarial read of `_owned`: effectgate's own files stay out of the file tools' reach
whatever spelling reaches them. Effects are counted on disk."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from effectgate import CallContext, EffectGate, EffectTable, open_store
from effectgate.tools import PathRefused, file_tools

AGENT = "coder"


def ctx(message_id: str) -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def test_the_journal_of_a_database_reached_through_a_symlink_is_protected(tmp_path: Path) -> None:
    """The store URL names a symlink to the database: SQLite resolves it and keeps its `-wal`
    beside the real file, so that is the journal to protect (deleting it loses the committed
    transactions not yet checkpointed; reading it shows the ledger's pages)."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "real.db").touch()
    (tmp_path / "ledger.db").symlink_to(work / "data" / "real.db")
    store = open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    store.setup()
    table = EffectTable(file_tools(work))
    table.allow_all(AGENT)
    gate = EffectGate(table, store)
    (work / "notes.txt").write_text("hello\n")
    keep = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)  # another process's
    try:
        keep.execute("SELECT count(*) FROM sqlite_master").fetchall()  # its WAL stays while it is open
        gate.call("read_file", {"path": "notes.txt"}, ctx("m0"))
        wal = work / "data" / "real.db-wal"
        assert wal.exists()  # SQLite keeps the journal beside the real file
        before = wal.read_bytes()
        with pytest.raises(PathRefused) as refused:
            gate.call("read_file", {"path": "data/real.db-wal"}, ctx("m1"))
        assert refused.value.code == "protected"
        with pytest.raises(PathRefused):  # a write runs at once: it would replace the journal
            gate.call("write_file", {"path": "data/real.db-wal", "content": "x"}, ctx("m2"))
        assert wal.read_bytes()[: len(before)] == before
    finally:
        keep.close()
        gate.close()
        store.close()
