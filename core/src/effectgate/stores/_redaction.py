"""Redaction targets and open calls (see `effectgate.redact` for the rules).

A `Target` is one row holding personal values: its table, its key, the personal columns'
current text, and what the rules need to decide (the user, the effect, the status, the args
hash), with the `Call` it belongs to; `is_open` tells whether that call may still run or is
still being decided (never erased). The rows are selected by `_redaction_sql.targets` (reading
`_personal_rows`, joined to their calls by `_target_calls`); selecting never changes anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._dialect import is_redacted

#: Approval statuses whose call may still run or is still being decided: never redacted (but
#: see `is_open`: an approved call that can never run is not open).
OPEN_APPROVALS = ("pending", "approved", "executing", "needs_reconciliation")
#: Idempotency statuses whose call is in flight or awaits reconciliation: never redacted.
OPEN_RECORDS = ("in_progress", "needs_reconciliation")
#: The retention kind of the records that name no effect class: events only (refusals of tools
#: absent from the table); every approval and execution has an effect class.
UNCLASSIFIED = "unclassified"


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
    #: The call the row belongs to (`_target_calls` fills it in): a row is open when its call is.
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
    whose grant lapsed unpresented after its approval's deadline (no regrant: `_decidable.Decidable.lapsed`);
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
    if t.table == "eg_idempotency":  # one erased with its call: `_target_calls._with_calls`
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
