"""What the SQL store runs: the tables, statements built once per shape, and row conversions.

Every statement here takes its values as bound parameters; `SQLStore._q` caches each by shape, so
the hot path skips construction and cache-key generation.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import sqlalchemy as sa

from . import _dialect
from .records import (
    APPROVAL_COLUMNS,
    DECISION_COLUMNS,
    ApprovalRow,
    ApprovalTable,
    ChainRow,
    DecisionRow,
    DecisionTable,
    EventRow,
    ExecutionRow,
    HoldRow,
    IdempotencyRow,
    IntentKeyRow,
    RedactedRow,
    RuleRow,
    SchemaVersionRow,
)

T_APPROVALS: sa.Table = ApprovalTable.__table__  # type: ignore[attr-defined]
T_KEYS: sa.Table = IntentKeyRow.__table__  # type: ignore[attr-defined]
T_DECISIONS: sa.Table = DecisionTable.__table__  # type: ignore[attr-defined]
T_EVENTS: sa.Table = EventRow.__table__  # type: ignore[attr-defined]
#: With a kind other than 'read': lets SQLite use the partial kind index (records.EVENT_INDEXES).
NOT_READ = T_EVENTS.c.kind != "read"
T_EXECUTIONS: sa.Table = ExecutionRow.__table__  # type: ignore[attr-defined]
T_IDEMPOTENCY: sa.Table = IdempotencyRow.__table__  # type: ignore[attr-defined]
T_VERSION: sa.Table = SchemaVersionRow.__table__  # type: ignore[attr-defined]
T_RULES: sa.Table = RuleRow.__table__  # type: ignore[attr-defined]
T_REDACTED: sa.Table = RedactedRow.__table__  # type: ignore[attr-defined]
T_HOLDS: sa.Table = HoldRow.__table__  # type: ignore[attr-defined]
T_CHAIN: sa.Table = ChainRow.__table__  # type: ignore[attr-defined]
ALL_TABLES = (
    T_VERSION,
    T_APPROVALS,
    T_KEYS,
    T_DECISIONS,
    T_EVENTS,
    T_EXECUTIONS,
    T_IDEMPOTENCY,
    T_RULES,
    T_REDACTED,
    T_HOLDS,
    T_CHAIN,
)


_EVENT_COLUMNS = tuple(c.name for c in T_EVENTS.columns if c.name != "id")
_DETAIL_AT = _EVENT_COLUMNS.index("detail_json")


def _approval_of(row: Any) -> ApprovalRow:
    return as_text(ApprovalRow(**dict(zip(APPROVAL_COLUMNS, row, strict=True))))


#: The approval's JSON columns, which every surface reads as text (`startswith`, `+`, parsing).
JSON_TEXTS = ("args_json", "subject_json", "notes_json")


def as_text(a: ApprovalRow) -> ApprovalRow:
    """`a` with a JSON column that SQLite handed back as bytes (a BLOB edited into it: SQLite keeps
    any type in any column) as the text it holds, undecodable bytes replaced: it is judged and
    shown as text edited in would be (flagged when its arguments no longer verify), where bytes
    raised a TypeError that took every surface's list of approvals down."""
    for name in JSON_TEXTS:
        value = getattr(a, name)
        if isinstance(value, bytes):
            setattr(a, name, value.decode("utf-8", "replace"))
    return a


def _decision_of(row: Any) -> DecisionRow:
    return DecisionRow(**dict(zip(DECISION_COLUMNS, row, strict=True)))


def approvals_expiring() -> Any:
    return (
        sa.select(T_APPROVALS)
        .where(
            T_APPROVALS.c.status == "pending",
            T_APPROVALS.c.expires_at > sa.bindparam("p_now"),
            T_APPROVALS.c.expires_at <= sa.bindparam("p_until"),
        )
        .order_by(T_APPROVALS.c.expires_at, T_APPROVALS.c.id)
    )


def has_event() -> Any:
    return (
        sa.select(T_EVENTS.c.id)
        .where(
            T_EVENTS.c.kind == sa.bindparam("p_kind"),
            T_EVENTS.c.approval_id == sa.bindparam("p_id"),
            T_EVENTS.c.version == sa.bindparam("p_version"),
        )
        .limit(1)
    )


def first_proposed() -> Any:
    """Each listed approval's first "proposed" event id (`p_ids`, an expanding list): a walk of
    the approvals' event index (`eg_events_approval`), a few rows per approval."""
    return (
        sa.select(T_EVENTS.c.approval_id, sa.func.min(T_EVENTS.c.id))
        .where(
            T_EVENTS.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)), T_EVENTS.c.kind == "proposed"
        )
        .group_by(T_EVENTS.c.approval_id)
    )


def proposal_times() -> Any:
    """The events that proposed or amended the listed approvals' versions (`p_ids`, an expanding
    list), in id order (the first of a version is the one that counts): (approval id, version,
    `at`, detail as stored); a walk of `eg_events_approval`."""
    e = T_EVENTS
    return (
        sa.select(e.c.approval_id, e.c.version, e.c.at, e.c.detail_json)
        .where(
            e.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)), e.c.kind.in_(("proposed", "amended"))
        )
        .order_by(e.c.id)
    )


def execution_outcomes() -> Any:
    """The executions of the listed approvals (`p_ids`, an expanding list) that say what became
    of a grant, in the order they were recorded: (approval id, status). A walk of the executions'
    approval index (`eg_executions.approval_id`), a few rows per approval."""
    return (
        sa.select(T_EXECUTIONS.c.approval_id, T_EXECUTIONS.c.status)
        .where(
            T_EXECUTIONS.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)),
            T_EXECUTIONS.c.status.in_(("succeeded", "needs_reconciliation", "failed")),
        )
        .order_by(T_EXECUTIONS.c.id)
    )


def grants_presented() -> Any:
    """Which of the listed approvals (`p_ids`, an expanding list) had a grant presented: their
    "token_used" events (appended, chained), through the approvals' event index."""
    return (
        sa.select(T_EVENTS.c.approval_id)
        .where(
            T_EVENTS.c.approval_id.in_(sa.bindparam("p_ids", expanding=True)), T_EVENTS.c.kind == "token_used"
        )
        .distinct()
    )


AuditTable = Literal["approvals", "decisions", "gated_executions", "other_executions"]

_EXECUTION_COLUMNS = (
    "SELECT id, approval_id, version, tool, effect, args_hash, args_json, status, row_fingerprint, "
    "policy_fingerprint, idempotency_key FROM eg_executions"
)
#: The audit's streamed columns and order. Approvals and decisions start with their sealed
#: fields, in the order `_seal.APPROVAL_FIELDS` / `DECISION_FIELDS` seal them (audit.py indexes
#: these tuples). Approvals, decisions and executions with an approval come ordered by approval id
#: (`{collate}`: byte order on every database), so the audit merges them without holding any.
#: A granted approval's last two columns are when its version was proposed and that event's detail
#: (its `pending_ttl`, `_audit_deadline`): its first such event (by id, as the gate reads it), one
#: row read.
#: Every approval and decision is read, so they are sorted by an expression of the id (the same
#: order): read through the id index instead, SQLite would fetch each row at random, which costs
#: more than reading the table in order and sorting it. Executions keep the index: it skips the
#: ungated ones.
AUDIT_QUERIES: dict[str, str] = {
    "approvals": (
        "SELECT id, version, grants, session_id, origin_message_id, user_id, agent_id, tool, effect, "
        "subject_key, args_hash, approver_role, approvals_required, row_fingerprint, policy_fingerprint, "
        "seal, args_json, status, created_at, decided_at, expires_at, token_expires_at, CASE WHEN "
        "grants > 0 THEN (SELECT e.at FROM eg_events e WHERE e.approval_id = eg_approvals.id AND "
        "e.version = eg_approvals.version AND e.kind IN ('proposed', 'amended') ORDER BY e.id LIMIT 1) "
        "END, CASE WHEN grants > 0 THEN (SELECT e.detail_json FROM eg_events e WHERE e.approval_id = "
        "eg_approvals.id AND e.version = eg_approvals.version AND e.kind IN ('proposed', 'amended') "
        "ORDER BY e.id LIMIT 1) END FROM eg_approvals ORDER BY (id || ''){collate}"
    ),
    "decisions": (
        "SELECT approval_id, version, grant_round, approver_id, role, decision, seal, id, at "
        "FROM eg_decisions ORDER BY (approval_id || ''){collate}, id"
    ),
    "gated_executions": _EXECUTION_COLUMNS
    + " WHERE approval_id IS NOT NULL ORDER BY approval_id{collate}, id",
    "other_executions": _EXECUTION_COLUMNS + " WHERE approval_id IS NULL ORDER BY id",
}


#: PostgreSQL's SQLSTATEs and SQLite's messages for a table or column that does not exist.
_UNDEFINED = ("42P01", "42703")
_NO_SUCH = ("no such table", "no such column")


def _no_schema(exc: sa.exc.DBAPIError) -> bool:
    """Whether reading the schema version failed because the table (or its column) is not
    there: anything else (the server or file unreachable, a role without privileges on the
    tables) is the database's own error, never "no effectgate schema: run setup"."""
    if getattr(exc.orig, "sqlstate", None) in _UNDEFINED:
        return True
    return not exc.connection_invalidated and str(exc.orig).lower().startswith(_NO_SUCH)


ReportQuery = Literal[
    "decisions",
    "gated_by_day",
    "sessions_by_day",
    "sessions_by_model",
    "replays_by_day",
    "backlog_by_day",
    "erased_backlog",
]

_EDITED = "CASE WHEN e.approval_id IS NULL THEN 0 ELSE 1 END"
#: Decided at a time a clock gives, as the columns say: its latency is a finite number (NULL, NaN and
#: infinity times 0 are not 0), as the audit counts it; not text or a blob SQLite kept in the column
#: (its arithmetic reads it as 0: `x + 0 = x` is false). A grouping flag (`report._verify` matches
#: it): the p95 reads the append-only records instead (`LATENCY_P95`), which test their times so.
_DECIDED_AT = (
    "CASE WHEN (a.decided_at - a.created_at) * 0 = 0 AND a.decided_at + 0 = a.decided_at THEN 1 ELSE 0 END"
)
#: An approval still pending past its expiry (not yet swept by the gate) is expired, as the gate
#: treats it: it can no longer be decided (`:now`, the store's clock when the report is read).
#: Grouped by its position: PostgreSQL does not take two bound copies of `:now` as one expression.
_STATUS = "CASE WHEN a.status = 'pending' AND a.expires_at <= :now THEN 'expired' ELSE a.status END"
_MARK = _dialect.REDACTED_PREFIX.replace("{", "{{")  # a literal brace in a `format_map` template
_MARKED = f"substr(i.error, 1, {len(_dialect.REDACTED_PREFIX)}) = '{_MARK}'"  # a redaction marker
#: The report's aggregates (`effectgate.report`), each grouped by the database: a few rows however
#: large the ledger. `{day_<column>}` is that column's UTC day number and `{edited_by}` the
#: amendment's `edited_by` field (`_dialect.utc_day`, `json_field`); `:since` and `:until` bound
#: the window (the store passes -inf and inf for an open end). The CASE makes the JSON of amendments
#: alone be read: SQL does not promise the order in which a WHERE clause's conditions are tested.
REPORT_QUERIES: dict[str, str] = {
    # (tool, approver role, row fingerprint, status, edited by a reviewer 0/1, finite latency 0/1, count)
    "decisions": (
        f"SELECT a.tool, a.approver_role, a.row_fingerprint, {_STATUS}, {_EDITED}, {_DECIDED_AT}, count(*) "
        "FROM eg_approvals a LEFT JOIN (SELECT DISTINCT approval_id FROM eg_events "
        "WHERE kind = 'amended' AND kind <> 'read' AND approval_id IS NOT NULL "
        "AND CASE WHEN kind = 'amended' THEN {edited_by} END <> '') e "
        "ON e.approval_id = a.id "
        "WHERE a.created_at >= :since AND a.created_at < :until "
        f"GROUP BY a.tool, a.approver_role, a.row_fingerprint, 4, {_EDITED}, {_DECIDED_AT}"
    ),
    # (day, model id, gated proposals that reached a reviewer)
    "gated_by_day": (
        "SELECT {day_created_at}, model_id, count(*) FROM eg_approvals WHERE status <> 'rejected' "
        "AND created_at >= :since AND created_at < :until GROUP BY {day_created_at}, model_id"
    ),
    # (day, distinct sessions with any event that day)
    "sessions_by_day": (
        "SELECT {day_at}, count(DISTINCT session_id) FROM eg_events WHERE session_id IS NOT NULL "
        "AND session_id <> '' AND at >= :since AND at < :until GROUP BY {day_at}"
    ),
    # (day, model id, distinct sessions with an event about a call of that model that day)
    "sessions_by_model": (
        "SELECT {day_at}, COALESCE(model_id, ''), count(DISTINCT session_id) FROM eg_events "
        "WHERE session_id IS NOT NULL AND session_id <> '' AND at >= :since AND at < :until "
        "GROUP BY {day_at}, COALESCE(model_id, '')"
    ),
    # (day, replays answered from an approval's record)
    "replays_by_day": (
        "SELECT {day_at}, count(*) FROM eg_events WHERE kind = 'replay' AND kind <> 'read' "
        "AND approval_id IS NOT NULL AND at >= :since AND at < :until "
        # as the proposals it is a rate over: a refused (out-of-scope) call's replays are not gated
        "AND approval_id NOT IN (SELECT id FROM eg_approvals WHERE status = 'rejected') GROUP BY {day_at}"
    ),
    # (day the record began waiting, erased with its call 0/1, records needing reconciliation now):
    # the backlog, not windowed. Erased: its error is a redaction marker with the redaction's entry
    # for that value (a late run erased with its call, `_late_erasure`: nothing settles it); a
    # marker edited in with no entry is no erasure, the record stays in the backlog.
    "backlog_by_day": (
        f"SELECT {{day_updated_at}}, CASE WHEN {_MARKED} AND EXISTS "
        "(SELECT 1 FROM eg_redacted r WHERE r.table_name = 'eg_idempotency' AND r.row_key = i.key "
        "AND r.column_name = 'error') THEN 1 ELSE 0 END, count(*) FROM eg_idempotency i "
        "WHERE i.status = 'needs_reconciliation' GROUP BY 1, 2"
    ),
    # (the redaction entry's sealed fields, its seal, the record's day) of each record "backlog_by_day"
    # counts as erased: a few rows (late runs after an erasure), whose seals the report checks
    "erased_backlog": (
        "SELECT r.redaction_id, r.table_name, r.row_key, r.column_name, r.commitment, r.args_hash, "
        f"r.kept_json, r.seal, {{day_updated_at}} FROM eg_idempotency i JOIN eg_redacted r "
        "ON r.table_name = 'eg_idempotency' AND r.row_key = i.key AND r.column_name = 'error' "
        f"WHERE i.status = 'needs_reconciliation' AND {_MARKED}"
    ),
}
_ESCAPE = (
    r'\\(["\\/bfnrt]|u(?![dD][89a-fA-F]|0000)[0-9a-fA-F]{4}'
    r"|u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
_STRING = '"(' + r'[^"\\\x01-\x1f]|' + _ESCAPE + ')*"'  # no NUL escape nor lone surrogate: ->> fails on them
_VALUE = f"({_STRING}|null|true|false|-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?)"
_MEMBER = f"{_STRING}\\s*:\\s*{_VALUE}\\s*"
#: A flat JSON object (what effectgate writes as an amendment's detail): PostgreSQL (15 has no
#: error-free JSON test) parses only a detail this matches, so a detail edited into something
#: else is not an edit, never a failed report; SQLite asks `json_valid`.
_FLAT_OBJECT = f"^\\s*\\{{\\s*({_MEMBER}(,\\s*{_MEMBER})*)?\\}}\\s*$"
#: When each of one role's decided approvals proposed in the window was decided, and when it was
#: proposed, from the append-only records (its `decided_at` and `created_at` columns are in a mutable
#: table no seal covers): its version's deny, else the last approve of the version's first grant
#: round (the one that decided it: a regrant after a lapse decides nothing new), and its first
#: "proposed" event (chained; a time that is not a number, as SQLite keeps text, is none): one
#: probe of each table's approval index per approval, so `LATENCY_P95` costs about 7 us each.
_LATENCY = (
    "SELECT (SELECT COALESCE(MIN(CASE WHEN d.decision = 'deny' THEN d.at END), MAX(CASE WHEN "
    "d.decision = 'approve' AND d.grant_round = 0 THEN d.at END)) FROM eg_decisions d WHERE "
    "d.approval_id = a.id AND d.version = a.version AND d.at + 0 = d.at) - (SELECT CASE WHEN "
    "e.at + 0 = e.at THEN e.at END FROM eg_events e WHERE e.approval_id = a.id AND e.kind = 'proposed' "
    "ORDER BY e.id LIMIT 1) AS x FROM eg_approvals a WHERE a.approver_role = :role AND a.status "
    "NOT IN ('rejected', 'pending', 'expired') AND a.created_at >= :since AND a.created_at < :until"
)
#: The p95 (nearest rank: the ceil(0.95 n)-th smallest, `report.p95_rank`) of those latencies that
#: are finite (NULL, NaN and infinity times 0 are not 0; a time SQLite kept as text is NULL above),
#: ranked over the same latencies it counts; no row when there are none. The LIMIT (no bound: the
#: largest 64-bit integer) is a fence: neither database then merges `_LATENCY` into the query
#: over it, which would copy `x`, and run its probes, once per use.
LATENCY_P95 = (
    "SELECT x FROM (SELECT x, row_number() OVER (ORDER BY x) AS r, count(*) OVER () AS n FROM "
    f"(SELECT x FROM ({_LATENCY} LIMIT 9223372036854775807) l WHERE x * 0 = 0) f) w "
    "WHERE r = (95 * n + 99) / 100"
)


def report(conn: Any, what: ReportQuery) -> Any:
    """The report's aggregate `what` for `conn`'s database (the dialect supplies days and JSON)."""
    day = {f"day_{c}": _dialect.utc_day(conn, c) for c in ("created_at", "at", "updated_at")}
    edited_by = _dialect.json_field(conn, "detail_json", "edited_by")
    pg = conn.dialect.name == "postgresql"
    valid = f"detail_json ~ '{_FLAT_OBJECT}'" if pg else "json_valid(detail_json)"
    fragments = {**day, "edited_by": f"CASE WHEN {valid} THEN {edited_by} END"}
    return sa.text(REPORT_QUERIES[what].format_map(fragments))


def window(since: float | None, until: float | None) -> dict[str, float]:
    """The bounds of [since, until), an open end as an infinite bound (one statement shape; both
    databases compare a float column with an infinite float)."""
    return {"since": -math.inf if since is None else since, "until": math.inf if until is None else until}
