"""When the versions of the approvals an erasure judges were proposed, and with what pending time
(`_deadline.for_erasure`): the first event (by id) that proposed or amended each version, its `at`
and its detail as stored (which records the gate's `pending_ttl` then). Only the calls' pending and
approved approvals are read: the others' openness does not depend on a deadline."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _queries as Q

if TYPE_CHECKING:
    from ._redaction import Target

#: The statuses whose openness depends on the deadline (`_redaction._row_open`).
JUDGED = ("pending", "approved")
#: Approvals per statement: an erasure may judge more than a statement binds.
_BATCH = 500


def with_proposals(conn: Connection, approvals: dict[str, Target]) -> dict[str, Target]:
    """`approvals` (by id), those in `JUDGED` with `proposed` set: (at, detail) of the event that
    proposed or amended their version, (None, None) when there is none."""
    ids = sorted(k for k, t in approvals.items() if t.status in JUDGED)
    e = Q.T_EVENTS
    q = sa.select(e.c.approval_id, e.c.version, e.c.at, e.c.detail_json).where(
        e.c.kind.in_(("proposed", "amended"))
    )
    first: dict[tuple[Any, Any], tuple[Any, Any]] = {}
    for start in range(0, len(ids), _BATCH):
        for r in conn.execute(q.where(e.c.approval_id.in_(ids[start : start + _BATCH])).order_by(e.c.id)):
            first.setdefault((r.approval_id, r.version), (r.at, r.detail_json))
    return {
        k: replace(t, proposed=first.get((k, t.version), (None, None))) if t.status in JUDGED else t
        for k, t in approvals.items()
    }
