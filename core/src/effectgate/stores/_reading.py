"""The store's reading for the CLI, the audit and the export: whole lists of rows, each in a
read-only transaction of its own (`SQLStore.reading`), and a few reads inside the caller's
transaction (`execution_outcomes`, `decisions_of`); mixed into `SQLStore`
(`protocol.ApprovalLedger` documents them)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..context import _storable
from . import _dialect, _proposing
from . import _queries as Q
from . import _statements as S
from .records import PERSONAL, ApprovalRow, DecisionRow, EventRow, ExecutionRow

#: Built once: the statement's shape never changes (the id list is one expanding parameter).
_FIRST_PROPOSED = Q.first_proposed()
_EXECUTION_OUTCOMES = Q.execution_outcomes()
_GRANTS_PRESENTED = Q.grants_presented()
_DECISIONS_OF = (
    sa.select(Q.T_DECISIONS)
    .where(Q.T_DECISIONS.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)))
    .order_by(Q.T_DECISIONS.c.id)
)
_EXECUTIONS_OF = (
    sa.select(Q.T_EXECUTIONS)
    .where(Q.T_EXECUTIONS.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)))
    .order_by(Q.T_EXECUTIONS.c.id)
)
_BATCH = 1000  # ids per statement (`execution_outcomes`)


def _unheld(*filters: object) -> bool:
    """Whether a filter is text no row can hold (a NUL, a lone surrogate): its list is empty,
    on every store (PostgreSQL refuses such a query, sqlite3 cannot encode a surrogate)."""
    values = [v for f in filters for v in (f if isinstance(f, list | tuple) else (f,))]
    return not all(_storable(v) for v in values)


class ReadingSQL:
    """Whole lists of ledger rows, each read in its own read-only transaction; mixed into
    `SQLStore`, whose `reading` and `approval` the two stubs below name for the type checker."""

    def reading(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError  # `SQLStore.reading`

    def approval(self, conn: Connection, approval_id: str) -> ApprovalRow | None:
        raise NotImplementedError  # `SQLStore.approval`

    def _x(self, conn: Connection, sql: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError  # `SQLStore._x`

    def approvals(
        self,
        *,
        status: str | Sequence[str] | None = None,
        role: str | None = None,
        session_id: str | None = None,
        limit: int | None = None,
        status_not: Sequence[str] | None = None,
    ) -> list[ApprovalRow]:
        if _unheld(status, role, session_id):
            return []
        q = sa.select(Q.T_APPROVALS)
        if status is not None:
            q = q.where(Q.T_APPROVALS.c.status.in_([status] if isinstance(status, str) else list(status)))
        if status_not:
            q = q.where(Q.T_APPROVALS.c.status.not_in(list(status_not)))
        if role is not None:
            q = q.where(Q.T_APPROVALS.c.approver_role == role)
        if session_id is not None:
            q = q.where(Q.T_APPROVALS.c.session_id == session_id)
        q = q.order_by(Q.T_APPROVALS.c.created_at.desc(), Q.T_APPROVALS.c.id)
        if limit is not None:
            q = q.limit(limit)
        with self.reading() as conn:
            return [Q._approval_of(r) for r in conn.execute(q)]

    def get_approval(self, approval_id: str) -> ApprovalRow | None:
        with self.reading() as conn:
            return self.approval(conn, approval_id)

    def executions(self, *, approval_id: str | None = None, tool: str | None = None) -> list[ExecutionRow]:
        if _unheld(approval_id, tool):
            return []
        q = sa.select(Q.T_EXECUTIONS)
        if approval_id is not None:
            q = q.where(Q.T_EXECUTIONS.c.approval_id == approval_id)
        if tool is not None:
            q = q.where(Q.T_EXECUTIONS.c.tool == tool)
        with self.reading() as conn:
            return [ExecutionRow(**r._mapping) for r in conn.execute(q.order_by(Q.T_EXECUTIONS.c.id))]

    def executions_of(self, conn: Connection, approval_ids: Collection[str]) -> list[ExecutionRow]:
        ids = sorted(set(approval_ids))
        return [
            ExecutionRow(**r._mapping)
            for i in range(0, len(ids), _BATCH)
            for r in conn.execute(_EXECUTIONS_OF, {"p_ids": ids[i : i + _BATCH]})
        ]

    def events(
        self, *, kind: str | None = None, approval_id: str | None = None, session_id: str | None = None
    ) -> list[EventRow]:
        if _unheld(kind, approval_id, session_id):
            return []
        q = sa.select(Q.T_EVENTS)
        if kind is not None:
            q = q.where(Q.T_EVENTS.c.kind == kind, *(() if kind == "read" else (Q.NOT_READ,)))
        if approval_id is not None:
            q = q.where(Q.T_EVENTS.c.approval_id == approval_id)
        if session_id is not None:
            q = q.where(Q.T_EVENTS.c.session_id == session_id)
        with self.reading() as conn:
            return [EventRow(**r._mapping) for r in conn.execute(q.order_by(Q.T_EVENTS.c.id))]

    def first_proposed(self, approval_ids: Collection[str]) -> dict[str, int]:
        ids = sorted(set(approval_ids))
        if not ids:
            return {}
        with self.reading() as conn:
            return {str(a): int(i) for a, i in conn.execute(_FIRST_PROPOSED, {"p_ids": ids})}

    def proposal_times(
        self, conn: Connection, approval_ids: Collection[str]
    ) -> dict[tuple[str, int], tuple[Any, Any]]:
        """When, and with what detail, each version of the listed approvals was proposed or
        amended: (id, version) to the `at` and detail of its first such event (by id); a version
        with none is left out."""
        return _proposing.proposal_times(conn, approval_ids)

    def execution_outcomes(self, conn: Connection, approval_ids: Collection[str]) -> dict[str, str]:
        ids = sorted(set(approval_ids))
        if not ids:
            return {}
        out: dict[str, str] = {}
        # a batch of ids per statement: a subject's history may hold more approvals than a
        # statement takes parameters (PostgreSQL 65,535; SQLite 32,766 by default)
        batches = [{"p_ids": ids[i : i + _BATCH]} for i in range(0, len(ids), _BATCH)]
        for batch in batches:  # an approval's executions are all in its batch, in id order
            for approval_id, status in conn.execute(_EXECUTION_OUTCOMES, batch):
                if out.get(approval_id) != "succeeded":  # a success stands; otherwise the latest says
                    out[str(approval_id)] = str(status)
        for batch in batches:
            for (approval_id,) in conn.execute(_GRANTS_PRESENTED, batch):
                out.setdefault(str(approval_id), "presented")  # running, or died with its outcome unknown
        return out

    def decisions_of(self, conn: Connection, approval_ids: Collection[str]) -> list[DecisionRow]:
        ids = sorted(set(approval_ids))
        return [
            Q._decision_of(r)
            for i in range(0, len(ids), _BATCH)
            for r in conn.execute(_DECISIONS_OF, {"p_ids": ids[i : i + _BATCH]})
        ]

    def grant_spent(self, conn: Connection, approval_id: str, version: int) -> bool:
        return (
            self._x(conn, S.GRANT_SPENT, {"p_id": approval_id, "p_version": version}).fetchone() is not None
        )

    def all_decisions(self) -> list[DecisionRow]:
        with self.reading() as conn:
            return [
                Q._decision_of(r) for r in conn.execute(sa.select(Q.T_DECISIONS).order_by(Q.T_DECISIONS.c.id))
            ]

    def marked_values(self, conn: Connection) -> Iterator[tuple[str, str, tuple[Any, ...], dict[str, str]]]:
        """Every personal value (`records.PERSONAL`) that starts like a redaction marker, per
        row: (table, row key, (approval id, tool, args hash, status), {column: text}); a column
        the table lacks reads None. The database filters (a scan of each table in C, no row
        decoded that holds no marker), so only erased rows reach Python."""
        prefix = _dialect.REDACTED_PREFIX
        assert "'" not in prefix  # written into the SQL as a literal
        for table, columns in PERSONAL.items():
            t = _TABLE_OF[table]
            key = "key" if table == "eg_idempotency" else "id"
            info = ", ".join(
                c if c in t.c else "NULL" for c in ("approval_id", "tool", "args_hash", "status")
            )
            marked = " OR ".join(f"substr({c}, 1, {len(prefix)}) = '{prefix}'" for c in columns)
            sql = f"SELECT {key}, {info}, {', '.join(columns)} FROM {table} WHERE {marked} ORDER BY {key}"
            for row in _dialect.stream(conn, sql, batch=1000):
                texts = {c: v for c, v in zip(columns, row[5:], strict=True) if _marked(v, prefix)}
                yield table, str(row[0]), tuple(row[1:5]), texts

    def every_row(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every row of every effectgate table, as (table, {column: value}), each table in key
        order, all read in one transaction and streamed (PostgreSQL: a server-side cursor)."""
        with self.reading() as conn:
            streaming = conn.execution_options(yield_per=1000)
            for t in Q.ALL_TABLES:
                for row in streaming.execute(sa.select(t).order_by(*t.primary_key.columns)):
                    yield t.name, dict(row._mapping)


_TABLE_OF = {t.name: t for t in Q.ALL_TABLES}


def _marked(value: Any, prefix: str) -> bool:
    return isinstance(value, str) and value.startswith(prefix)
