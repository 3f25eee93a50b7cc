"""Reads of the hot transactions that one statement answers together, where each alone was a
statement of its own (a round trip on PostgreSQL, the driver's per-statement CPU on SQLite):
propose's three reads of approvals and its look for a record of the call run as a write
(`proposal_reads`), and the approval read under its subject's lock with its version's decisions
(`locked_decided`: approve, deny), and a write's look for its call's approval (`call_approvals`).
Each part is the statement it replaces (`_statements`),
unchanged, so each reads what it read; mixed into `SQLStore` (`protocol.ApprovalLedger`
documents them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from . import _dialect
from . import _statements as S
from .records import APPROVAL_COLUMNS, DECISION_COLUMNS, ApprovalRow, DecisionRow

_COLUMNS = S._list(APPROVAL_COLUMNS)
_WIDTH = len(APPROVAL_COLUMNS)

#: Tagged 1 (the session's pending approvals, newest first), 2 (the intent key's approval), 3
#: (another session's in flight on the subject): `PENDING_OF_SESSION`, `APPROVAL_FOR_KEY` and
#: `IN_FLIGHT_ELSEWHERE`, each in a subquery that keeps its own order and limit; and 4 (its
#: columns NULL) when an idempotency record of `:p_record` exists.
PROPOSAL_READS = (
    f"SELECT 1, {_COLUMNS} FROM ({S.PENDING_OF_SESSION}) AS p "
    f"UNION ALL SELECT 2, {_COLUMNS} FROM ({S.APPROVAL_FOR_KEY}) AS k "
    f"UNION ALL SELECT 3, {_COLUMNS} FROM ({S.IN_FLIGHT_ELSEWHERE}) AS b "
    f'UNION ALL SELECT 4, {", ".join(["NULL"] * _WIDTH)} FROM eg_idempotency WHERE "key" = :p_record'
)
#: `APPROVAL` and `DECISIONS_OF_VERSION` of the version it reads: one row per decision (in the
#: order recorded), or one with NULL decision columns when there is none.
APPROVAL_DECISIONS = (
    f"SELECT {S._list(APPROVAL_COLUMNS, 'a.')}, {S._list(DECISION_COLUMNS, 'd.')} FROM eg_approvals a "
    "LEFT JOIN eg_decisions d ON d.approval_id = a.id AND d.version = a.version WHERE a.id = :p_id "
    "ORDER BY d.id"
)
#: The first event (by id) that proposed or amended the version `a` reads: `{}` is the column.
_PROPOSING = (
    "(SELECT e.{} FROM eg_events e WHERE e.approval_id = a.id AND e.version = a.version "
    "AND e.kind IN ('proposed', 'amended') ORDER BY e.id LIMIT 1)"
)
#: `APPROVAL_DECISIONS` with, last, the `at` and the detail of the first event that proposed or
#: amended the version it reads (`_deadline`), NULLs when none; probes of `eg_events_approval` in
#: the same read.
APPROVAL_DECISIONS_AT = APPROVAL_DECISIONS.replace(
    " FROM eg_approvals a ",
    f", {_PROPOSING.format('at')}, {_PROPOSING.format('detail_json')} FROM eg_approvals a ",
    1,
)

#: Tagged 1, the intent key's approval (`APPROVAL_FOR_KEY`), and 2, the newest approval of the
#: session's tool proposed by the message with these arguments and not in shadow mode: filed
#: under another intent key when the row's subject definition changed since (a newer shadow card
#: of the same call never hides the live one). Through the session index.
CALL_APPROVALS = (
    f"SELECT 1, {_COLUMNS} FROM ({S.APPROVAL_FOR_KEY}) AS k UNION ALL SELECT 2, {_COLUMNS} FROM "
    f"({S._APPROVAL} WHERE session_id = :p_session AND tool = :p_tool AND origin_message_id = "
    ":p_message AND args_hash = :p_hash AND substr(subject_key, 1, 7) <> 'shadow:' "
    "ORDER BY created_at DESC LIMIT 1) AS c"
)


class TogetherSQL:
    """`proposal_reads` and `locked_decided`; the stubs are `SQLStore`'s."""

    def _x(self, conn: Connection, sql: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError  # `SQLStore._x`

    def _q(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        raise NotImplementedError  # `SQLStore._q`

    def locked_decided(
        self, conn: Connection, approval_id: str
    ) -> tuple[ApprovalRow | None, list[DecisionRow]]:
        """`locked_approval`, and the `decisions` of the version it read (in one read after the
        lock); (None, []) when there is no such approval."""
        rows = self._locked(conn, approval_id, APPROVAL_DECISIONS)
        if not rows:
            return None, []
        decided = [S.decision_of(r[_WIDTH:]) for r in rows if r[_WIDTH] is not None]
        return S.approval_of(rows[0][:_WIDTH]), decided

    def locked_decided_at(
        self, conn: Connection, approval_id: str
    ) -> tuple[ApprovalRow | None, list[DecisionRow], tuple[Any, Any]]:
        """`locked_decided`, and the `at` and detail (as stored) of the first event that proposed
        or amended the version it read, (None, None) when there is none; in the same one read."""
        rows = self._locked(conn, approval_id, APPROVAL_DECISIONS_AT)
        if not rows:
            return None, [], (None, None)
        decided = [S.decision_of(r[_WIDTH:-2]) for r in rows if r[_WIDTH] is not None]
        return S.approval_of(rows[0][:_WIDTH]), decided, (rows[0][-2], rows[0][-1])

    def _locked(self, conn: Connection, approval_id: str, sql: str) -> list[Any]:
        """The rows of `sql` for the approval, read after its subject's lock; [] when there is none."""
        if not S.possible_id(approval_id):
            return []
        params = {"p_id": approval_id}
        lock = self._q(("subject_lock",), lambda: _dialect.subject_lock_sql(conn))
        if lock is not None and self._x(conn, lock, params).fetchone() is None:
            return []
        return list(self._x(conn, sql, params).fetchall())

    def call_approvals(
        self, conn: Connection, key: str, session_id: str, tool: str, message: str, args_hash: str
    ) -> tuple[ApprovalRow | None, ApprovalRow | None]:
        """`approval_for_key(key)`, and the newest approval of `session_id`'s `tool` that `message`
        proposed with `args_hash`, in one read."""
        params = {"p_key": key, "p_session": session_id, "p_tool": tool, "p_message": message}
        params["p_hash"] = args_hash
        found: dict[int, ApprovalRow] = {}
        for row in self._x(conn, CALL_APPROVALS, params).fetchall():
            found[row[0]] = S.approval_of(row[1:])
        return found.get(1), found.get(2)

    def proposal_reads(
        self, conn: Connection, session_id: str, key: str, subject_key: str, now: float, record: str
    ) -> tuple[list[ApprovalRow], ApprovalRow | None, ApprovalRow | None, bool]:
        """`pending_of_session`, `approval_for_key`, `in_flight_elsewhere`, and whether the
        idempotency record `record` exists, in one read."""
        params = {"p_session": session_id, "p_key": key, "p_subject": subject_key, "p_now": now}
        params["p_record"] = record
        pending: list[ApprovalRow] = []
        keyed = busy = None
        recorded = False
        for row in self._x(conn, PROPOSAL_READS, params).fetchall():
            tag = row[0]
            if tag == 4:
                recorded = True
            elif tag == 1:
                pending.append(S.approval_of(row[1:]))
            elif tag == 2:
                keyed = S.approval_of(row[1:])
            else:
                busy = S.approval_of(row[1:])
        pending.sort(key=_created, reverse=True)  # newest first: a UNION ALL keeps no part's order
        return pending, keyed, busy, recorded


def _created(row: ApprovalRow) -> float:  # a time edited into text (SQLite) sorts last, not raises
    at = row.created_at
    return float(at) if type(at) in (int, float) else float("-inf")
