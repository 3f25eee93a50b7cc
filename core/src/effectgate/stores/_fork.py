"""Pooled connections and `os.fork`: a forked child never uses a connection its parent opened."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

_PID = "effectgate_pid"


def fork_safe(engine: Engine) -> Engine:
    """A forked child never uses a connection its parent opened (SQLAlchemy's recipe for pools
    and `os.fork`): each connection records the process that opened it, and a checkout in
    another process discards it from the pool without closing it (the parent still uses it) and
    opens a fresh one. Without this a pre-fork server's workers shared the parent's sessions:
    statements of one worker read another's rows (a valid grant was refused as tampered), and
    workers hung. `_checkouts.Checkouts` forgets its kept connections on a fork the same way."""

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

    return engine
