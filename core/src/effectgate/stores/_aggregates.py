"""The aggregates the audit and the report read, computed by the database (grouped, counted,
streamed as plain tuples), mixed into `SQLStore` (`protocol.ApprovalLedger` documents them)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .._clock import Clock
from . import _dialect
from . import _queries as Q
from ._memory import in_memory
from ._queries import AuditTable, ReportQuery

#: The approval id each audit stream is keyed (and ordered) by, as its query orders it: an
#: expression for approvals and decisions (a range through the id index would fetch each row at
#: random, as `Q.AUDIT_QUERIES` explains), the column for executions (the index skips ungated ones).
_AUDIT_KEY = {
    "approvals": "(id || '')",
    "decisions": "(approval_id || '')",
    "gated_executions": "approval_id",
}
#: A split point is written into the SQL as a literal, so it is taken only from this alphabet
#: (the gate's ids are hex): no quote or backslash can reach the statement.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class AggregateSQL:
    engine: Engine  # `SQLStore.engine`
    clock: Clock  # `SQLStore.clock`

    def audit_rows(
        self, conn: Connection, what: AuditTable, *, low: str | None = None, high: str | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """Stream one table's rows for the audit as plain tuples (`Q.AUDIT_QUERIES` gives the
        columns); PostgreSQL streams them from a server-side cursor, in batches. With `low` and/or
        `high` (ids from `audit_split`), only the rows whose approval id is in [low, high), in
        byte order (not for "other_executions", which have no approval id)."""
        collate = _dialect.byte_order(conn)
        sql = Q.AUDIT_QUERIES[what].replace("{collate}", collate)
        if low is not None or high is not None:
            key = f"{_AUDIT_KEY[what]}{collate}"
            bounds = [f"{key} {op} '{_plain(v)}'" for op, v in ((">=", low), ("<", high)) if v is not None]
            head, order, tail = sql.rpartition(" ORDER BY ")  # the outer query's, not a subquery's
            where = " AND " if " WHERE " in head.rpartition(" FROM ")[2] else " WHERE "
            sql = f"{head}{where}{' AND '.join(bounds)}{order}{tail}"
        yield from _dialect.stream(conn, sql, batch=10_000)

    def audit_split(self, conn: Connection, *, at_least: int) -> str | None:
        """An approval id that splits the approvals into two halves of the byte order (the
        audit scans them in two processes), or None: fewer than `at_least` approvals, an id
        outside the plain alphabet, or a database another process cannot open (in memory)."""
        if in_memory(self.engine.url):
            return None
        count = conn.exec_driver_sql("SELECT count(*) FROM eg_approvals").scalar_one()
        if count < max(at_least, 2):
            return None
        collate = _dialect.byte_order(conn)
        split = conn.exec_driver_sql(
            f"SELECT id FROM eg_approvals ORDER BY id{collate} LIMIT 1 OFFSET {int(count) // 2}"
        ).scalar()
        return split if isinstance(split, str) and _PLAIN_ID.fullmatch(split) else None

    def audit_forked(self) -> None:
        """In a forked child: forget the parent's pooled connections without closing them (they
        are the parent's), so this process opens its own."""
        self.engine.dispose(close=False)

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
        self,
        conn: Connection,
        what: ReportQuery,
        *,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
    ) -> list[tuple[Any, ...]]:
        """One of the report's aggregates over the window [since, until) (`Q.REPORT_QUERIES` gives
        its columns): grouped by the database, so a few rows however large the ledger. `now` (the
        store's clock by default): an approval pending past its expiry then is counted expired."""
        params = {**Q.window(since, until), "now": self.clock.now() if now is None else now}
        return [tuple(r) for r in conn.execute(Q.report(conn, what), params)]

    def latency_p95(
        self, conn: Connection, role: str, *, since: float | None = None, until: float | None = None
    ) -> float | None:
        """The p95 approval latency (nearest rank) of `role`'s decided approvals proposed in
        [since, until), from their sealed decisions and chained proposal events (`Q.LATENCY_P95`);
        None when none has a finite one."""
        params = {**Q.window(since, until), "role": role}
        value = conn.execute(sa.text(Q.LATENCY_P95), params).scalar()
        return None if value is None else float(value)


def _plain(value: str) -> str:
    if not _PLAIN_ID.fullmatch(value):
        raise ValueError("an audit split point must be a plain id")
    return value
