"""The SQL of redaction, retention and legal holds (see `effectgate.redact` for the rules).

A `Target` is one row holding personal values: its table, its key, the personal columns'
current text, and what the rules need to decide (the user, the effect, the status, the args
hash). Selecting never changes anything; `overwrite` writes redaction markers into the personal
columns only (the append-only triggers refuse anything else).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._json import same_json
from ..table import _as_set
from . import _holds_sql
from . import _queries as Q
from ._dialect import is_redacted
from ._proposing import with_proposals
from ._unnamed import own_records
from .records import PERSONAL, ApprovalRow, DecisionRow, HoldRow, RedactedRow

#: Approval statuses whose call may still run or is still being decided: never redacted (but
#: see `is_open`: an approved call that can never run is not open).
OPEN_APPROVALS = ("pending", "approved", "executing", "needs_reconciliation")
#: Idempotency statuses whose call is in flight or awaits reconciliation: never redacted.
OPEN_RECORDS = ("in_progress", "needs_reconciliation")
#: The retention kind of the records that name no effect class: events only (refusals of tools
#: absent from the table); every approval and execution has an effect class.
UNCLASSIFIED = "unclassified"

_TABLES: dict[str, sa.Table] = {
    "eg_approvals": Q.T_APPROVALS,
    "eg_executions": Q.T_EXECUTIONS,
    "eg_events": Q.T_EVENTS,
    "eg_decisions": Q.T_DECISIONS,
    "eg_idempotency": Q.T_IDEMPOTENCY,
}
_KEYS = {"eg_idempotency": "key"}


@dataclass(frozen=True)
class Target:
    """One row with personal values (see the module docstring)."""

    table: str
    key: str
    values: Mapping[str, str | None]
    user_id: str | None = None
    effect: str | None = None
    status: str | None = None
    args_hash: str | None = None
    approval_id: str | None = None
    idempotency_key: str | None = None
    subject_key: str | None = None
    expires_at: float | None = None  # unsealed: see `_deadline.for_erasure`
    version: int | None = None
    #: When its version was proposed, and the event's detail (`_proposing`): a call's approval only.
    proposed: tuple[Any, Any] | None = None
    token_expires_at: float | None = None
    token_used_at: float | None = None
    tool: str | None = None
    session_id: str | None = None
    origin_message_id: str | None = None
    #: The call the row belongs to (`targets` fills it in): a row is open when its call is.
    call: Call | None = None


@dataclass(frozen=True)
class Call:
    """The call a target row belongs to: its id (the approval id, or a write's idempotency key),
    its approval (status fields only; None for a write) and the statuses of its idempotency
    records. Every row of an open call is open: its approval, executions, events, decisions and
    records (`is_open`)."""

    id: str
    approval: Target | None
    records: tuple[str, ...]
    #: The approvals an event names in its detail (`approval_ids`) but not in its approval id
    #: column, e.g. the LangGraph adapter's record of an interrupt that showed several calls: the
    #: event is open while any of them is (an answer to that interrupt is checked against it).
    named: tuple[Target, ...] = ()


#: What `is_open` reads of an approval besides its status (and the tool, which with the args
#: hash lets `redact` check the stored arguments before erasing them).
_APPROVAL_EXTRA = (
    "tool",
    "user_id",
    "effect",
    "status",
    "args_hash",
    "subject_key",
    "expires_at",
    "version",
    "token_expires_at",
    "token_used_at",
)


def is_open(t: Target, now: float, deadlines: Mapping[str, float] | None = None) -> bool:
    """Whether the call of a target row may still run or is still being decided (never erased):
    every row of such a call is open, not only its approval and idempotency record (`Call`).
    An approved call that can never run is not open: a shadow call (approved, never run) and one
    whose grant lapsed unpresented after its approval's deadline (no regrant: `_decisions.lapsed`);
    nor is a pending one past its deadline (the gate answers it `expired`, swept or not).
    `deadlines`: each approval's deadline by id, as `_deadline.for_erasure` derives it (never its
    `expires_at` column); one not listed has not passed."""
    until = deadlines or {}
    if t.call is not None:
        if any(status in OPEN_RECORDS for status in t.call.records):
            return True
        if any(_row_open(a, now, until) for a in t.call.named):
            return True
        return t.call.approval is not None and _row_open(t.call.approval, now, until)
    return _row_open(t, now, until)


def call_id(t: Target) -> str:
    """The id of a target row's call (the row's own key when it belongs to no call)."""
    return t.call.id if t.call is not None else t.key


def _row_open(t: Target, now: float, deadlines: Mapping[str, float]) -> bool:
    if t.table == "eg_idempotency":  # one erased with its call: `_with_calls`
        return t.status in OPEN_RECORDS and not is_redacted(t.values.get("error"))
    if t.table != "eg_approvals" or t.status not in OPEN_APPROVALS:
        return False
    deadline_passed = deadlines.get(t.key, math.inf) <= now
    if t.status == "pending":  # past its deadline, swept or not, it is expired (`_deadline`)
        return not deadline_passed
    if t.status != "approved":
        return True
    if (t.subject_key or "").startswith("shadow:"):
        return False
    grant_lapsed = t.token_used_at is None and (t.token_expires_at or 0) <= now
    return not (grant_lapsed and deadline_passed)


def _key(table: str) -> sa.Column[Any]:
    return _TABLES[table].c[_KEYS.get(table, "id")]


def _select(conn: Connection, table: str, where: Any, extra: Sequence[str]) -> list[Target]:
    t = _TABLES[table]
    columns = [_key(table), *(t.c[c] for c in PERSONAL[table]), *(t.c[c] for c in extra)]
    key, personal = _key(table).name, PERSONAL[table]
    rows = conn.execute(sa.select(*columns).where(where).order_by(_key(table)))
    return [
        Target(table=table, key=str(m[key]), values={c: m[c] for c in personal}, **{n: m[n] for n in extra})
        for m in (row._mapping for row in rows)
    ]


def _in(column: sa.Column[Any], values: Iterable[str]) -> Any:
    return column.in_(listed) if (listed := sorted(set(values))) else sa.false()


#: Values per IN list: a user's or a rule's records can number hundreds of thousands, beyond
#: SQLite's (32,766) and PostgreSQL's (65,535) bound parameters per statement.
_BATCH = 500


def _batches(values: Iterable[str]) -> Iterator[list[str]]:
    listed = sorted(set(values))
    for start in range(0, len(listed), _BATCH):
        yield listed[start : start + _BATCH]


def _select_in(
    conn: Connection, table: str, col: Any, values: Iterable[str], extra: Sequence[str], also: Any = True
) -> list[Target]:
    """`_select` of the rows whose `col` is one of `values` (and `also`), a batch per statement."""
    found = [
        t for batch in _batches(values) for t in _select(conn, table, sa.and_(col.in_(batch), also), extra)
    ]
    return sorted(found, key=lambda t: (int(t.key) if t.key.isdigit() else 0, t.key))


def targets(
    conn: Connection,
    *,
    user_id: str | None = None,
    subject_keys: Sequence[str] = (),
    effect: str | None = None,
    before: float | None = None,
    held: Sequence[str] = (),
) -> list[Target]:
    """The rows a redaction (`user_id`, optionally narrowed to approvals of `subject_keys`) or a
    retention rule (`effect` and `before`: records of that effect, or of none for `UNCLASSIFIED`,
    older than `before`) reaches, each with its `Call` (so `is_open` reads the whole call).
    Records of `held` users are left out. Decisions and idempotency records follow the approvals and
    executions selected (a redaction's, also the user's records), and so do the events that name an
    approval selected but no user (notifier events recorded before they named the approval's user)."""
    a, e, ev = Q.T_APPROVALS, Q.T_EXECUTIONS, Q.T_EVENTS
    where_a: list[Any] = [sa.not_(_in(a.c.user_id, held))]
    where_e: list[Any] = [sa.not_(_in(e.c.user_id, held))]
    where_ev: list[Any] = [sa.not_(_in(ev.c.user_id, held)), ev.c.user_id.is_not(None)]
    if user_id is not None:
        where_a.append(a.c.user_id == user_id)
        where_e.append(e.c.user_id == user_id)
        where_ev.append(ev.c.user_id == user_id)
    if subject_keys:
        where_a.append(_in(a.c.subject_key, subject_keys))
    if effect == UNCLASSIFIED:
        where_a.append(sa.false())
        where_e.append(sa.false())
        where_ev.append(sa.or_(ev.c.effect.is_(None), ev.c.effect == ""))
    elif effect is not None:
        where_a.append(a.c.effect == effect)
        where_e.append(e.c.effect == effect)
        where_ev.append(ev.c.effect == effect)
    if before is not None:
        where_a.append(a.c.updated_at < before)
        where_e.append(e.c.at < before)
        where_ev.append(ev.c.at < before)
    approvals = _select(conn, "eg_approvals", sa.and_(*where_a), _APPROVAL_EXTRA)
    ids = [t.key for t in approvals]
    selected = sa.select(a.c.id).where(sa.and_(*where_a)).scalar_subquery()  # `ids`, in SQL
    # an event naming a selected approval and no user is that approval's user's
    unnamed: list[Any] = [ev.c.user_id.is_(None), ev.c.approval_id.in_(selected)]
    if before is not None:
        unnamed.append(ev.c.at < before)
    events_where = sa.or_(sa.and_(*where_ev), sa.and_(*unnamed))
    if subject_keys:  # only what belongs to the subject's approvals
        where_e.append(e.c.approval_id.in_(selected))
        events_where = sa.and_(events_where, ev.c.approval_id.in_(selected))
    executions = _select(conn, "eg_executions", sa.and_(*where_e), _EXECUTION_EXTRA)
    events = _select(conn, "eg_events", events_where, _EVENT_EXTRA)
    # each row by its own age: a record a later run under the same key updated is younger
    d, i = Q.T_DECISIONS, Q.T_IDEMPOTENCY
    old_d, old_i = (True, True) if before is None else (d.c.at < before, i.c.updated_at < before)
    decisions = _select_in(conn, "eg_decisions", d.c.approval_id, ids, ("approval_id",), old_d)
    keys = [t.idempotency_key for t in executions if t.idempotency_key]
    records = _select_in(conn, "eg_idempotency", i.c.key, keys, ("status",), old_i)
    own = own_records(user_id, subject_keys, effect, held, old_i)  # those no execution names
    mine = _select(conn, "eg_idempotency", own, ("status",)) if own is not None else []
    records = list({t.key: t for t in (*records, *mine)}.values())
    return _with_calls(conn, [*approvals, *executions, *events, *decisions, *records])


_EXECUTION_EXTRA = (
    "user_id",
    "effect",
    "status",
    "args_hash",
    "approval_id",
    "idempotency_key",
    "tool",
    "session_id",
    "origin_message_id",
)
_EVENT_EXTRA = ("user_id", "effect", "approval_id", "tool", "args_hash", "session_id", "origin_message_id")


def _origin(t: Any) -> tuple[Any, ...]:
    """What ties a write's events to its execution (neither names an approval): the same tool,
    arguments, session and message (the write's idempotency key is made of them)."""
    return (t.tool, t.args_hash, t.session_id, t.origin_message_id)


def _with_calls(conn: Connection, rows: list[Target]) -> list[Target]:
    """Each row with its `Call`, read from the whole ledger (a call's approval or records may be
    outside the selection: younger than a retention rule's age, or of another effect)."""
    e, i = Q.T_EXECUTIONS, Q.T_IDEMPOTENCY
    ids = {t.key for t in rows if t.table == "eg_approvals"} | {t.approval_id for t in rows if t.approval_id}
    named = {t.key: _named(t) for t in rows if t.table == "eg_events" and not t.approval_id}
    ids |= {aid for listed in named.values() for aid in listed}
    # a read has no execution row: only the other events that name no approval are a write's
    writes = {
        t.args_hash
        for t in rows
        if t.table == "eg_events" and not t.approval_id and t.args_hash and t.effect != "read"
    }
    keys_of: dict[str, set[str]] = {}  # approval id -> its idempotency keys
    write_key: dict[tuple[Any, ...], str] = {}
    approval_of: dict[str, str] = {}
    q = sa.select(
        e.c.approval_id, e.c.idempotency_key, e.c.tool, e.c.args_hash, e.c.session_id, e.c.origin_message_id
    )
    found = [r for batch in _batches(ids) for r in conn.execute(q.where(e.c.approval_id.in_(batch)))]
    found += [r for batch in _batches(writes) for r in conn.execute(q.where(e.c.args_hash.in_(batch)))]
    for r in found:
        if r.approval_id:
            keys_of.setdefault(r.approval_id, set()).add(r.idempotency_key)
            approval_of[r.idempotency_key] = r.approval_id
        else:
            write_key[_origin(r)] = r.idempotency_key
    a = Q.T_APPROVALS
    approvals = {t.key: t for t in _select_in(conn, "eg_approvals", a.c.id, ids, _APPROVAL_EXTRA)}
    approvals = with_proposals(conn, approvals)
    keys = {k for found in keys_of.values() for k in found} | set(write_key.values())
    keys |= {t.idempotency_key for t in rows if t.idempotency_key} | {
        t.key for t in rows if t.table == "eg_idempotency"
    }
    status = {  # a record erased with its call (a late run reopened it) never runs nor is settled
        r.key: "erased" if is_redacted(r.error) else r.status
        for batch in _batches(keys)
        for r in conn.execute(sa.select(i.c.key, i.c.status, i.c.error).where(i.c.key.in_(batch)))
    }
    out = []
    for t in rows:
        key = t.key if t.table == "eg_idempotency" else t.idempotency_key
        if t.table == "eg_events" and not t.approval_id:
            key = write_key.get(_origin(t))
        aid = t.key if t.table == "eg_approvals" else t.approval_id or approval_of.get(key or "")
        if aid is None and key is None:
            listed = named.get(t.key, ()) if t.table == "eg_events" else ()
            listing = tuple(approvals[n] for n in listed if n in approvals)
            out.append(
                replace(t, call=Call(id=listed[0], approval=None, records=(), named=listing)) if listed else t
            )
            continue
        own = keys_of.get(aid, set()) if aid else set()
        records = tuple(status[k] for k in sorted(own | ({key} if key else set())) if k in status)
        call = Call(id=aid or key or t.key, approval=approvals.get(aid) if aid else None, records=records)
        out.append(replace(t, call=call))
    return out


def _named(t: Target) -> tuple[str, ...]:
    """The approval ids an event's detail lists in `approval_ids` (see `Call.named`)."""
    text = t.values.get("detail_json") or ""
    if '"approval_ids"' not in text:  # most events name none: no parse
        return ()
    listed = (_json_object(text) or {}).get("approval_ids")
    return tuple(sorted({a for a in listed if isinstance(a, str)})) if isinstance(listed, list) else ()


def of_subject(rows: Sequence[Target], keys: Sequence[str], subject: Mapping[str, Any]) -> list[Target]:
    """The rows of one subject among a user's: the calls of the approvals whose subject key is
    one of `keys`, and the ungated calls (writes) whose arguments hold every field of `subject`
    with that value, a list as the set it names (a write records no subject key, only its
    arguments). A read records no arguments, only their hash: it is not found by subject (a
    redaction of the user finds it)."""
    calls = {t.key for t in rows if t.table == "eg_approvals" and t.subject_key in keys}
    for t in rows:
        if t.table == "eg_executions" and not t.approval_id and t.call is not None:
            args = _json_object(t.values.get("args_json"))
            if args is not None and all(
                k in args and same_json(_as_set(args[k]), _as_set(v)) for k, v in subject.items()
            ):
                calls.add(t.call.id)
    # a note naming several calls (`Call.named`) is the subject's when any is, whichever sorts first
    return [t for t in rows if t.call is not None and {t.call.id, *(a.key for a in t.call.named)} & calls]


def _json_object(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def overwrite(conn: Connection, table: str, key: str, values: Mapping[str, str]) -> None:
    """Write redaction markers into personal columns of one row."""
    if unknown := set(values) - set(PERSONAL[table]):
        raise ValueError(f"{table}: {sorted(unknown)} are not personal columns")
    column = _key(table)
    typed: Any = int(key) if column.type.python_type is int else key
    conn.execute(sa.update(_TABLES[table]).where(column == typed).values(**values))


class RedactionSQL:
    """The store's redaction, retention and hold primitives (`protocol.RedactionLedger`); mixed
    into `SQLStore`. Each takes the caller's transaction."""

    def redaction_targets(self, conn: Connection, **where: Any) -> list[Target]:
        """`targets(conn, **where)`: see there and `protocol.RedactionLedger`."""
        return targets(conn, **where)

    def overwrite_personal(self, conn: Connection, table: str, key: str, values: Mapping[str, str]) -> None:
        overwrite(conn, table, key, values)

    def append_redacted(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        if entries:
            conn.execute(sa.insert(Q.T_REDACTED), list(entries))

    def redacted(self, conn: Connection) -> list[RedactedRow]:
        q = sa.select(Q.T_REDACTED).order_by(Q.T_REDACTED.c.id)
        return [RedactedRow(**r._mapping) for r in conn.execute(q)]

    def add_hold(self, conn: Connection, hold: HoldRow) -> None:
        conn.execute(sa.insert(Q.T_HOLDS), hold.model_dump())

    def release_hold(self, conn: Connection, hold_id: str, *, by: str, at: float) -> bool:
        return _holds_sql.release(conn, hold_id, by=by, at=at)

    def holds(self, conn: Connection, *, active: bool = True) -> list[HoldRow]:
        return _holds_sql.holds(conn, active=active)

    def sealed_sample(
        self, conn: Connection, *, limit: int = 3
    ) -> tuple[list[ApprovalRow], list[DecisionRow]]:
        """The `limit` most recently written approvals and decisions (their seals tell which
        keyring the ledger is sealed with: `chain.check_keyring`)."""
        a, d = Q.T_APPROVALS, Q.T_DECISIONS
        approvals = conn.execute(sa.select(a).order_by(a.c.updated_at.desc(), a.c.id).limit(limit))
        decisions = conn.execute(sa.select(d).order_by(d.c.id.desc()).limit(limit))
        return [Q._approval_of(r) for r in approvals], [Q._decision_of(r) for r in decisions]
