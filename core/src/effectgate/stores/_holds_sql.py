"""The SQL of legal holds (see `effectgate.redact`): a hold row's `released_at` is no seal, so
whether a hold stands is read from both the row and the append-only, chained `hold` and
`hold_released` events; either of them saying it stands keeps it (a refusal to erase is undone by
releasing the hold again; an erasure under a hold is not undone at all)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _queries as Q
from .records import HoldRow

MISSING = "(its eg_holds row is missing: placed by its hold event)"


def _hold_events(conn: Connection) -> tuple[dict[str, HoldRow], set[str]]:
    """The holds the `hold` events placed (id -> a row from the event), and the ids released."""
    e = Q.T_EVENTS
    q = sa.select(e.c.kind, e.c.at, e.c.detail_json).where(
        e.c.kind.in_(("hold", "hold_released")), Q.NOT_READ
    )
    placed: dict[str, HoldRow] = {}
    released: set[str] = set()
    for kind, at, text in conn.execute(q.order_by(e.c.id)):
        try:
            detail: Any = json.loads(text)
            hold_id, user_id, by = detail.get("hold_id"), detail.get("user_id"), detail.get("by")
        except (ValueError, TypeError, AttributeError, RecursionError):  # not written by `hold`
            continue
        if not isinstance(hold_id, str):
            continue
        if kind == "hold_released":
            released.add(hold_id)
        elif isinstance(user_id, str):
            placed[hold_id] = HoldRow(id=hold_id, user_id=user_id, reason=MISSING, placed_by=str(by), at=at)
    return placed, released


def holds(conn: Connection, *, active: bool) -> list[HoldRow]:
    """Every hold row; or the holds that stand: a row not released, and a hold placed by its event
    with no `hold_released` event (its row marked released, or gone, in the database alone), on
    the user its event names (a row whose `user_id` was edited is listed beside it, as it stands)."""
    rows = [HoldRow(**r._mapping) for r in conn.execute(sa.select(Q.T_HOLDS).order_by(Q.T_HOLDS.c.at))]
    if not active:
        return rows
    placed, released = _hold_events(conn)
    standing = {i: h for i, h in placed.items() if i not in released}
    out = [h for h in rows if h.released_at is None or h.id in standing]
    moved = [
        HoldRow(**{**h.model_dump(), "user_id": standing[h.id].user_id})
        for h in rows
        if h.id in standing and standing[h.id].user_id != h.user_id
    ]
    found = {h.id for h in rows}
    return out + moved + [h for i, h in standing.items() if i not in found]


def release(conn: Connection, hold_id: str, *, by: str, at: float) -> bool:
    """Mark a hold's row released (its `hold_released` event is the caller's); True if a row changed."""
    done = conn.execute(
        sa.update(Q.T_HOLDS).where(Q.T_HOLDS.c.id == hold_id).values(released_at=at, released_by=by)
    )
    return bool(done.rowcount)
