"""An approval's pending deadline as the gate derives it, never as its `expires_at` column (which
no seal covers) says: the `at` of the chained event that proposed or amended the row's version
(the first one: an event inserted later moves nothing, one edited after its checkpoint breaks the
chain the audit verifies) plus the policy's `pending_ttl` (the row's sealed policy fingerprint
names the policy; a row under another policy is refused by `Ledger.bar` before it is granted).

A deadline edited forward revives nothing, and one edited backward makes nothing lapse early:
the column is the copy that cards show and that the SQL listing candidates compares, and every
decision reads the derived value (`Decisions.decidable` puts it on the row it read, in the same
read; the sweep, `Ledger.expire`, re-checks its candidates). The audit reports a grant or an
expiry on the wrong side of it (`_audit_deadline`).
"""

from __future__ import annotations

import math
from typing import Any

from .errors import TamperedRecord
from .stores.protocol import Store
from .stores.records import ApprovalRow

#: The events that start a version's pending time: its proposal (version 1) or its amendment.
PROPOSING = ("proposed", "amended")


def derived(row: ApprovalRow, proposed_at: Any, ttl: float) -> float:
    """The deadline of `row`'s version, proposed at `proposed_at` (its event's `at`, as read);
    TamperedRecord when there is no such event, or its time is not one (edited in the database)."""
    if type(proposed_at) not in (int, float) or not math.isfinite(proposed_at):
        raise TamperedRecord(
            row.id, f"no event records when version {row.version} was proposed (edited in the database)"
        )
    return float(proposed_at) + ttl


def past(deadline: object, now: float) -> bool:
    """Whether an approval's deadline has passed; one that is not a number (text edited into a
    SQLite column) has: such a row is never decidable."""
    return not (isinstance(deadline, int | float) and deadline > now)


def lapsed(store: Store, conn: Any, rows: list[ApprovalRow], ttl: float, now: float) -> list[ApprovalRow]:
    """Those of `rows` (pending, as read in `conn`) whose deadline passed: of those whose column
    says so, those whose derived deadline passed too (one read for them all, none when no column
    says so). A version without its proposal event cannot be decided (`derived`): it lapses as
    its column says, which changes nothing else."""
    due = [r for r in rows if past(r.expires_at, now)]
    at = store.proposal_times(conn, [r.id for r in due]) if due else {}
    out = []
    for row in due:
        try:
            deadline = derived(row, at.get((row.id, row.version)), ttl)
        except TamperedRecord:
            deadline = -math.inf
        if deadline <= now:
            out.append(row)
    return out
