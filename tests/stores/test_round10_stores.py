"""Round 10: the store's internals (transactions, pools, URLs, set-up), on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import sqlite3

import pytest
import sqlalchemy as sa

from effectgate import Keyring, Pending, open_store
from effectgate.errors import StoreError
from effectgate.examples.shop import app, context
from effectgate.outcomes import TAMPERED_WARNING
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

HASH = "h" * 64
REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}


def test_a_statement_that_fails_inside_a_transaction_never_commits_half_of_it(store: SQLStore) -> None:
    """A statement the database refuses inside `store.transaction()`, its error caught in the
    block: SQLAlchemy rolled back the driver's transaction (it saw none), so the block's later
    statements each committed by themselves and its earlier ones were lost, silently on
    PostgreSQL. Now nothing of the block is written, and the block's end says so."""
    store.run("warm", HASH, lambda: 0)  # a kept connection: the transaction runs on its driver

    def block() -> None:
        with store.transaction() as conn:
            store.claim("first", HASH, owner="o", conn=conn)
            with pytest.raises(sa.exc.DBAPIError):  # NOT NULL refused
                store._transition(conn, "first", from_status=("in_progress",), values={"status": None})
            store.claim("second", HASH, owner="o", conn=conn)  # PostgreSQL: refused (aborted)

    with pytest.raises((StoreError, sa.exc.DBAPIError)):
        block()
    assert (store.get("first"), store.get("second")) == (None, None)
    assert store.run("after", HASH, lambda: 1) == 1  # the connection is usable again
    assert store.get("after") is not None


def test_a_copy_not_in_wal_mode_opens_read_only(sqlite_url: str) -> None:
    """A copy of a database in another journal mode (a backup), opened read-only (`mode=ro`, a
    read-only mount): switching it to WAL on connect failed every connection, so nothing could
    be read from it. It is read as it is (and switched by a later writable connection)."""
    with open_store(sqlite_url) as store:
        store.setup()
        store.run("k", HASH, lambda: {"n": 1})
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    with open_store(f"sqlite:///file:{path}?mode=ro&uri=true") as copy:
        record = copy.get("k")
        assert record is not None
        assert record.result == {"n": 1}
        assert copy.approvals() == []
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.parametrize("column", ["args_json", "subject_json", "notes_json"])
def test_a_json_column_edited_into_a_blob_is_read_as_text(
    sqlite_url: str, clock: FakeClock, column: str
) -> None:
    """SQLite keeps a BLOB in any column: arguments (or subject, or notes) edited into one came
    back as bytes, and every surface's list of approvals (the inbox, `pending`, a notebook) failed
    with a TypeError for all of them. The row is read as the text it holds: listed, and judged
    as that text edited in would be (arguments that changed do not verify)."""
    with open_store(sqlite_url, clock=clock) as store:
        store.setup()
        gate = app(store, keyring=Keyring.generate(), clock=clock)
        try:
            pending = gate.call("refund_order", REFUND, context("m1"))
            assert isinstance(pending, Pending)
            path = sqlite_url.removeprefix("sqlite:///")
            with sqlite3.connect(path) as raw:
                raw.execute("DROP TRIGGER IF EXISTS eg_approvals_no_update")  # none: it is mutable
                raw.execute(f"UPDATE eg_approvals SET {column} = ?", (b'{"amount": 1}',))
            [card] = gate.pending()
            assert card.approval_id == pending.approval_id
            assert (TAMPERED_WARNING in card.warnings) is (column == "args_json")
            row = store.get_approval(pending.approval_id)
            assert row is not None
            assert getattr(row, column) == '{"amount": 1}'
            [listed] = store.approvals(status="pending")
            assert getattr(listed, column) == '{"amount": 1}'
        finally:
            gate.close()


def test_the_first_read_of_a_store_does_not_wait_for_a_writer(sqlite_url: str) -> None:
    """`reading()` begins DEFERRED so that it never waits for the write lock (WAL: readers and
    the writer do not block each other), but the schema check that a store's first operation
    runs began IMMEDIATE: a reviewer's `pending` or the inbox waited for a long writer (a
    retention run, an upgrade) up to the busy timeout, then failed "database is locked"."""
    with open_store(sqlite_url) as store:
        store.setup()
        store.run("k", HASH, lambda: 1)
    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process's long write transaction
    try:
        reader = open_store(sqlite_url)
        # no waiting in this test: a statement that needs the write lock fails at once
        sa.event.listen(reader.engine, "connect", lambda c, _: c.execute("PRAGMA busy_timeout=0"))
        try:
            assert reader.approvals() == []
            record = reader.get("k")
            assert record is not None
            assert record.result == 1
        finally:
            reader.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


@pytest.mark.parametrize("driver", ["aiosqlite", "pysqlcipher", "nosuchdriver"])
def test_a_sqlite_url_naming_another_driver_is_refused_as_a_store_error(sqlite_url: str, driver: str) -> None:
    """`postgresql+psycopg2://` is refused naming the driver to use; `sqlite+aiosqlite://` (an
    async stack's usual URL) opened and then failed at its first statement with SQLAlchemy's
    MissingGreenlet, and another driver with a raw ModuleNotFoundError or NoSuchModuleError."""
    url = sqlite_url.replace("sqlite://", f"sqlite+{driver}://", 1)
    with pytest.raises(StoreError, match=rf"sqlite:///\.\.\. \(got sqlite\+{driver}\)"):
        open_store(url)
    assert not os.path.exists(sqlite_url.removeprefix("sqlite:///"))  # nothing created
