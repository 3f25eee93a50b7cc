"""An approval's pending deadline as the gate derives it, never as its `expires_at` column (which
no seal covers) says: the `at` of the chained event that proposed or amended the row's version
(the first one: an event inserted later moves nothing, one edited after its checkpoint breaks the
chain the audit verifies) plus the `pending_ttl` that event records, the deadline its proposal
announced, so every process sharing the ledger derives one deadline whatever its own policy's
timeouts (which the policy fingerprint leaves out); the deciding policy's `pending_ttl` only for
an event that records none (written before round 29b).

A deadline edited forward revives nothing, and one edited backward makes nothing lapse early:
the column is the copy that cards show and that the SQL listing candidates compares, and every
decision reads the derived value (`Decidable.decidable` puts it on the row it read, in the same
read; the sweep, `Ledger.expire`, re-checks its candidates). The audit reports a grant or an
expiry on the wrong side of it (`_audit_deadline`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._json import parse
from .effects import Policy
from .errors import TamperedRecord
from .stores._redaction import Target
from .stores.protocol import Store
from .stores.records import ApprovalRow

#: The events that start a version's pending time: its proposal (version 1) or its amendment.
PROPOSING = ("proposed", "amended")


def derived(row: ApprovalRow, proposed: tuple[Any, Any] | None, ttl: float) -> float:
    """The deadline of `row`'s version from the (`at`, detail) of its proposing event, as read:
    its `at` plus the `pending_ttl` it records (`ttl` when it records none). TamperedRecord when
    there is no such event, or its time is not one (edited in the database)."""
    at, detail = proposed or (None, None)
    if at is None or not _time(at):
        raise TamperedRecord(
            row.id, f"no event records when version {row.version} was proposed (edited in the database)"
        )
    return float(at) + (_ttl(detail) or ttl)


def _time(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _ttl(detail: Any) -> float | None:
    """The `pending_ttl` a proposing event records (its detail, as stored), None without one."""
    try:
        value = parse(detail) if isinstance(detail, str) else detail
    except ValueError:  # erased (a marker is JSON too), or edited
        return None
    ttl: Any = value.get("pending_ttl") if isinstance(value, dict) else None
    return float(ttl) if _time(ttl) and ttl > 0 else None


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
    proposed = store.proposal_times(conn, [r.id for r in due]) if due else {}
    out = []
    for row in due:
        try:
            deadline = derived(row, proposed.get((row.id, row.version)), ttl)
        except TamperedRecord:
            deadline = -math.inf
        if deadline <= now:
            out.append(row)
    return out


_DEFAULT_TTL = Policy().pending_ttl


def for_erasure(targets: Sequence[Target], policy: Policy | None) -> dict[str, float]:
    """The deadline `redact` and `retain` judge each pending or approved approval of `targets`'
    calls by (`stores._redaction.is_open`), by id: as the gate derives it (`derived`), the `at` of
    the event that proposed or amended its version (`stores._proposing`) plus the `pending_ttl` it
    records (`policy.pending_ttl`, the gate's, when it records none); -inf for a version without
    such an event (the gate can never decide it). Without `policy`, the later of its `expires_at`
    column and that deadline (the default's `pending_ttl` when the event records none): an edit of
    the column can only keep a call longer."""
    out: dict[str, float] = {}
    for t in targets:
        for a in (t, *((t.call.approval, *t.call.named) if t.call is not None else ())):
            if a is None or a.proposed is None or a.key in out:
                continue
            at, detail = a.proposed
            if not _time(at):
                out[a.key] = -math.inf  # the gate can never decide it (`derived`)
            elif policy is not None:
                out[a.key] = float(at) + (_ttl(detail) or policy.pending_ttl)
            else:
                column = float(a.expires_at) if _time(a.expires_at) else -math.inf  # type: ignore[arg-type]
                out[a.key] = max(column, float(at) + (_ttl(detail) or _DEFAULT_TTL))
    return out
