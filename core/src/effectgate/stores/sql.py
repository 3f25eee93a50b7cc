"""The one SQL implementation of the store, for SQLite and PostgreSQL alike.

`SQLStore` implements the idempotency primitives of `base.IdempotencyStore` and the approval
ledger's primitives that the gate composes into its transactions. Dialect differences live in
`_dialect.py`; this module never branches on the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from .._clock import SYSTEM_CLOCK, Clock
from ..errors import StoreError
from . import _dialect
from .base import IdempotencyRecord, IdempotencyStore, Status, from_json
from .records import (
    APPEND_ONLY,
    APPROVAL_COLUMNS,
    DECISION_COLUMNS,
    READ_COLUMNS,
    SCHEMA_VERSION,
    ApprovalRow,
    ApprovalTable,
    DecisionRow,
    DecisionTable,
    EventRow,
    ExecutionRow,
    IdempotencyRow,
    IntentKeyRow,
    RuleRow,
    SchemaVersionRow,
)

T_APPROVALS: sa.Table = ApprovalTable.__table__  # type: ignore[attr-defined]
T_KEYS: sa.Table = IntentKeyRow.__table__  # type: ignore[attr-defined]
T_DECISIONS: sa.Table = DecisionTable.__table__  # type: ignore[attr-defined]
T_EVENTS: sa.Table = EventRow.__table__  # type: ignore[attr-defined]
T_EXECUTIONS: sa.Table = ExecutionRow.__table__  # type: ignore[attr-defined]
T_IDEMPOTENCY: sa.Table = IdempotencyRow.__table__  # type: ignore[attr-defined]
T_VERSION: sa.Table = SchemaVersionRow.__table__  # type: ignore[attr-defined]
T_RULES: sa.Table = RuleRow.__table__  # type: ignore[attr-defined]
ALL_TABLES = (T_VERSION, T_APPROVALS, T_KEYS, T_DECISIONS, T_EVENTS, T_EXECUTIONS, T_IDEMPOTENCY, T_RULES)


_EVENT_COLUMNS = tuple(c.name for c in T_EVENTS.columns if c.name != "id")
_DETAIL_AT = _EVENT_COLUMNS.index("detail_json")


def _approval_of(row: Any) -> ApprovalRow:
    return ApprovalRow(**dict(zip(APPROVAL_COLUMNS, row, strict=True)))


def _decision_of(row: Any) -> DecisionRow:
    return DecisionRow(**dict(zip(DECISION_COLUMNS, row, strict=True)))


def _record_of(m: Any) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=m["key"],
        payload_hash=m["payload_hash"],
        status=m["status"],
        lease_owner=m["lease_owner"],
        lease_expires_at=m["lease_expires_at"],
        result=from_json(m["result_json"]),
        error=m["error"],
        provider_ref=m["provider_ref"],
        attempts=m["attempts"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


def open_store(url: str = "sqlite:///effectgate.db", *, clock: Clock | None = None) -> SQLStore:
    """Open (not create) a store; call `setup()` once to create or check the schema."""
    return SQLStore(_dialect.make_engine(url), clock=clock or SYSTEM_CLOCK, url=url)


class SQLStore(IdempotencyStore):
    """Approvals, decisions, intent keys, executions, events and idempotency records."""

    def __init__(self, engine: Engine, *, clock: Clock = SYSTEM_CLOCK, url: str = "") -> None:
        self.engine = engine
        self.clock = clock
        self.url = url
        self._ready = False
        self._stmts: dict[tuple[Any, ...], Any] = {}

    def _q(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """A statement built once per shape and reused: SQLAlchemy memoizes the cache key of a
        statement object, so the hot path skips construction and cache-key generation (most of
        the gate's CPU per call before this). Every value reaches it as a bound parameter."""
        stmt = self._stmts.get(key)
        if stmt is None:
            stmt = self._stmts[key] = build()
        return stmt

    # -- lifecycle

    def setup(self) -> None:
        """Create the tables (idempotent) and check or record the schema version. A database of
        another schema version is refused before anything is created or written in it."""
        with self.engine.begin() as conn:
            # Concurrent set-ups queue on one lock and create the tables inside it (PostgreSQL DDL
            # is transactional); create_all's check-then-create would otherwise collide.
            self.lock(conn, "effectgate:setup")
            if sa.inspect(conn).has_table(T_VERSION.name):
                row = conn.execute(sa.select(T_VERSION.c.version).where(T_VERSION.c.id == 1)).first()
                if row is not None:
                    self._refuse_version(row.version)
            SQLModel.metadata.create_all(conn, tables=list(ALL_TABLES))
            values = {"id": 1, "version": SCHEMA_VERSION, "applied_at": self.clock.now()}
            if conn.execute(_dialect.insert_if_absent(conn, T_VERSION, "id"), values).first():
                _dialect.append_only_ddl(conn, APPEND_ONLY)
        self._ready = True

    def _refuse_version(self, version: int) -> None:
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"the database at {self._where()} has effectgate schema version {version}; this "
                f"effectgate (schema {SCHEMA_VERSION}) neither reads nor writes it. Use the effectgate "
                "release that created it, or start a new database"
            )

    def _where(self) -> str:
        try:
            return sa.engine.make_url(self.url).render_as_string(hide_password=True) if self.url else "?"
        except sa.exc.ArgumentError:
            return "?"

    def check(self) -> None:
        """Refuse (StoreError) a database without the effectgate schema or of another schema
        version. Every transaction runs this once per store before its first statement."""
        if self._ready:
            return
        with self.engine.connect() as conn:
            self._check(conn)
            conn.rollback()

    def _check(self, conn: Connection) -> None:
        try:
            row = conn.execute(self._q(("version",), lambda: sa.select(T_VERSION.c.version))).first()
        except sa.exc.DBAPIError as exc:
            if not isinstance(exc, sa.exc.OperationalError | sa.exc.ProgrammingError) or _unreachable(exc):
                raise
            raise StoreError(
                f"no effectgate schema at {self._where()}: run `effectgate setup` or call store.setup()"
            ) from exc
        if row is None:
            raise StoreError(
                f"no effectgate schema at {self._where()}: run `effectgate setup` or call store.setup()"
            )
        self._refuse_version(int(row.version))
        self._ready = True

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        if not self._ready:
            self.check()
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A read-only transaction (SQLite: DEFERRED, so it never waits for the write lock)."""
        if not self._ready:
            self.check()
        with self.engine.connect().execution_options(**{_dialect.READONLY: True}) as conn, conn.begin():
            yield conn

    def lock(self, conn: Connection, name: str) -> None:
        _dialect.lock_name(conn, name)

    # -- idempotency primitives

    def _insert_claim(self, conn: Connection, values: dict[str, Any]) -> bool:
        stmt = self._q(("claim",), lambda: _dialect.insert_if_absent(conn, T_IDEMPOTENCY, "key"))
        return conn.execute(stmt, values).first() is not None

    def _load(self, conn: Connection, key: str) -> IdempotencyRecord | None:
        stmt = self._q(
            ("load",), lambda: sa.select(T_IDEMPOTENCY).where(T_IDEMPOTENCY.c.key == sa.bindparam("p_key"))
        )
        row = conn.execute(stmt, {"p_key": key}).first()
        return None if row is None else _record_of(row._mapping)

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
        shape = (
            "transition",
            from_status,
            owner is None,
            lease_expired_before is None,
            tuple(sorted(values)),
        )

        def build() -> Any:
            t = T_IDEMPOTENCY
            cond = [t.c.key == sa.bindparam("p_key"), t.c.status.in_(from_status)]
            if owner is not None:
                cond.append(t.c.lease_owner == sa.bindparam("p_owner"))
            if lease_expired_before is not None:
                cond.append(t.c.lease_expires_at <= sa.bindparam("p_before"))
            return (
                sa.update(t).where(*cond).values({k: sa.bindparam(f"v_{k}") for k in values}).returning(*t.c)
            )

        params = {"p_key": key, "p_owner": owner, "p_before": lease_expired_before}
        params.update({f"v_{k}": v for k, v in values.items()})
        row = conn.execute(self._q(shape, build), params).first()
        return None if row is None else _record_of(row._mapping)

    def idempotency_records(self, *, status: str | None = None) -> list[IdempotencyRecord]:
        with self.reading() as conn:
            q = sa.select(T_IDEMPOTENCY.c.key)
            if status:
                q = q.where(T_IDEMPOTENCY.c.status == status)
            keys = [r.key for r in conn.execute(q.order_by(T_IDEMPOTENCY.c.created_at))]
            return [rec for k in keys if (rec := self._load(conn, k)) is not None]

    # -- approval ledger primitives (inside the gate's transactions)

    @staticmethod
    def _approval(row: sa.Row[Any] | None) -> ApprovalRow | None:
        return None if row is None else _approval_of(row)

    def approval(self, conn: Connection, approval_id: str) -> ApprovalRow | None:
        stmt = self._q(
            ("approval",), lambda: sa.select(T_APPROVALS).where(T_APPROVALS.c.id == sa.bindparam("p_id"))
        )
        return self._approval(conn.execute(stmt, {"p_id": approval_id}).first())

    def approval_for_key(self, conn: Connection, key: str) -> ApprovalRow | None:
        stmt = self._q(
            ("for_key",),
            lambda: (
                sa.select(T_APPROVALS)
                .join(T_KEYS, T_KEYS.c.approval_id == T_APPROVALS.c.id)
                .where(T_KEYS.c.key == sa.bindparam("p_key"))
            ),
        )
        return self._approval(conn.execute(stmt, {"p_key": key}).first())

    def key_version(self, conn: Connection, key: str) -> int | None:
        """The approval version an intent key was recorded against."""
        stmt = self._q(
            ("key_version",), lambda: sa.select(T_KEYS.c.version).where(T_KEYS.c.key == sa.bindparam("p_key"))
        )
        row = conn.execute(stmt, {"p_key": key}).first()
        return None if row is None else int(row.version)

    def pending_in_session(
        self, conn: Connection, session_id: str, tool: str, subject_key: str
    ) -> ApprovalRow | None:
        stmt = self._q(
            ("pending_in_session",),
            lambda: (
                sa.select(T_APPROVALS)
                .where(
                    T_APPROVALS.c.session_id == sa.bindparam("p_session"),
                    T_APPROVALS.c.tool == sa.bindparam("p_tool"),
                    T_APPROVALS.c.subject_key == sa.bindparam("p_subject"),
                    T_APPROVALS.c.status == "pending",
                )
                .order_by(T_APPROVALS.c.created_at.desc())
            ),
        )
        params = {"p_session": session_id, "p_tool": tool, "p_subject": subject_key}
        return self._approval(conn.execute(stmt, params).first())

    def in_flight_elsewhere(
        self, conn: Connection, subject_key: str, session_id: str, now: float
    ) -> ApprovalRow | None:
        """Another session's approval on this subject that is pending, or granted and still usable
        (an unexpired grant, or one already presented whose execution has not finished)."""
        t = T_APPROVALS
        stmt = self._q(
            ("in_flight",),
            lambda: (
                sa.select(t)
                .where(
                    t.c.subject_key == sa.bindparam("p_subject"),
                    t.c.session_id != sa.bindparam("p_session"),
                    sa.or_(
                        sa.and_(t.c.status == "pending", t.c.expires_at > sa.bindparam("p_now")),
                        sa.and_(
                            t.c.status == "approved",
                            sa.or_(
                                t.c.token_expires_at > sa.bindparam("p_now"), t.c.token_used_at.is_not(None)
                            ),
                        ),
                    ),
                )
                .order_by(t.c.created_at)
            ),
        )
        params = {"p_subject": subject_key, "p_session": session_id, "p_now": now}
        return self._approval(conn.execute(stmt, params).first())

    def approvals_due(
        self, conn: Connection, now: float, *, session_id: str | None = None, approval_id: str | None = None
    ) -> list[ApprovalRow]:
        """Pending approvals whose deadline has passed."""

        def build() -> Any:
            q = sa.select(T_APPROVALS).where(
                T_APPROVALS.c.status == "pending", T_APPROVALS.c.expires_at <= sa.bindparam("p_now")
            )
            if session_id is not None:
                q = q.where(T_APPROVALS.c.session_id == sa.bindparam("p_session"))
            if approval_id is not None:
                q = q.where(T_APPROVALS.c.id == sa.bindparam("p_id"))
            return q

        stmt = self._q(("due", session_id is None, approval_id is None), build)
        params = {"p_now": now, "p_session": session_id, "p_id": approval_id}
        return [_approval_of(r) for r in conn.execute(stmt, params)]

    def approvals_expiring(self, conn: Connection, now: float, until: float) -> list[ApprovalRow]:
        """Pending approvals still open at `now` whose deadline falls at or before `until`."""
        stmt = self._q(
            ("expiring",),
            lambda: (
                sa.select(T_APPROVALS)
                .where(
                    T_APPROVALS.c.status == "pending",
                    T_APPROVALS.c.expires_at > sa.bindparam("p_now"),
                    T_APPROVALS.c.expires_at <= sa.bindparam("p_until"),
                )
                .order_by(T_APPROVALS.c.expires_at, T_APPROVALS.c.id)
            ),
        )
        return [_approval_of(r) for r in conn.execute(stmt, {"p_now": now, "p_until": until})]

    def has_event(self, conn: Connection, kind: str, approval_id: str, version: int) -> bool:
        """Whether an event of `kind` is recorded for this approval version (read in `conn`)."""
        stmt = self._q(
            ("has_event",),
            lambda: (
                sa.select(T_EVENTS.c.id)
                .where(
                    T_EVENTS.c.kind == sa.bindparam("p_kind"),
                    T_EVENTS.c.approval_id == sa.bindparam("p_id"),
                    T_EVENTS.c.version == sa.bindparam("p_version"),
                )
                .limit(1)
            ),
        )
        params = {"p_kind": kind, "p_id": approval_id, "p_version": version}
        return conn.execute(stmt, params).first() is not None

    def count_pending(self, conn: Connection, session_id: str) -> int:
        stmt = self._q(
            ("count_pending",),
            lambda: (
                sa.select(sa.func.count())
                .select_from(T_APPROVALS)
                .where(
                    T_APPROVALS.c.session_id == sa.bindparam("p_session"), T_APPROVALS.c.status == "pending"
                )
            ),
        )
        return int(conn.execute(stmt, {"p_session": session_id}).scalar_one())

    def subject_history(
        self, conn: Connection, tool: str, subject_key: str, exclude: str | None
    ) -> list[ApprovalRow]:
        q = sa.select(T_APPROVALS).where(T_APPROVALS.c.tool == tool, T_APPROVALS.c.subject_key == subject_key)
        if exclude is not None:
            q = q.where(T_APPROVALS.c.id != exclude)
        return [_approval_of(r) for r in conn.execute(q.order_by(T_APPROVALS.c.created_at))]

    def insert_approval(self, conn: Connection, row: ApprovalRow) -> None:
        conn.execute(self._q(("insert_approval",), lambda: sa.insert(T_APPROVALS)), row.model_dump())

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
        statuses = tuple(expect_status)

        def build() -> Any:
            t = T_APPROVALS
            cond = [t.c.id == sa.bindparam("p_id"), t.c.status.in_(statuses)]
            if expect_version is not None:
                cond.append(t.c.version == sa.bindparam("p_version"))
            return (
                sa.update(t)
                .where(*cond)
                .values({k: sa.bindparam(f"v_{k}") for k in values})
                .returning(t.c.id)
            )

        stmt = self._q(("update_approval", statuses, expect_version is None, tuple(sorted(values))), build)
        params = {
            "p_id": approval_id,
            "p_version": expect_version,
            **{f"v_{k}": v for k, v in values.items()},
        }
        return conn.execute(stmt, params).first() is not None

    def add_key(self, conn: Connection, key: str, approval_id: str, version: int, origin: str) -> bool:
        values = {
            "key": key,
            "approval_id": approval_id,
            "version": version,
            "origin_message_id": origin,
            "created_at": self.clock.now(),
        }
        stmt = self._q(("add_key",), lambda: _dialect.insert_if_absent(conn, T_KEYS, "key"))
        return conn.execute(stmt, values).first() is not None

    def add_decision(self, conn: Connection, **values: Any) -> None:
        conn.execute(
            self._q(("decision",), lambda: sa.insert(T_DECISIONS)), {"at": self.clock.now(), **values}
        )

    def add_rules(self, conn: Connection, rules: Sequence[tuple[str, str, str]]) -> None:
        """Record (fingerprint, kind, canonical JSON) rules unless already present."""
        stmt = self._q(("add_rule",), lambda: _dialect.insert_if_absent(conn, T_RULES, "fingerprint"))
        now = self.clock.now()
        for fingerprint, kind, body in rules:
            conn.execute(stmt, {"fingerprint": fingerprint, "kind": kind, "body_json": body, "at": now})

    def audit_rows(self, conn: Connection, what: AuditTable) -> Iterator[tuple[Any, ...]]:
        """Stream one table's rows for the audit as plain tuples (`AUDIT_QUERIES` gives the
        columns); PostgreSQL streams them from a server-side cursor, in batches."""
        sql = AUDIT_QUERIES[what].replace("{collate}", _dialect.byte_order(conn))
        yield from _dialect.stream(conn, sql, batch=10_000)

    def audit_counts(self, conn: Connection) -> dict[str, int]:
        """What the audit's metrics count over the event log, counted by the database."""
        replays = conn.exec_driver_sql("SELECT count(*) FROM eg_events WHERE kind = 'replay'").scalar_one()
        sessions = conn.exec_driver_sql(
            "SELECT count(*) FROM (SELECT DISTINCT session_id FROM eg_events WHERE session_id IS NOT NULL) s"
        ).scalar_one()
        return {"replays": int(replays), "sessions": int(sessions)}

    def rules(self) -> dict[str, RuleRow]:
        with self.reading() as conn:
            return {r.fingerprint: RuleRow(**r._mapping) for r in conn.execute(sa.select(T_RULES))}

    def decisions(self, conn: Connection, approval_id: str, version: int | None = None) -> list[DecisionRow]:
        def build() -> Any:
            q = sa.select(T_DECISIONS).where(T_DECISIONS.c.approval_id == sa.bindparam("p_id"))
            if version is not None:
                q = q.where(T_DECISIONS.c.version == sa.bindparam("p_version"))
            return q.order_by(T_DECISIONS.c.id)

        stmt = self._q(("decisions", version is None), build)
        return [_decision_of(r) for r in conn.execute(stmt, {"p_id": approval_id, "p_version": version})]

    def append_events(self, conn: Connection, events: Sequence[Mapping[str, Any]]) -> None:
        """Append audit events. One driver-level executemany: read logs arrive in batches of
        hundreds, and compiling an ORM-style insert per row would cost more than the read itself."""
        if not events:
            return
        rows = []
        for e in events:
            detail = e.get("detail_json")
            row = [e.get(c) for c in _EVENT_COLUMNS]
            row[_DETAIL_AT] = detail if isinstance(detail, str) else json.dumps(detail or {}, default=str)
            rows.append(tuple(row))
        conn.exec_driver_sql(_dialect.insert_many_sql(conn, "eg_events", _EVENT_COLUMNS), rows)

    def append_reads(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Append read records, each a tuple in `records.READ_COLUMNS` order (one executemany)."""
        if rows:
            conn.exec_driver_sql(_dialect.insert_many_sql(conn, "eg_events", READ_COLUMNS), list(rows))

    def append_execution(self, conn: Connection, **values: Any) -> None:
        conn.execute(
            self._q(("execution",), lambda: sa.insert(T_EXECUTIONS)), {"at": self.clock.now(), **values}
        )

    # -- reading for the CLI, the audit and the export

    def approvals(
        self,
        *,
        status: str | Sequence[str] | None = None,
        role: str | None = None,
        session_id: str | None = None,
        limit: int | None = None,
    ) -> list[ApprovalRow]:
        q = sa.select(T_APPROVALS)
        if status is not None:
            q = q.where(T_APPROVALS.c.status.in_([status] if isinstance(status, str) else list(status)))
        if role is not None:
            q = q.where(T_APPROVALS.c.approver_role == role)
        if session_id is not None:
            q = q.where(T_APPROVALS.c.session_id == session_id)
        q = q.order_by(T_APPROVALS.c.created_at.desc(), T_APPROVALS.c.id)
        if limit is not None:
            q = q.limit(limit)
        with self.reading() as conn:
            return [_approval_of(r) for r in conn.execute(q)]

    def get_approval(self, approval_id: str) -> ApprovalRow | None:
        with self.reading() as conn:
            return self.approval(conn, approval_id)

    def executions(self, *, approval_id: str | None = None, tool: str | None = None) -> list[ExecutionRow]:
        q = sa.select(T_EXECUTIONS)
        if approval_id is not None:
            q = q.where(T_EXECUTIONS.c.approval_id == approval_id)
        if tool is not None:
            q = q.where(T_EXECUTIONS.c.tool == tool)
        with self.reading() as conn:
            return [ExecutionRow(**r._mapping) for r in conn.execute(q.order_by(T_EXECUTIONS.c.id))]

    def events(self, *, kind: str | None = None, approval_id: str | None = None) -> list[EventRow]:
        q = sa.select(T_EVENTS)
        if kind is not None:
            q = q.where(T_EVENTS.c.kind == kind)
        if approval_id is not None:
            q = q.where(T_EVENTS.c.approval_id == approval_id)
        with self.reading() as conn:
            return [EventRow(**r._mapping) for r in conn.execute(q.order_by(T_EVENTS.c.id))]

    def all_decisions(self) -> list[DecisionRow]:
        with self.reading() as conn:
            return [_decision_of(r) for r in conn.execute(sa.select(T_DECISIONS).order_by(T_DECISIONS.c.id))]


AuditTable = Literal["approvals", "decisions", "gated_executions", "other_executions"]

_EXECUTION_COLUMNS = (
    "SELECT id, approval_id, version, tool, effect, args_hash, args_json, status, row_fingerprint, "
    "policy_fingerprint FROM eg_executions"
)
#: The audit's streamed columns and order. Approvals and decisions start with their sealed
#: fields, in the order `_seal.APPROVAL_FIELDS` / `DECISION_FIELDS` seal them (audit.py indexes
#: these tuples). Approvals, decisions and executions with an approval come ordered by approval id
#: (`{collate}`: byte order on every database), so the audit merges them without holding any.
AUDIT_QUERIES: dict[str, str] = {
    "approvals": (
        "SELECT id, version, grants, session_id, origin_message_id, user_id, agent_id, tool, effect, "
        "subject_key, args_hash, approver_role, approvals_required, row_fingerprint, policy_fingerprint, "
        "seal, args_json, status, created_at, decided_at FROM eg_approvals ORDER BY id{collate}"
    ),
    "decisions": (
        "SELECT approval_id, version, grant_round, approver_id, role, decision, seal, id FROM eg_decisions "
        "ORDER BY approval_id{collate}, id"
    ),
    "gated_executions": _EXECUTION_COLUMNS
    + " WHERE approval_id IS NOT NULL ORDER BY approval_id{collate}, id",
    "other_executions": _EXECUTION_COLUMNS + " WHERE approval_id IS NULL ORDER BY id",
}


def _unreachable(exc: sa.exc.DBAPIError) -> bool:
    """A connection failure (as opposed to a missing table): the server or file is not there."""
    return bool(exc.connection_invalidated) or "connect" in str(exc.orig).lower()
