"""The idempotency records a redaction or retention pass reaches that no execution names: a call
in flight, or a write whose worker died and that was settled without an execution row. Each
names the user its call was made for (schema 5); the records of older schemas name none."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from . import _queries as Q

#: How a write's idempotency key starts (`_execution.WRITE_PREFIX`): a retention rule for writes
#: reaches a write's record by it (a record names no effect class).
WRITE_KEYS = "w_"


def own_records(user_id: str | None, subject_keys: Any, effect: str | None, held: Any, old: Any) -> Any:
    """The condition on eg_idempotency of the records that `targets` reaches by their own columns
    (None: only those its executions name). A redaction of a user: the user's records (not one of
    a subject: a write's record does not tell its subject). A retention rule for writes: the
    records of writes older than the rule (`old`) of users not `held`."""
    i = Q.T_IDEMPOTENCY
    if user_id is not None:
        return None if subject_keys else i.c.user_id == user_id
    if effect != "write":
        return None
    mine = [i.c.key.startswith(WRITE_KEYS, autoescape=True), i.c.user_id.is_not(None), old]
    return sa.and_(*mine, sa.not_(i.c.user_id.in_(sorted(set(held))))) if held else sa.and_(*mine)
