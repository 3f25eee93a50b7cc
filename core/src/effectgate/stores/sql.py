"""The one SQL implementation of the store, for SQLite and PostgreSQL alike.

`SQLStore` implements the idempotency primitives of `base.IdempotencyStore` and the approval
ledger's primitives that the gate composes into its transactions. Dialect differences live in
`_dialect.py`; this module never branches on the database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from .._clock import SYSTEM_CLOCK, Clock
from ..errors import StoreError
from . import _dialect
from .base import IdempotencyRecord, IdempotencyStore, Status, from_json
from .records import (
    APPEND_ONLY,
    SCHEMA_VERSION,
    ApprovalRow,
    DecisionRow,
    EventRow,
    ExecutionRow,
    IdempotencyRow,
    IntentKeyRow,
    SchemaVersionRow,
)

T_APPROVALS: sa.Table = ApprovalRow.__table__  # type: ignore[attr-defined]
T_KEYS: sa.Table = IntentKeyRow.__table__  # type: ignore[attr-defined]
T_DECISIONS: sa.Table = DecisionRow.__table__  # type: ignore[attr-defined]
T_EVENTS: sa.Table = EventRow.__table__  # type: ignore[attr-defined]
T_EXECUTIONS: sa.Table = ExecutionRow.__table__  # type: ignore[attr-defined]
T_IDEMPOTENCY: sa.Table = IdempotencyRow.__table__  # type: ignore[attr-defined]
T_VERSION: sa.Table = SchemaVersionRow.__table__  # type: ignore[attr-defined]


_EVENT_COLUMNS = tuple(c.name for c in T_EVENTS.columns if c.name != "id")
_DETAIL_AT = _EVENT_COLUMNS.index("detail_json")


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

    # -- lifecycle

    def setup(self) -> None:
        """Create the tables (idempotent) and check or record the schema version."""
        with self.transaction() as conn:
            # Concurrent set-ups queue on one lock and create the tables inside it (PostgreSQL DDL
            # is transactional); create_all's check-then-create would otherwise collide.
            self.lock(conn, "effectgate:setup")
            SQLModel.metadata.create_all(
                conn,
                tables=[T_VERSION, T_APPROVALS, T_KEYS, T_DECISIONS, T_EVENTS, T_EXECUTIONS, T_IDEMPOTENCY],
            )
            row = conn.execute(sa.select(T_VERSION.c.version).where(T_VERSION.c.id == 1)).first()
            if row is None:
                values = {"id": 1, "version": SCHEMA_VERSION, "applied_at": self.clock.now()}
                if conn.execute(_dialect.insert_if_absent(conn, T_VERSION, values, "id")).first():
                    _dialect.append_only_ddl(conn, APPEND_ONLY)
            elif row.version != SCHEMA_VERSION:
                raise StoreError(
                    f"database schema is version {row.version}; this effectgate expects "
                    f"{SCHEMA_VERSION}. Migrate it before use."
                )
        self._ready = True

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A read-only transaction (SQLite: DEFERRED, so it never waits for the write lock)."""
        with self.engine.connect().execution_options(**{_dialect.READONLY: True}) as conn, conn.begin():
            yield conn

    def lock(self, conn: Connection, name: str) -> None:
        _dialect.lock_name(conn, name)

    # -- idempotency primitives

    def _insert_claim(self, conn: Connection, values: dict[str, Any]) -> bool:
        return conn.execute(_dialect.insert_if_absent(conn, T_IDEMPOTENCY, values, "key")).first() is not None

    def _load(self, conn: Connection, key: str) -> IdempotencyRecord | None:
        row = conn.execute(sa.select(T_IDEMPOTENCY).where(T_IDEMPOTENCY.c.key == key)).first()
        if row is None:
            return None
        m = row._mapping
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

    def _transition(
        self,
        conn: Connection,
        key: str,
        *,
        from_status: tuple[Status, ...],
        owner: str | None = None,
        lease_expired_before: float | None = None,
        values: dict[str, Any],
    ) -> bool:
        t = T_IDEMPOTENCY
        cond = [t.c.key == key, t.c.status.in_(from_status)]
        if owner is not None:
            cond.append(t.c.lease_owner == owner)
        if lease_expired_before is not None:
            cond.append(t.c.lease_expires_at <= lease_expired_before)
        stmt = sa.update(t).where(*cond).values(**values).returning(t.c.key)
        return conn.execute(stmt).first() is not None

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
        return None if row is None else ApprovalRow(**row._mapping)

    def approval(self, conn: Connection, approval_id: str) -> ApprovalRow | None:
        return self._approval(
            conn.execute(sa.select(T_APPROVALS).where(T_APPROVALS.c.id == approval_id)).first()
        )

    def approval_for_key(self, conn: Connection, key: str) -> ApprovalRow | None:
        q = (
            sa.select(T_APPROVALS)
            .join(T_KEYS, T_KEYS.c.approval_id == T_APPROVALS.c.id)
            .where(T_KEYS.c.key == key)
        )
        return self._approval(conn.execute(q).first())

    def pending_in_session(
        self, conn: Connection, session_id: str, tool: str, subject_key: str
    ) -> ApprovalRow | None:
        q = sa.select(T_APPROVALS).where(
            T_APPROVALS.c.session_id == session_id,
            T_APPROVALS.c.tool == tool,
            T_APPROVALS.c.subject_key == subject_key,
            T_APPROVALS.c.status == "pending",
        )
        return self._approval(conn.execute(q.order_by(T_APPROVALS.c.created_at.desc())).first())

    def in_flight_elsewhere(
        self, conn: Connection, subject_key: str, session_id: str, now: float
    ) -> ApprovalRow | None:
        """Another session's approval on this subject that is pending, or granted and still usable
        (an unexpired grant, or one already presented whose execution has not finished)."""
        t = T_APPROVALS
        q = sa.select(t).where(
            t.c.subject_key == subject_key,
            t.c.session_id != session_id,
            sa.or_(
                t.c.status == "pending",
                sa.and_(
                    t.c.status == "approved",
                    sa.or_(t.c.token_expires_at > now, t.c.token_used_at.is_not(None)),
                ),
            ),
        )
        return self._approval(conn.execute(q.order_by(T_APPROVALS.c.created_at)).first())

    def approvals_due(
        self, conn: Connection, now: float, *, session_id: str | None = None, approval_id: str | None = None
    ) -> list[ApprovalRow]:
        """Pending approvals whose deadline has passed."""
        q = sa.select(T_APPROVALS).where(T_APPROVALS.c.status == "pending", T_APPROVALS.c.expires_at <= now)
        if session_id is not None:
            q = q.where(T_APPROVALS.c.session_id == session_id)
        if approval_id is not None:
            q = q.where(T_APPROVALS.c.id == approval_id)
        return [ApprovalRow(**r._mapping) for r in conn.execute(q)]

    def count_pending(self, conn: Connection, session_id: str) -> int:
        q = (
            sa.select(sa.func.count())
            .select_from(T_APPROVALS)
            .where(T_APPROVALS.c.session_id == session_id, T_APPROVALS.c.status == "pending")
        )
        return int(conn.execute(q).scalar_one())

    def subject_history(
        self, conn: Connection, tool: str, subject_key: str, exclude: str | None
    ) -> list[ApprovalRow]:
        q = sa.select(T_APPROVALS).where(T_APPROVALS.c.tool == tool, T_APPROVALS.c.subject_key == subject_key)
        if exclude is not None:
            q = q.where(T_APPROVALS.c.id != exclude)
        return [ApprovalRow(**r._mapping) for r in conn.execute(q.order_by(T_APPROVALS.c.created_at))]

    def insert_approval(self, conn: Connection, row: ApprovalRow) -> None:
        conn.execute(sa.insert(T_APPROVALS).values(**row.model_dump()))

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
        cond = [T_APPROVALS.c.id == approval_id, T_APPROVALS.c.status.in_(list(expect_status))]
        if expect_version is not None:
            cond.append(T_APPROVALS.c.version == expect_version)
        stmt = sa.update(T_APPROVALS).where(*cond).values(**values).returning(T_APPROVALS.c.id)
        return conn.execute(stmt).first() is not None

    def add_key(self, conn: Connection, key: str, approval_id: str, version: int, origin: str) -> bool:
        values = {
            "key": key,
            "approval_id": approval_id,
            "version": version,
            "origin_message_id": origin,
            "created_at": self.clock.now(),
        }
        return conn.execute(_dialect.insert_if_absent(conn, T_KEYS, values, "key")).first() is not None

    def add_decision(self, conn: Connection, **values: Any) -> None:
        conn.execute(sa.insert(T_DECISIONS).values(at=self.clock.now(), **values))

    def decisions(self, conn: Connection, approval_id: str, version: int | None = None) -> list[DecisionRow]:
        q = sa.select(T_DECISIONS).where(T_DECISIONS.c.approval_id == approval_id)
        if version is not None:
            q = q.where(T_DECISIONS.c.version == version)
        return [DecisionRow(**r._mapping) for r in conn.execute(q.order_by(T_DECISIONS.c.id))]

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

    def append_execution(self, conn: Connection, **values: Any) -> None:
        conn.execute(sa.insert(T_EXECUTIONS).values(at=self.clock.now(), **values))

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
            return [ApprovalRow(**r._mapping) for r in conn.execute(q)]

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
            return [
                DecisionRow(**r._mapping)
                for r in conn.execute(sa.select(T_DECISIONS).order_by(T_DECISIONS.c.id))
            ]
