"""Round 7 of the store review: schema versions, URLs, and SQLite/PostgreSQL differences."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate.cli._store import _open as cli_open
from effectgate.errors import MissingKeyring, StoreError
from effectgate.stores import SQLStore, open_store
from effectgate.testing import FakeClock
from effectgate.tokens import keyring_for
from tests.conformance.stores import _advisory_lock_awaited, _append_execution, approval_row


@pytest.mark.postgres
def test_a_password_in_the_urls_query_is_never_printed(pg_url: str, clock: FakeClock) -> None:
    """libpq reads a password from a URL's query (`?password=...`), and SQLAlchemy's
    `hide_password` hides only the user's: the store's errors named the database with it."""
    url = f"{pg_url}?password=s3cr3t&sslpassword=k3y"
    store = open_store(url, clock=clock)
    try:
        with pytest.raises(StoreError, match="no effectgate schema") as caught:
            store.check()
        assert "s3cr3t" not in str(caught.value)
        assert "k3y" not in str(caught.value)
    finally:
        store.close()
    with pytest.raises(StoreError, match="unsupported database URL") as refused:
        open_store("mysql://eve@db/x?password=s3cr3t")
    assert "s3cr3t" not in str(refused.value)


def _events_at(store: SQLStore, last_id: int) -> None:
    """Make the next event id `last_id + 1`, as a ledger that has logged that many events."""
    with store.transaction() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('eg_events', 'id'), {last_id})")
        else:
            values = f"({last_id}, 0, 'x', '{{}}')"
            conn.exec_driver_sql(f"INSERT INTO eg_events (id, at, kind, detail_json) VALUES {values}")


def test_the_event_log_grows_past_two_billion_rows(store: SQLStore, clock: FakeClock) -> None:
    """A read is an event: a busy gate logs billions. SQLite's ids are 64-bit; PostgreSQL's were
    SERIAL (int4) until schema 4, so the 2^31st event failed the operation that logged it, and
    every one after."""
    _events_at(store, 2**31 - 1)
    event = {"at": clock.now(), "kind": "proposed", "approval_id": "a-1", "version": 1, "tool": "pay"}
    with store.transaction() as conn:
        store.append_events(conn, [event])
    assert [e.id for e in store.events(kind="proposed")] == [2**31]


def test_a_password_in_the_urls_query_is_not_printed_asking_for_a_keyring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    with pytest.raises(MissingKeyring, match="no keyring for") as caught:
        keyring_for("postgresql+psycopg://eve@db/x?password=s3cr3t")
    assert "s3cr3t" not in str(caught.value)


@pytest.mark.postgres
def test_a_database_whose_default_isolation_is_repeatable_read_still_serialises_a_subject(
    pg_url: str, clock: FakeClock
) -> None:
    """The subject lock serialises proposals only if what the waiter reads after taking it is
    what the holder committed (READ COMMITTED). A database, role or server whose default is
    REPEATABLE READ (`ALTER DATABASE ... SET default_transaction_isolation`) made the waiter read
    the snapshot of its first statement, the lock itself: it saw no approval in flight on the
    subject and proposed a second one."""
    name = sa.engine.make_url(pg_url).database
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {name} SET default_transaction_isolation TO 'repeatable read'")
    admin.dispose()
    store = open_store(pg_url, clock=clock)
    store.setup()
    subject = "order:1042"

    def propose(approval_id: str, session_id: str) -> None:
        with store.transaction() as conn:
            store.lock(conn, f"subject:{subject}")
            if store.in_flight_elsewhere(conn, subject, session_id, clock.now()) is None:
                row = approval_row(approval_id, created_at=clock.now(), session_id=session_id)
                store.insert_approval(conn, row)

    try:
        with store.transaction() as conn:
            store.lock(conn, f"subject:{subject}")
            store.insert_approval(conn, approval_row("first", created_at=clock.now(), session_id="s1"))
            second = threading.Thread(target=propose, args=("second", "s2"))
            second.start()
            assert _advisory_lock_awaited(store), "the second proposal did not wait for the subject lock"
        second.join(timeout=30)
        assert [a.id for a in store.approvals(status="pending")] == ["first"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "form",
    [
        "file:{path}?uri=true",
        "file:{path}?mode=ro&uri=true",
        "file://{path}?uri=true",
        "file:{name}?uri=true",
    ],
)
def test_a_sqlite_uri_url_finds_the_databases_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, form: str
) -> None:
    """SQLite's URI form (`sqlite:///file:PATH?mode=ro&uri=true`: a read-only audit) names the same
    database as `sqlite:///PATH`. Its key file was looked for at `file:PATH.keys`: refused, or with
    `create` a new key beside no database (every seal the ledger holds then failed), and the CLI
    answered that no database was there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    path = tmp_path / "ledger.db"
    store = open_store(f"sqlite:///{path}", clock=clock)
    store.setup()
    store.close()
    key = keyring_for(f"sqlite:///{path}")
    url = "sqlite:///" + form.format(path=path, name=path.name)
    assert keyring_for(url, create=False).current == key.current
    assert keyring_for(url).current == key.current
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db", "ledger.db.keys"]
    opened = cli_open(url)
    try:
        assert opened.approvals() == []
    finally:
        opened.close()


def test_the_history_of_a_subject_with_more_approvals_than_a_statement_takes_parameters(
    store: SQLStore, clock: FakeClock
) -> None:
    """What ran of a subject's approvals (`execution_outcomes`, read at every propose of a tool
    with a `confirm` check and beside every card) was one IN list of all their ids: past the
    database's bound parameters per statement (PostgreSQL 65,535; SQLite's default 32,766) the
    proposal failed, for every call on that subject from then on."""
    if store.engine.dialect.name == "sqlite":

        @sa.event.listens_for(store.engine, "connect")
        def _default_limit(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)  # SQLite's own default

        store.engine.dispose()
    ids = [f"ap-{i:05d}" for i in range(70_000)]
    event = {"at": clock.now(), "kind": "token_used", "approval_id": ids[0], "version": 1}
    with store.transaction() as conn:
        store.append_events(conn, [event])
        _append_execution(store, conn, approval_id=ids[-1])
    with store.reading() as conn:
        assert store.execution_outcomes(conn, ids) == {ids[0]: "presented", ids[-1]: "succeeded"}
