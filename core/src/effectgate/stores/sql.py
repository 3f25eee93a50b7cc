"""The one SQL implementation of the store, for SQLite and PostgreSQL alike.

`SQLStore` implements the idempotency primitives of `base.IdempotencyStore` and the approval
ledger's primitives that the gate composes into its transactions. Dialect differences live in
`_dialect.py`; this module never branches on the database.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from .._clock import SYSTEM_CLOCK, Clock
from .._json import detail_json
from ..errors import StoreError
from . import _checkouts, _dialect, _upgrade
from . import _queries as Q
from . import _statements as S
from ._aggregates import AggregateSQL
from ._chain import ChainSQL
from ._checkouts import Checkouts, Held
from ._memory import refuse_unusable, shown
from ._reading import ReadingSQL
from ._redaction_sql import RedactionSQL
from ._together import TogetherSQL
from .base import IdempotencyRecord, IdempotencyStore, Status, unmarked
from .records import (
    APPEND_ONLY,
    PERSONAL,
    READ_COLUMNS,
    SCHEMA_VERSION,
    ApprovalRow,
    DecisionRow,
    RuleRow,
)

_UNBUILT = object()  # `SQLStore._q`: a statement not built yet

#: Read records written by one INSERT (14 parameters each: 896, under every SQLite's limit).
READS_PER_STATEMENT = 64


def open_store(
    url: str = "sqlite:///effectgate.db", *, clock: Clock | None = None, pool_size: int | None = None
) -> SQLStore:
    """Open (not create) a store; call `setup()` once to create or check the schema. `pool_size`:
    connections kept open (default 8 PostgreSQL, 5 SQLite): at least the threads using it at once."""
    return SQLStore(_dialect.make_engine(url, pool_size=pool_size), clock=clock or SYSTEM_CLOCK, url=url)


class SQLStore(AggregateSQL, ChainSQL, RedactionSQL, ReadingSQL, TogetherSQL, IdempotencyStore):
    """Approvals, decisions, intent keys, executions, events and idempotency records."""

    def __init__(self, engine: Engine, *, clock: Clock = SYSTEM_CLOCK, url: str = "") -> None:
        self.engine = engine
        self.clock = clock
        self.url = url
        self._ready = False
        self._stmts: dict[tuple[Any, ...], Any] = {}
        self._texts: dict[str, str] = {}
        self._checkouts = Checkouts(engine)

    def _q(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """A statement built once per shape and reused: SQLAlchemy memoizes a statement's cache key,
        so the hot path skips building it and its key. Every value is a bound parameter."""
        stmt = self._stmts.get(key, _UNBUILT)
        if stmt is _UNBUILT:  # a statement the dialect has none of (None) is kept too
            stmt = self._stmts[key] = build()
        return stmt

    def _x(self, conn: Connection, sql: str, params: Mapping[str, Any]) -> Any:
        """Run a statement of `_statements` (plain SQL, `:name` placeholders) on the driver's
        connection inside `conn`'s transaction; a cursor (`_dialect.run`)."""
        text = self._texts.get(sql)
        if text is None:
            text = self._texts[sql] = _dialect.driver_sql(conn, sql)
        driver = self._checkouts.cursors.get(conn)
        if driver is None:
            return _dialect.run(conn, text, params)
        try:  # `_dialect.run` with a driver, inline: a call less on every statement
            return driver.execute(text, params)
        except Exception as exc:
            _dialect._raise(conn, exc, text, params)

    # -- lifecycle

    def setup(self) -> None:
        """Create the tables (idempotent), check or record the schema version: one of an older version
        this release knows upgraded in place (`_upgrade.py`), any other refused, nothing written."""
        refuse_unusable(self.engine.url, self._where(), create=True)
        with self.engine.begin() as conn:
            # Concurrent set-ups queue on one lock and create the tables inside it (PostgreSQL DDL
            # is transactional); create_all's check-then-create would otherwise collide.
            self.lock(conn, "effectgate:setup")
            found = None
            if sa.inspect(conn).has_table(Q.T_VERSION.name):
                row = conn.execute(sa.select(Q.T_VERSION.c.version).where(Q.T_VERSION.c.id == 1)).first()
                found = None if row is None else int(row.version)
            if found is not None and found != SCHEMA_VERSION:
                _upgrade.upgrade(conn, found, SCHEMA_VERSION, where=self._where())
            SQLModel.metadata.create_all(conn, tables=list(Q.ALL_TABLES))
            _upgrade.indexes(conn)
            values = {"id": 1, "version": SCHEMA_VERSION, "applied_at": self.clock.now()}
            if found is not None and found != SCHEMA_VERSION:
                conn.execute(sa.update(Q.T_VERSION).where(Q.T_VERSION.c.id == 1).values(**values))
                _dialect.append_only_ddl(conn, APPEND_ONLY, PERSONAL)
            elif conn.execute(_dialect.insert_if_absent(conn, Q.T_VERSION, "id"), values).first():
                _dialect.append_only_ddl(conn, APPEND_ONLY, PERSONAL)
        self._ready = True

    def _refuse_version(self, version: int) -> None:
        if version < SCHEMA_VERSION and version in _upgrade.STEPS:
            raise StoreError(
                f"the database at {self._where()} has effectgate schema version {version}; run "
                f"`effectgate setup` (or store.setup()) once to upgrade it in place to {SCHEMA_VERSION}"
            )
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"the database at {self._where()} has effectgate schema version {version}; this "
                f"effectgate (schema {SCHEMA_VERSION}) neither reads nor writes it. Use the effectgate "
                "release that created it, or start a new database"
            )

    def _where(self) -> str:
        try:
            return shown(sa.engine.make_url(self.url)) if self.url else "?"
        except sa.exc.ArgumentError:
            return "?"

    def check(self) -> None:
        """Refuse (StoreError) a database without the effectgate schema or of another version
        (every transaction runs this once per store before its first statement)."""
        if self._ready:
            return
        refuse_unusable(self.engine.url, self._where(), create=False)  # never create the file
        # read-only (SQLite: DEFERRED): the check waits for no writer, as `reading` does not
        with self.engine.connect().execution_options(**{_dialect.READONLY: True}) as conn:
            self._check(conn)
            conn.rollback()

    def _check(self, conn: Connection) -> None:
        try:
            row = conn.execute(self._q(("version",), lambda: sa.select(Q.T_VERSION.c.version))).first()
        except sa.exc.DBAPIError as exc:
            if not Q._no_schema(exc):
                raise
            row = None
        if row is None:
            raise StoreError(
                f"no effectgate schema at {self._where()}: run `effectgate setup` or call store.setup()"
            )
        self._refuse_version(int(row.version))
        self._ready = True

    def close(self) -> None:
        self._checkouts.close()

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connected(self, *, begin: bool) -> AbstractContextManager[Connection]:
        """A connection (`Held`) in a write transaction on the driver (`begin`), or each statement
        committing by itself; while its statements are observed, SQLAlchemy's (`_observed`)."""
        return Held(self, begin)

    @contextmanager
    def _observed(self) -> Iterator[Connection]:
        """`_connected` while something listens to the engine's statements (`_dialect.observed`)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def transaction(self) -> AbstractContextManager[Connection]:
        return self._connected(begin=True)

    def _single(self) -> AbstractContextManager[Connection]:
        """A connection for one statement that commits by itself (see `_connected`)."""
        return self._connected(begin=False)

    def reading(self) -> AbstractContextManager[Connection]:
        """A read-only transaction (SQLite: DEFERRED, so it never waits for the write lock)."""
        return _checkouts.reading(self)

    def lock(self, conn: Connection, name: str) -> None:
        _dialect.lock_name(conn, name)

    # -- idempotency primitives

    def _insert_claim(self, conn: Connection, values: dict[str, Any]) -> bool:
        return self._x(conn, S.CLAIM, values).fetchone() is not None

    def _load(self, conn: Connection, key: str) -> IdempotencyRecord | None:
        row = self._x(conn, S.LOAD, {"p_key": key}).fetchone()
        return None if row is None else S.record_of(row)

    def _transition(
        self,
        conn: Connection,
        key: str,
        *,
        from_status: tuple[Status, ...],
        owner: str | None = None,
        lease_expired_before: float | None = None,
        values: dict[str, Any],
    ) -> IdempotencyRecord | None:
        keys = tuple(values)  # in the caller's order (not sorted): one statement per call site
        by_owner, lease_expired = owner is not None, lease_expired_before is not None
        sql = self._q(
            ("transition", from_status, by_owner, lease_expired, keys),
            lambda: S.transition(from_status, by_owner=by_owner, lease_expired=lease_expired, keys=keys),
        )
        params = {"p_key": key, "p_owner": owner, "p_before": lease_expired_before}
        for k, v in values.items():  # `S.no_nul`, inline: every value of a hot write
            params["v_" + k] = v.replace("\x00", "\ufffd") if type(v) is str and "\x00" in v else v
        row = self._x(conn, sql, params).fetchone()
        return None if row is None else S.record_of(row)

    def idempotency_records(
        self, *, status: str | None = None, unreadable: list[str] | None = None
    ) -> list[IdempotencyRecord]:
        records: list[IdempotencyRecord] = []
        with self.reading() as conn:
            q = sa.select(Q.T_IDEMPOTENCY.c.key).order_by(Q.T_IDEMPOTENCY.c.created_at)
            for (key,) in conn.execute(q.where(Q.T_IDEMPOTENCY.c.status == status) if status else q):
                try:
                    records += filter(None, [self._load(conn, key)])
                except StoreError:  # edited outside effectgate (`S.record_of`)
                    if unreadable is None:
                        raise
                    unreadable.append(key)
        return records

    # -- approval ledger primitives (inside the gate's transactions)

    def _approval(self, conn: Connection, sql: str, params: Mapping[str, Any]) -> ApprovalRow | None:
        row = self._x(conn, sql, params).fetchone()
        return None if row is None else S.approval_of(row)

    def approval(self, conn: Connection, approval_id: str) -> ApprovalRow | None:
        return self._approval(conn, S.APPROVAL, {"p_id": approval_id}) if S.possible_id(approval_id) else None

    def locked_approval(self, conn: Connection, approval_id: str) -> ApprovalRow | None:
        """The approval read under its subject's lock, taken by the approval's id (one read), or None."""
        sql = self._q(("subject_lock",), lambda: _dialect.subject_lock_sql(conn))
        if (
            sql is not None
            and S.possible_id(approval_id)
            and self._x(conn, sql, {"p_id": approval_id}).fetchone() is None
        ):
            return None
        return self.approval(conn, approval_id)

    def approval_for_key(self, conn: Connection, key: str) -> ApprovalRow | None:
        return self._approval(conn, S.APPROVAL_FOR_KEY, {"p_key": key})

    def key_version(self, conn: Connection, key: str) -> int | None:
        """The approval version an intent key was recorded against."""
        row = self._x(conn, S.KEY_VERSION, {"p_key": key}).fetchone()
        return None if row is None else S.version_of(key, row[0])

    def pending_of_session(self, conn: Connection, session_id: str) -> list[ApprovalRow]:
        """The session's pending approvals, lapsed or not, newest first (what propose needs)."""
        rows = self._x(conn, S.PENDING_OF_SESSION, {"p_session": session_id}).fetchall()
        return [S.approval_of(r) for r in rows]

    def in_flight_elsewhere(
        self, conn: Connection, subject_key: str, session_id: str, now: float
    ) -> ApprovalRow | None:
        """Another session's approval on this subject pending, or granted and usable or presented."""
        params = {"p_subject": subject_key, "p_session": session_id, "p_now": now}
        return self._approval(conn, S.IN_FLIGHT_ELSEWHERE, params)

    def approvals_due(self, conn: Connection, now: float) -> list[ApprovalRow]:
        """Pending approvals whose deadline has passed."""
        return [S.approval_of(r) for r in self._x(conn, S.APPROVALS_DUE, {"p_now": now}).fetchall()]

    def approvals_expiring(self, conn: Connection, now: float, until: float) -> list[ApprovalRow]:
        """Pending approvals still open at `now` whose deadline falls at or before `until`."""
        stmt = self._q(("expiring",), Q.approvals_expiring)
        return [Q._approval_of(r) for r in conn.execute(stmt, {"p_now": now, "p_until": until})]

    def has_event(self, conn: Connection, kind: str, approval_id: str, version: int) -> bool:
        """Whether an event of `kind` is recorded for this approval version (read in `conn`)."""
        params = {"p_kind": kind, "p_id": approval_id, "p_version": version}
        return conn.execute(self._q(("has_event",), Q.has_event), params).first() is not None

    def subject_history(
        self, conn: Connection, tool: str, subject_key: str, exclude: str | None
    ) -> list[ApprovalRow]:
        q = sa.select(Q.T_APPROVALS).where(
            Q.T_APPROVALS.c.tool == tool, Q.T_APPROVALS.c.subject_key == subject_key
        )
        if exclude is not None:
            q = q.where(Q.T_APPROVALS.c.id != exclude)
        return [Q._approval_of(r) for r in conn.execute(q.order_by(Q.T_APPROVALS.c.created_at))]

    def insert_approval(self, conn: Connection, row: ApprovalRow) -> None:
        self._x(conn, S.INSERT_APPROVAL, row.model_dump())

    def update_approval(
        self,
        conn: Connection,
        approval_id: str,
        *,
        expect_status: Sequence[str],
        expect_version: int | None = None,
        values: Mapping[str, Any],
    ) -> bool:
        """Compare-and-set on status (and version); True if the row changed."""
        statuses, keys, with_version = tuple(expect_status), tuple(values), expect_version is not None
        sql = self._q(
            ("update_approval", statuses, with_version, keys),
            lambda: S.update_approval(statuses, with_version=with_version, keys=keys),
        )
        params = {"p_id": approval_id, "p_version": expect_version}
        for k, v in values.items():  # `S.no_nul`, inline: every value of a hot write
            params["v_" + k] = v.replace("\x00", "\ufffd") if type(v) is str and "\x00" in v else v
        return self._x(conn, sql, params).fetchone() is not None

    def add_key(self, conn: Connection, key: str, approval_id: str, version: int, origin: str) -> bool:
        values = {"key": key, "approval_id": approval_id, "version": version, "origin_message_id": origin}
        values["created_at"] = self.clock.now()
        return self._x(conn, S.ADD_KEY, values).fetchone() is not None

    def add_decision(self, conn: Connection, **values: Any) -> None:
        self._x(
            conn,
            S.ADD_DECISION,
            {"grant_round": 0, "reason": None, "seal": "", "at": self.clock.now(), **values}
            | {"reason": S.no_nul(values.get("reason"))},  # a reviewer's text (unsealed)
        )

    def add_rules(self, conn: Connection, rules: Sequence[tuple[str, str, str]]) -> None:
        """Record (fingerprint, kind, canonical JSON) rules unless already present."""
        stmt = self._q(("add_rule",), lambda: _dialect.insert_if_absent(conn, Q.T_RULES, "fingerprint"))
        now = self.clock.now()
        for fingerprint, kind, body in rules:
            conn.execute(stmt, {"fingerprint": fingerprint, "kind": kind, "body_json": body, "at": now})

    def rules(self) -> dict[str, RuleRow]:
        with self.reading() as conn:
            rows = conn.execute(sa.select(Q.T_RULES))  # a blob key (SQLite, edited in) names no rule
            return {r.fingerprint: RuleRow(**r._mapping) for r in rows if type(r.fingerprint) is str}

    def decisions(self, conn: Connection, approval_id: str, version: int | None = None) -> list[DecisionRow]:
        sql = S.DECISIONS if version is None else S.DECISIONS_OF_VERSION
        return [
            S.decision_of(r)
            for r in self._x(conn, sql, {"p_id": approval_id, "p_version": version}).fetchall()
        ]

    def append_events(self, conn: Connection, events: Sequence[Mapping[str, Any]]) -> None:
        """Append audit events. One driver-level executemany: read logs arrive in batches of
        hundreds, and compiling an ORM-style insert per row would cost more than the read itself."""
        if not events:
            return
        rows: list[list[Any]] = []
        columns, at = Q._EVENT_COLUMNS, Q._DETAIL_AT
        for e in events:
            row = list(map(e.get, columns))
            detail = row[at]
            if not isinstance(detail, str):  # a detail keyed like a redaction marker is not one
                row[at] = unmarked(detail_json(detail) if detail else "{}")
            rows.append(row)
        sql = self._q(("events",), lambda: _dialect.insert_many_sql(conn, "eg_events", Q._EVENT_COLUMNS))
        _dialect.run_many(conn, sql, rows, driver=self._checkouts.cursors.get(conn))

    def append_reads(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Append read records, each a tuple in `records.READ_COLUMNS` order: 64 rows to a statement
        (one VALUES list: a fifth less CPU per row on SQLite), the rest one executemany."""
        whole, cursor = len(rows) - len(rows) % READS_PER_STATEMENT, self._checkouts.cursors.get(conn)
        if whole:
            sql = self._q(
                ("reads", READS_PER_STATEMENT),
                lambda: _dialect.insert_values_sql(conn, "eg_events", READ_COLUMNS, READS_PER_STATEMENT),
            )
            chunks = [
                list(itertools.chain.from_iterable(rows[i : i + READS_PER_STATEMENT]))
                for i in range(0, whole, READS_PER_STATEMENT)
            ]
            _dialect.run_many(conn, sql, chunks, driver=cursor)
        if whole < len(rows):
            sql = self._q(("reads", 1), lambda: _dialect.insert_many_sql(conn, "eg_events", READ_COLUMNS))
            _dialect.run_many(conn, sql, list(rows[whole:]), driver=cursor)

    def append_execution(self, conn: Connection, **values: Any) -> None:
        row = {**S.EXECUTION_DEFAULTS, "at": self.clock.now(), **values}
        for k, v in values.items():  # `S.no_nul`, inline (the defaults hold no text)
            if type(v) is str and "\x00" in v:
                row[k] = v.replace("\x00", "\ufffd")
        self._x(conn, S.APPEND_EXECUTION, row)
