"""Pooled connections and `os.fork`: a forked child never uses a connection its parent opened."""

from __future__ import annotations

import os
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

_PID = "effectgate_pid"


def fork_safe(engine: Engine) -> Engine:
    """A forked child never uses a connection its parent opened (SQLAlchemy's recipes for pools
    and `os.fork`): each connection records the process that opened it, and a checkout in
    another process discards it from the pool without closing it (the parent still uses it) and
    opens a fresh one. Without this a pre-fork server's workers shared the parent's sessions:
    statements of one worker read another's rows (a valid grant was refused as tampered), and
    workers hung. `_checkouts.Checkouts` forgets its kept connections on a fork the same way.

    The child also gets a pool of its own at once (`dispose(close=False)`: nothing of the
    parent's is closed): the parent's pool's lock is copied as it stood, so a fork while another
    thread was in a checkout or a checkin left it held by a thread the child does not have, and
    the child's first checkout waited for it forever."""

    @sa.event.listens_for(engine, "connect")
    def _opened_by(_dbapi_conn: Any, record: Any) -> None:
        record.info[_PID] = os.getpid()

    @sa.event.listens_for(engine, "checkout")
    def _same_process(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get(_PID, os.getpid()) != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None  # not closed: the parent's
            raise sa.exc.DisconnectionError(
                f"connection opened in process {record.info[_PID]}, checked out in {os.getpid()}"
            )

    _ENGINES.add(engine)  # one hook for all (Python never removes one: a hook per store leaked)
    return engine


#: The engines `fork_safe` made, while they live: each gets a pool of its own in a forked child.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _own_pools() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_pools)
