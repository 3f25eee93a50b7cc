"""Every difference between SQLite and PostgreSQL, each with the reason it exists. Nothing
outside this module may branch on the dialect."""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from ..errors import MissingDependency, StoreError
from ._fork import fork_safe
from ._memory import check_driver, in_memory, shown, sqlite_timeout, unparsed
from .records import SCHEMA_VERSION, SchemaVersionRow, partial_where

READONLY, _WAL_PENDING = "effectgate_readonly", "effectgate_wal_pending"
_PG_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open


def make_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for `url` (`sqlite:///path.db`, `sqlite://`: memory, `postgresql+psycopg://...`),
    `pool_size` the pool's idle connections (`open_store`), beside up to 32 more under load."""
    if pool_size is not None and (type(pool_size) is not int or pool_size < 1):
        raise StoreError(f"pool_size must be a positive integer (got {pool_size!r})")
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StoreError(unparsed(url, exc)) from None
    backend = parsed.get_backend_name()
    check_driver(parsed)  # the one driver the store runs on each database
    partial_where(backend)  # its dialect's alone: a process loads only the dialect it uses
    if backend == "sqlite":
        return _sqlite_engine(parsed, pool_size)
    if backend == "postgresql":
        try:
            import psycopg  # noqa: F401  (the one place the optional driver is imported)
        except ImportError as exc:
            raise MissingDependency("psycopg", "postgres") from exc
        return _postgresql_engine(parsed, pool_size)
    raise StoreError(
        f"unsupported database URL '{shown(parsed)}': use sqlite:///... or postgresql+psycopg://..."
    )


def _postgresql_engine(parsed: sa.engine.URL, pool_size: int | None) -> Engine:
    # No pool_pre_ping: it costs a round trip per transaction. A connection the server dropped
    # fails its first statement before anything is written (the caller may retry), and
    # SQLAlchemy then discards the pool's stale connections. hide_parameters: see SQLite's.
    url = parsed.set(drivername="postgresql+psycopg")
    engine = fork_safe(sa.create_engine(url, pool_size=pool_size or 8, max_overflow=32, hide_parameters=True))

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # As with SQLite (below), autocommit and BEGIN is ours: one atomic statement (a claim, a
        # completion) runs without BEGIN and COMMIT (`SQLStore._single`). READ COMMITTED whatever
        # the server's default: a waiter on a lock (`lock_name`) reads what its holder committed.
        dbapi_conn.autocommit = True
        dbapi_conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED")

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # none when `driver_begin` began one; a reading is one snapshot, as SQLite's (not per statement)
        driver: Any = conn.connection.driver_connection
        if driver.info.transaction_status == _PG_IDLE:
            readonly = conn.get_execution_options().get(READONLY, False)
            run(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if readonly else "BEGIN")

    return engine


def _sqlite_engine(parsed: sa.engine.URL, pool_size: int | None) -> Engine:
    memory = in_memory(parsed)  # one shared connection, or each checkout could see another database
    wait = sqlite_timeout(parsed)  # the URL's `?timeout=` (our connect_args would override it)
    # hide_parameters: an error's text is printed, logged and recorded, so never with its values
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": wait}}
    kwargs["hide_parameters"] = True
    if memory:
        kwargs["poolclass"] = StaticPool
    elif pool_size is not None:
        kwargs |= {"pool_size": pool_size, "max_overflow": 32}
    engine = sa.create_engine(parsed, **kwargs)
    if not memory:  # one shared in-memory connection: a forked child has its own copy of it
        fork_safe(engine)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite's own transaction handling begins lazily and never with IMMEDIATE; we
        # take control of BEGIN (below) so the whole propose/approve/claim runs under one lock.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not memory and not _sqlite_wal(cur):
            _record.info[_WAL_PENDING] = True  # not ours yet: `_on_checkin` tries again
        # FULL: a committed approval or claim survives power loss, not only a process crash.
        cur.execute("PRAGMA synchronous=FULL")
        # Writers queue for the lock instead of failing at once with "database is locked".
        cur.execute(f"PRAGMA busy_timeout={round(wait * 1000)}")
        cur.close()

    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn: Any, record: Any) -> None:
        # A database `setup` just created (or upgraded) in this process becomes WAL when the
        # connection that did it returns to the pool, outside any transaction. A dict lookup per
        # checkin; a statement only for a connection opened on a database that was not ours.
        if record.info.get(_WAL_PENDING) and dbapi_conn is not None and not dbapi_conn.in_transaction:
            cur = dbapi_conn.cursor()
            with contextlib.suppress(Exception):  # busy, read-only: the next checkin tries again
                if _sqlite_wal(cur):
                    del record.info[_WAL_PENDING]
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front: two writers cannot both read "absent" and
        # then deadlock upgrading their locks. Read-only work begins DEFERRED.
        readonly = conn.get_execution_options().get(READONLY, False)
        driver: Any = conn.connection.driver_connection
        if not driver.in_transaction:  # see `driver_begin`
            run(conn, "BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def _sqlite_wal(cur: Any) -> bool:
    """Put a file database in WAL journal mode (readers never block the writer; commits cost
    ~30 us instead of ~1.5 ms) if it is an effectgate database of this schema version, and say
    whether it is now WAL. The mode is persistent, written in the file's header: a database that
    is not ours (no schema, another version) is refused on open and must not be changed, so it is
    only read here. One statement on a database already WAL (every effectgate one after the first
    connection); run once per connection, never per transaction."""
    if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return True
    table = SchemaVersionRow.__tablename__
    found = cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    if found.fetchone() is None:
        return False
    if cur.execute(f"SELECT 1 FROM {table} WHERE version = ?", (SCHEMA_VERSION,)).fetchone() is None:
        return False
    with contextlib.suppress(Exception):  # read-only (a copy opened with mode=ro), busy: not yet
        return str(cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower() == "wal"
    return False


def observed(conn: Connection | Engine) -> bool:
    """Whether anything listens to this connection's (engine's) statements (cursor events)."""
    dispatch = conn.engine.dispatch  # the engine's listeners (the connection's joined view costs more)
    return bool(dispatch.before_cursor_execute) or bool(dispatch.after_cursor_execute)


def direct(conn: Connection) -> Any:
    """`conn`'s driver connection when nothing observes its statements (`observed`), else None:
    what `run` and `run_many` decide per statement, for a caller to decide once per checkout."""
    return None if observed(conn) else conn.connection.driver_connection


def run(conn: Connection, sql: str, params: Mapping[str, Any] | None = None, *, driver: Any = None) -> Any:
    """Execute plain driver-level `sql` (in the driver's paramstyle, see `driver_sql`) in `conn`'s
    transaction; a DBAPI cursor (or, when observed, a result) with fetchone/fetchall. The hot
    transactions run their statements on the driver's connection: SQLAlchemy's execution machinery
    cost more CPU per statement than SQLite took to run it (both drivers cache the statement). When
    something listens to cursor events the statement goes through SQLAlchemy, so they still see
    every statement. `driver`: `direct(conn)`, or a cursor of it that the caller reuses."""
    if driver is None and (driver := direct(conn)) is None:
        return conn.exec_driver_sql(sql, None if params is None else dict(params))
    try:
        return driver.execute(sql, params) if params is not None else driver.execute(sql)
    except Exception as exc:
        _raise(conn, exc, sql, params)


def _raise(conn: Connection, exc: Exception, sql: str, params: Any) -> NoReturn:
    from ._checkouts import raise_failure  # the error path only (`_checkouts` imports this module)

    raise_failure(conn, exc, sql, params)


def run_many(conn: Connection, sql: str, rows: Sequence[Sequence[Any]], *, driver: Any = None) -> None:
    """Execute driver-level `sql` once per row of positional parameters, as `run` does, on a cursor
    (`driver`, or a new one): executemany for many rows (psycopg pipelines them in one round trip)."""
    if driver is None:
        if (driver := direct(conn)) is None:
            conn.exec_driver_sql(sql, [tuple(r) for r in rows])
            return
        driver = driver.cursor()
    try:
        if len(rows) == 1:
            driver.execute(sql, rows[0])
        else:
            driver.executemany(sql, rows)
    except Exception as exc:
        _raise(conn, exc, sql, list(rows))


def driver_begin(conn: Connection, driver: Any) -> None:
    """Begin a write transaction on `conn` (checked out, not begun) on its `driver` connection:
    BEGIN (IMMEDIATE on SQLite, see `_on_begin`); `driver_end` commits or rolls it back. It is
    `engine.begin()` without SQLAlchemy's transaction machinery, which cost more CPU than the
    transaction's statements. A statement executed through SQLAlchemy inside it begins
    SQLAlchemy's own transaction, whose BEGIN the `begin` listener skips (the driver's is open),
    and which then has nothing left to roll back when the connection closes."""
    run(conn, "BEGIN IMMEDIATE" if conn.dialect.name == "sqlite" else "BEGIN", driver=driver)


def driver_end(conn: Connection, driver: Any, *, commit: bool) -> None:
    """COMMIT (`commit`) or ROLLBACK the transaction `driver_begin` began; a failure raised as
    SQLAlchemy's error (`_raise`). SQLite's COMMIT is an executed statement, which sqlite3 keeps
    prepared; its `commit()` prepares one afresh (about 5 us of CPU, four per approved call)."""
    try:
        if commit:
            if conn.dialect.name == "sqlite":
                driver.execute("COMMIT")
            else:
                driver.commit()
        else:
            driver.rollback()
    except Exception as exc:
        _raise(conn, exc, "COMMIT" if commit else "ROLLBACK", None)


def statement_runner(conn: Connection, driver: Any) -> Any:
    """What runs the statements of a kept connection (`_checkouts`): one psycopg cursor for its
    life; sqlite3's connection itself (a kept cursor could hold an unfinished statement open)."""
    return driver.cursor() if conn.dialect.name == "postgresql" else driver


def idle(conn: Connection, driver: Any) -> bool:
    """Whether a checked-out connection is open, valid, in no SQLAlchemy transaction and in none
    on the driver (psycopg's libpq status; sqlite3's flag): as the pool's return leaves one."""
    if conn.closed or conn.invalidated or conn.get_transaction() is not None:
        return False
    pg = conn.dialect.name == "postgresql"
    return bool(driver.pgconn.transaction_status == _PG_IDLE) if pg else not driver.in_transaction


_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def driver_sql(conn: Connection, sql: str) -> str:
    """`sql` written with `:name` placeholders, in the driver's paramstyle: sqlite3 takes `:name`
    as written, psycopg wants `%(name)s` (the statements hold no `%` and no `::` cast)."""
    if conn.dialect.name == "postgresql":
        return _NAMED.sub(r"%(\1)s", sql)
    return sql


def subject_lock_sql(conn: Connection) -> str | None:
    """A statement that takes `lock_name(conn, "subject:" + subject_key)` for the approval
    `:p_id`, reading the key in the database (one round trip, no read of the row before the
    lock); None where `lock_name` has nothing to do (SQLite)."""
    if conn.dialect.name == "postgresql":
        return driver_sql(
            conn,
            "SELECT pg_advisory_xact_lock(hashtextextended('subject:' || subject_key, 0)) "
            "FROM eg_approvals WHERE id = :p_id",
        )
    return None


def insert_if_absent(conn: Connection, table: sa.Table, key: str) -> Any:
    """INSERT ... ON CONFLICT (key) DO NOTHING RETURNING key: one atomic claim (the row's values its
    parameters). Whether a row came back says: `rowcount` is not portable (psycopg reports -1)."""
    insert = importlib.import_module(f"sqlalchemy.dialects.{conn.dialect.name}").insert  # loaded already
    return insert(table).on_conflict_do_nothing(index_elements=[key]).returning(table.c[key])


def insert_many_sql(conn: Connection, table: str, columns: tuple[str, ...]) -> str:
    """A plain INSERT of one row, for executemany."""
    return insert_values_sql(conn, table, columns, 1)


def insert_values_sql(conn: Connection, table: str, columns: tuple[str, ...], rows: int) -> str:
    """A plain INSERT of `rows` rows in one VALUES list, for one flat list of their parameters:
    sqlite3 takes `?` placeholders, psycopg `%s`."""
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    one = f"({', '.join([mark] * len(columns))})"
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([one] * rows)}"


def byte_order(conn: Connection) -> str:
    """The collation that makes ORDER BY compare text by code points, as Python compares strings:
    SQLite's default BINARY already does; PostgreSQL's may be a locale's, so "C" is named."""
    return "" if conn.dialect.name == "sqlite" else ' COLLATE "C"'


def stream(conn: Connection, sql: str, *, batch: int) -> Iterator[tuple[Any, ...]]:
    """Rows of a read query as plain DBAPI tuples, `batch` at a time (no Row objects: the audit
    reads every row of the large tables), from a server-side cursor on PostgreSQL. A driver error
    (a statement timeout) is raised as SQLAlchemy's, as `run` raises it (never the driver's own)."""
    dbapi: Any = conn.connection.dbapi_connection  # open: `conn` is in a transaction
    pg = conn.dialect.name == "postgresql"
    cursor = dbapi.cursor(name=f"eg_stream_{id(sql)}") if pg else dbapi.cursor()  # PG: server-side
    try:
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch):
                yield from rows
        except conn.dialect.loaded_dbapi.Error as exc:
            _raise(conn, exc, sql, None)
    finally:
        cursor.close()


def lock_name(conn: Connection, name: str) -> None:
    """Serialise transactions that touch the same subject or session. SQLite: nothing to do,
    BEGIN IMMEDIATE holds the only write lock. PostgreSQL: a transaction-scoped advisory lock on
    a 64-bit hash of the name; row locks cannot cover "no pending row exists yet"."""
    if conn.dialect.name == "postgresql":
        run(conn, "SELECT pg_advisory_xact_lock(hashtextextended(%(n)s, 0))", {"n": name})


REDACTED_PREFIX = '{"$redacted":'


def is_redacted(text: Any) -> bool:
    """Whether a stored value is a redaction marker (starts like one: only `redact` writes such)."""
    return isinstance(text, str) and text.startswith(REDACTED_PREFIX)


def append_only_ddl(
    conn: Connection, tables: tuple[str, ...], redactable: Mapping[str, tuple[str, ...]]
) -> None:
    """Triggers that refuse UPDATE and DELETE on the audit tables, with one exception: a column
    of `redactable[table]` (personal data) may be overwritten with a redaction marker (text that
    starts with `REDACTED_PREFIX`) while every other column keeps its value. Replaces the
    triggers an older schema installed (PostgreSQL: those that differ)."""
    for table in tables:
        personal = redactable.get(table, ())
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_update")
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_delete")
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )
            columns = [r[1] for r in conn.exec_driver_sql(f"PRAGMA table_info({table})")]
            allowed = " AND ".join(
                f"(NEW.{c} IS OLD.{c} OR substr(NEW.{c}, 1, {len(REDACTED_PREFIX)}) = '{REDACTED_PREFIX}')"
                if c in personal
                else f"NEW.{c} IS OLD.{c}"
                for c in columns
            )
            when = f" WHEN NOT ({allowed})" if personal else ""
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table}{when} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )
        else:
            # sa.text, not exec_driver_sql: psycopg would read plpgsql's '%' as a placeholder.
            # The trigger's arguments are the table's personal columns.
            conn.execute(
                sa.text(
                    "CREATE OR REPLACE FUNCTION eg_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    "DECLARE c text; n jsonb; o jsonb; BEGIN "
                    "IF TG_OP = 'DELETE' OR TG_NARGS = 0 THEN "
                    "RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END IF; "
                    "n := to_jsonb(NEW); o := to_jsonb(OLD); "
                    "FOREACH c IN ARRAY TG_ARGV LOOP "
                    "IF (n ->> c) IS DISTINCT FROM (o ->> c) "
                    f"AND left(n ->> c, {len(REDACTED_PREFIX)}) IS DISTINCT FROM '{REDACTED_PREFIX}' THEN "
                    "RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END IF; "
                    "n := n - c; o := o - c; END LOOP; "
                    "IF n IS DISTINCT FROM o THEN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END IF; "
                    "RETURN NEW; END $$"
                )
            )
            # this release's trigger is kept: replacing it locks the table (an upgrade deadlocked so)
            on = f"tgrelid = '{table}'::regclass AND tgname = '{table}_append_only'"
            have = conn.exec_driver_sql(f"SELECT tgargs FROM pg_trigger WHERE {on}").scalar()
            if have is not None and bytes(have).split(b"\0")[:-1] == [c.encode() for c in personal]:
                continue
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            args = ", ".join(f"'{c}'" for c in personal)
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION eg_append_only({args})"
            )


def utc_day(conn: Connection, column: str) -> str:
    """SQL for the UTC day of an epoch-seconds column, as whole days since 1970-01-01 (the floor,
    as `datetime.fromtimestamp(t, UTC).date()` counts them). PostgreSQL: floor(), held within
    +-1e15 days so its cast cannot fail (an edited row's time). SQLite may lack floor(): its cast
    truncates toward zero, less one for a time before the epoch that is not on a day boundary."""
    if conn.dialect.name == "postgresql":
        return f"CAST(floor(LEAST(GREATEST({column} / 86400.0, -1e15), 1e15)) AS BIGINT)"
    day = f"CAST({column} / 86400.0 AS INTEGER)"
    return f"({day} - ({column} < 0 AND {column} / 86400.0 <> {day}))"


def json_field(conn: Connection, column: str, key: str) -> str:
    """SQL for a top-level field of a JSON text column, as text (NULL when absent). The columns are
    TEXT on both databases (the same bytes everywhere): SQLite reads them with json_extract (JSON1,
    built in), PostgreSQL casts them to json first. `key` is a constant of the caller's, never input."""
    if conn.dialect.name == "postgresql":
        return f"(CAST({column} AS json) ->> '{key}')"
    return f"json_extract({column}, '$.{key}')"
