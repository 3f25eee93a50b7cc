"""The store's redaction, retention and hold primitives (`RedactionSQL`, mixed into `SQLStore`),
and the rows a redaction or a retention rule reaches (`targets`; see `effectgate.redact` for the
rules and `_redaction` for what a target is)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _holds_sql
from . import _queries as Q
from ._personal_rows import _in, _select, _select_in, overwrite
from ._redaction import _APPROVAL_EXTRA, UNCLASSIFIED, Target
from ._target_calls import _with_calls
from ._unnamed import own_records
from .records import ApprovalRow, DecisionRow, HoldRow, RedactedRow


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
