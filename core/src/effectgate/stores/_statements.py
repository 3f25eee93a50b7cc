"""The statements of the gate's hot transactions (propose, decide, claim, execute) as plain SQL.

They run on the driver's connection (`_dialect.run`): building and executing them through
SQLAlchemy cost more CPU than the database took to run them. Each is written once with `:name`
placeholders (`_dialect.driver_sql` turns them into the driver's paramstyle) and the same text on
SQLite and PostgreSQL: `INSERT ... ON CONFLICT DO NOTHING RETURNING` and `UPDATE ... RETURNING`
are both databases' syntax. Columns come from the table definitions in `records.py`; rows come
back as plain tuples in those columns' order. Statuses written into a statement are constants of
the code (checked below), never input: every value is a bound parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..canonical import _SURROGATE
from ..errors import StoreError
from ._queries import T_EXECUTIONS, T_IDEMPOTENCY, as_text
from .base import IdempotencyRecord, Status, from_json
from .records import APPROVAL_COLUMNS, DECISION_COLUMNS, ApprovalRow, DecisionRow

_WORD = re.compile(r"[a-z_]+")

IDEMPOTENCY_COLUMNS = tuple(c.name for c in T_IDEMPOTENCY.columns)
EXECUTION_COLUMNS = tuple(c.name for c in T_EXECUTIONS.columns if c.name != "id")
#: What an execution row holds for a value not given: the table's default, else NULL (as an
#: insert through SQLAlchemy would write it).
EXECUTION_DEFAULTS: dict[str, Any] = {
    c.name: getattr(c.default, "arg", None) for c in T_EXECUTIONS.columns if c.name != "id"
}
KEY_COLUMNS = ("key", "approval_id", "version", "origin_message_id", "created_at")
CLAIM_COLUMNS = (
    "key",
    "payload_hash",
    "status",
    "attempts",
    "created_at",
    "lease_owner",
    "lease_expires_at",
    "updated_at",
    "user_id",
)
DECISION_INSERT = tuple(c for c in DECISION_COLUMNS if c != "id")


def _name(column: str) -> str:
    # "key" is a keyword on both databases; quoting it is valid on both
    return '"key"' if column == "key" else column


def _list(columns: Sequence[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{_name(c)}" for c in columns)


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({_list(columns)}) VALUES ({', '.join(f':{c}' for c in columns)})"


def _statuses(statuses: Sequence[str]) -> str:
    for s in statuses:
        if not _WORD.fullmatch(s):  # a constant of the code; anything else is a bug
            raise ValueError(f"not a status: {s!r}")
    return ", ".join(f"'{s}'" for s in statuses)


_APPROVAL = f"SELECT {_list(APPROVAL_COLUMNS)} FROM eg_approvals"
APPROVAL = f"{_APPROVAL} WHERE id = :p_id"
APPROVAL_FOR_KEY = (
    f"SELECT {_list(APPROVAL_COLUMNS, 'a.')} FROM eg_approvals a "
    'JOIN eg_intent_keys k ON k.approval_id = a.id WHERE k."key" = :p_key'
)
KEY_VERSION = 'SELECT version FROM eg_intent_keys WHERE "key" = :p_key'
#: `status || ''` keeps SQLite off eg_approvals_status_created: with no statistics its planner
#: may walk that index, reading every pending approval of every session (eg_approvals_session
#: gives the session's in order). Newest first, as `APPROVALS_DUE`: propose and `expire()` mark
#: lapsed ones expired in one order (in two orders, each held a row the other waited for:
#: PostgreSQL ended one with a deadlock error).
_NEWEST_FIRST = "ORDER BY created_at DESC, id DESC"
PENDING_OF_SESSION = (
    f"{_APPROVAL} WHERE session_id = :p_session AND (status || '') = 'pending' {_NEWEST_FIRST}"
)
IN_FLIGHT_ELSEWHERE = (
    f"{_APPROVAL} WHERE subject_key = :p_subject AND session_id <> :p_session AND ("
    "(status = 'pending' AND expires_at > :p_now) OR (status = 'approved' AND "
    "(token_expires_at > :p_now OR token_used_at IS NOT NULL))) ORDER BY created_at LIMIT 1"
)
INSERT_APPROVAL = _insert("eg_approvals", APPROVAL_COLUMNS)
ADD_KEY = f'{_insert("eg_intent_keys", KEY_COLUMNS)} ON CONFLICT ("key") DO NOTHING RETURNING "key"'
ADD_DECISION = _insert("eg_decisions", DECISION_INSERT)
APPEND_EXECUTION = _insert("eg_executions", EXECUTION_COLUMNS)
_DECISIONS = f"SELECT {_list(DECISION_COLUMNS)} FROM eg_decisions WHERE approval_id = :p_id"
DECISIONS = f"{_DECISIONS} ORDER BY id"
APPROVALS_DUE = f"{_APPROVAL} WHERE status = 'pending' AND expires_at <= :p_now {_NEWEST_FIRST}"
DECISIONS_OF_VERSION = f"{_DECISIONS} AND version = :p_version ORDER BY id"

#: Whether a grant of an approval version was presented (its "token_used" event) or an execution
#: of it recorded: append-only, chained rows, unlike the approval's status and token_used_at.
GRANT_SPENT = (
    "SELECT 1 FROM eg_events WHERE approval_id = :p_id AND version = :p_version AND kind = 'token_used' "
    "UNION ALL SELECT 1 FROM eg_executions WHERE approval_id = :p_id AND version = :p_version LIMIT 1"
)

_IDEMPOTENCY = _list(IDEMPOTENCY_COLUMNS)
LOAD = f'SELECT {_IDEMPOTENCY} FROM eg_idempotency WHERE "key" = :p_key'
CLAIM = f'{_insert("eg_idempotency", CLAIM_COLUMNS)} ON CONFLICT ("key") DO NOTHING RETURNING "key"'


def update_approval(statuses: Sequence[str], *, with_version: bool, keys: Sequence[str]) -> str:
    """Compare-and-set on the approval's status (and version); returns its id when it changed."""
    sets = ", ".join(f"{k} = :v_{k}" for k in keys)
    sql = f"UPDATE eg_approvals SET {sets} WHERE id = :p_id AND status IN ({_statuses(statuses)})"
    if with_version:
        sql += " AND version = :p_version"
    return sql + " RETURNING id"


def transition(
    from_status: Sequence[Status], *, by_owner: bool, lease_expired: bool, keys: Sequence[str]
) -> str:
    """Move an idempotency record on from one of `from_status`; returns the updated record."""
    sets = ", ".join(f"{_name(k)} = :v_{k}" for k in keys)
    sql = f'UPDATE eg_idempotency SET {sets} WHERE "key" = :p_key AND status IN ({_statuses(from_status)})'
    if by_owner:
        sql += " AND lease_owner = :p_owner"
    if lease_expired:
        sql += " AND lease_expires_at <= :p_before"
    return f"{sql} RETURNING {_IDEMPOTENCY}"


def no_nul(value: Any) -> Any:
    """A value as a column stores it: text holding a NUL (a tool's error that quotes the model's
    arguments) with U+FFFD in its place, on both databases: PostgreSQL's text cannot hold NUL
    (the statement failed, leaving a definite failure's record in flight); JSON escapes it."""
    return value.replace("\x00", "\ufffd") if type(value) is str and "\x00" in value else value


def possible_id(approval_id: object) -> bool:
    """Whether `approval_id` could name a row: text without NUL or a lone surrogate (anything else
    names none, and the database refuses it in a query rather than finding nothing)."""
    if type(approval_id) is not str or "\x00" in approval_id:
        return False
    return approval_id.isascii() or _SURROGATE.search(approval_id) is None


def version_of(key: str, value: Any) -> int:
    """An intent key's recorded version as read back: an int, else (a column edited outside
    effectgate: SQLite keeps text or a real in it) a StoreError naming the key, not a bare
    ValueError from `int()` (or a huge real taken as a version)."""
    if type(value) is int:
        return value
    raise StoreError(
        f"intent key {key}: its recorded version is not a version number (edited outside effectgate)"
    )


_new = object.__new__


def approval_of(row: Sequence[Any]) -> ApprovalRow:
    """An approval read in `APPROVAL_COLUMNS` order. Its fields are set by one unpacking
    assignment (a row of any other length raises ValueError), not by a call with 35 keywords:
    the record of every read, twice per approved call. Checked against the columns below."""
    a: ApprovalRow = _new(ApprovalRow)
    (
        a.id,
        a.session_id,
        a.origin_message_id,
        a.user_id,
        a.agent_id,
        a.run_id,
        a.tool,
        a.effect,
        a.reversibility,
        a.owner,
        a.subject_key,
        a.subject_json,
        a.args_json,
        a.args_hash,
        a.approver_role,
        a.notes_json,
        a.approvals_required,
        a.status,
        a.version,
        a.created_at,
        a.updated_at,
        a.expires_at,
        a.decided_at,
        a.reason,
        a.row_fingerprint,
        a.table_fingerprint,
        a.policy_fingerprint,
        a.has_confirm,
        a.grants,
        a.seal,
        a.token_hash,
        a.token_kid,
        a.token_expires_at,
        a.token_used_at,
        a.model_id,
    ) = row
    a.has_confirm = bool(a.has_confirm)  # SQLite keeps a boolean as 0 or 1
    if bytes in (type(a.args_json), type(a.subject_json), type(a.notes_json)):  # a BLOB (SQLite)
        as_text(a)
    return a


def decision_of(row: Sequence[Any]) -> DecisionRow:
    """A decision read in `DECISION_COLUMNS` order, set as `approval_of` sets an approval."""
    d: DecisionRow = _new(DecisionRow)
    (
        d.id,
        d.approval_id,
        d.version,
        d.grant_round,
        d.approver_id,
        d.role,
        d.decision,
        d.reason,
        d.at,
        d.seal,
    ) = row
    return d


# the unpacking assignments above set every field, in the columns' order
_PROBE = approval_of(range(len(APPROVAL_COLUMNS)))
assert [getattr(_PROBE, c) for c in APPROVAL_COLUMNS if c != "has_confirm"] == [
    i for i, c in enumerate(APPROVAL_COLUMNS) if c != "has_confirm"
]
assert [getattr(decision_of(range(len(DECISION_COLUMNS))), c) for c in DECISION_COLUMNS] == list(
    range(len(DECISION_COLUMNS))
)


#: `IdempotencyRecord`'s fields, in `IDEMPOTENCY_COLUMNS` order (the result as its JSON text)
_RECORD_FIELDS = tuple(f.name for f in fields(IdempotencyRecord))
assert tuple("result" if c == "result_json" else c for c in IDEMPOTENCY_COLUMNS) == _RECORD_FIELDS


def record_of(row: Sequence[Any]) -> IdempotencyRecord:
    """An idempotency record read in `IDEMPOTENCY_COLUMNS` order, its result parsed. Its fields
    are set as one dict (a frozen dataclass's __init__ sets them one `object.__setattr__` at a
    time), as `approval_of` sets an approval's. A result that is not JSON is a StoreError naming
    the record: its call is neither answered with that text nor run again."""
    values = dict(zip(_RECORD_FIELDS, row, strict=True))
    try:
        values["result"] = from_json(values["result"])
    except (ValueError, RecursionError):  # edited outside effectgate: never replayed, nor run again
        raise StoreError(
            f"idempotency record {values['key']}: its stored result is not JSON (edited outside effectgate)"
        ) from None
    if not isinstance(values["lease_expires_at"], int | float | None):  # text edited into SQLite's REAL:
        values["lease_expires_at"] = math.inf  # as its SQL compares it (never expired), no TypeError
    record: IdempotencyRecord = _new(IdempotencyRecord)
    record.__dict__.update(values)
    return record
