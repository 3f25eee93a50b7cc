"""When versions of approvals were proposed, and with what pending time (`_deadline`: the sweep's
`Store.proposal_times`, and `for_erasure`): the first event (by id) that proposed or amended each
version, its `at` and its detail as stored (which records the gate's `pending_ttl` then). Of the
calls an erasure judges, only the pending and approved approvals are read: the others' openness
does not depend on a deadline."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from . import _queries as Q

if TYPE_CHECKING:
    from ._redaction import Target

#: The statuses whose openness depends on the deadline (`_redaction._row_open`).
JUDGED = ("pending", "approved")
#: Approvals per statement: an erasure may judge more than a statement binds.
_BATCH = 500
_FIRST = Q.proposal_times()


def proposal_times(conn: Connection, approval_ids: Collection[str]) -> dict[tuple[Any, Any], tuple[Any, Any]]:
    """(approval id, version) to the `at` and detail (as stored) of the first event (by id) that
    proposed or amended it; a version with none is left out (`Store.proposal_times`)."""
    ids = sorted(set(approval_ids))
    first: dict[tuple[Any, Any], tuple[Any, Any]] = {}
    for start in range(0, len(ids), _BATCH):
        for r in conn.execute(_FIRST, {"p_ids": ids[start : start + _BATCH]}):
            first.setdefault((r[0], r[1]), (r[2], r[3]))
    return first


def with_proposals(conn: Connection, approvals: dict[str, Target]) -> dict[str, Target]:
    """`approvals` (by id), those in `JUDGED` with `proposed` set: (at, detail) of the event that
    proposed or amended their version, (None, None) when there is none."""
    first = proposal_times(conn, [k for k, t in approvals.items() if t.status in JUDGED])
    return {
        k: replace(t, proposed=first.get((k, t.version), (None, None))) if t.status in JUDGED else t
        for k, t in approvals.items()
    }
