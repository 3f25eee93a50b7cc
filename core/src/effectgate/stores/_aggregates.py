"""The aggregates the audit and the report read, computed by the database (grouped, counted,
streamed as plain tuples), mixed into `SQLStore` (`protocol.ApprovalLedger` documents them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _dialect
from . import _queries as Q
from ._queries import AuditTable, ReportQuery


class AggregateSQL:
    def audit_rows(self, conn: Connection, what: AuditTable) -> Iterator[tuple[Any, ...]]:
        """Stream one table's rows for the audit as plain tuples (`Q.AUDIT_QUERIES` gives the
        columns); PostgreSQL streams them from a server-side cursor, in batches."""
        sql = Q.AUDIT_QUERIES[what].replace("{collate}", _dialect.byte_order(conn))
        yield from _dialect.stream(conn, sql, batch=10_000)

    def audit_counts(self, conn: Connection) -> dict[str, int]:
        """What the audit's metrics count over the event log, counted by the database."""
        replays = conn.exec_driver_sql(
            "SELECT count(*) FROM eg_events WHERE kind = 'replay' AND kind <> 'read'"
        ).scalar_one()
        sessions = conn.exec_driver_sql(
            "SELECT count(*) FROM (SELECT DISTINCT session_id FROM eg_events WHERE session_id IS NOT NULL) s"
        ).scalar_one()
        return {"replays": int(replays), "sessions": int(sessions)}

    def report_rows(
        self, conn: Connection, what: ReportQuery, *, since: float | None = None, until: float | None = None
    ) -> list[tuple[Any, ...]]:
        """One of the report's aggregates over the window [since, until) (`Q.REPORT_QUERIES` gives
        its columns): grouped by the database, so a few rows however large the ledger."""
        return [tuple(r) for r in conn.execute(Q.report(conn, what), Q.window(since, until))]

    def latency_at(
        self,
        conn: Connection,
        role: str,
        rank: int,
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> float | None:
        """The `rank`-th smallest (from 0) approval latency, decided_at - created_at, of `role`'s
        decided approvals proposed in [since, until); None past the last."""
        params = {**Q.window(since, until), "role": role, "rank": rank}
        value = conn.execute(sa.text(Q.LATENCY_AT), params).scalar()
        return None if value is None else float(value)
