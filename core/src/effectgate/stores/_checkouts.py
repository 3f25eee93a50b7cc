"""Connections the store keeps checked out between its driver-level operations (`Checkouts`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

from ..errors import StoreError
from . import _dialect

if TYPE_CHECKING:
    from .sql import SQLStore


#: Connections whose transaction on the driver (`Held`) had a statement fail: it never commits.
FAILED: set[Connection] = set()


def raise_failure(conn: Connection, exc: Exception, sql: str, params: Any) -> NoReturn:
    """`_dialect.run`'s error, as SQLAlchemy's own execution raises it: wrapped in SQLAlchemy's
    types (what callers and the CLI handle), and a connection the server dropped invalidated in
    the pool. But SQLAlchemy rolls back a connection it sees in no transaction, and it does not
    see one begun on the driver (`Held`): every later statement of that block then committed by
    itself (half a transaction, its start lost). That transaction is left open, and never
    commits (`FAILED`): as the database left it (PostgreSQL: aborted; SQLite: the statement
    undone), and rolled back when its block ends."""
    dialect = conn.dialect
    if (
        conn.closed
        or conn.invalidated
        or conn.in_transaction()  # SQLAlchemy's own: it handles it
        or (
            isinstance(exc, dialect.loaded_dbapi.Error)
            and dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
        )
        or _dialect.idle(conn, conn.connection.driver_connection)  # one statement, no transaction
    ):
        conn._handle_dbapi_exception(exc, sql, params, None, None)
    FAILED.add(conn)
    base, hide = dialect.loaded_dbapi.Error, conn.engine.hide_parameters
    raise sa.exc.DBAPIError.instance(sql, params, exc, base, hide, dialect=dialect) from exc


class Checkouts:
    """Connections kept checked out between the store's driver-level operations, so the next one
    skips SQLAlchemy's checkout and return (PostgreSQL: 25-40 us of CPU per statement). `give`
    keeps at most the pool's size, only `idle` after a block that raised nothing, none while the
    pool is at its limit; anything else returns to the pool (rolled back or discarded), and an
    invalidated one `drain`s the kept ones. A forked child forgets them without touching them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._bind(engine.pool)
        self._idle: list[tuple[Connection, Any, int]] = []
        self._epoch, self._pid, self._origin = 0, os.getpid(), os.getpid()
        self.cursors: dict[Connection, Any] = {}  #: what runs the statements of each one taken
        self._orphans: list[Any] = []  # a forked child's copies of its parent's (see `take`)
        #: A store in memory is one connection (StaticPool) that every thread shares: its work
        #: runs one thread at a time, or a thread's statements ran inside another's transaction
        #: (and a connection given back rolled that transaction back, half-way).
        self.serial: Serial | None = None if isinstance(engine.pool, QueuePool) else Serial()

    def _bind(self, pool: Any) -> None:
        """Read the limits of the engine's pool (again in a forked child: `_fork` gave it its own)."""
        self._keep = pool.size() if isinstance(pool, QueuePool) else 0  # StaticPool: one connection
        self._busy: Callable[[], int] = pool.checkedout if isinstance(pool, QueuePool) else lambda: 0
        overflow: int = getattr(pool, "_max_overflow", -1)  # the pool's limit: size + overflow
        self._limit = self._keep + overflow if overflow >= 0 else float("inf")
        # Below its overflow limit the pool can open more connections, so fewer than `_limit` are
        # checked out (`checkedout()` is at most size + overflow): no need to count them under
        # the pool's lock, which `checkedout()` takes (`give`, every transaction)
        self._overflow: Callable[[], int] = pool.overflow if isinstance(pool, QueuePool) else lambda: 0
        self._spare = overflow if overflow >= 0 else float("inf")

    def serially(self) -> AbstractContextManager[Any]:
        return nullcontext() if self.serial is None else self.serial

    def take(self) -> tuple[Connection, Any, int]:
        """A connection, its driver connection, and the epoch it was checked out in."""
        if self._pid != os.getpid():  # forked: the parent's are kept, never given back to its
            # pool, whose lock a thread the child does not have may hold (in-use ones: older epoch)
            self._orphans.append((self._idle, self.cursors))
            self._pid, self._idle, self.cursors = os.getpid(), [], {}
            self._bind(self.engine.pool)
            self._epoch += 1
        try:
            return self._idle.pop()
        except IndexError:
            conn = self.engine.connect()
            driver: Any = conn.connection.driver_connection
            self.cursors[conn] = _dialect.statement_runner(conn, driver)
            return conn, driver, self._epoch

    def give(self, taken: tuple[Connection, Any, int], ok: bool) -> None:
        conn, driver, epoch = taken
        keep = ok and epoch == self._epoch and len(self._idle) < self._keep and _dialect.idle(conn, driver)
        if keep and (self._overflow() < self._spare or self._busy() < self._limit):
            self._idle.append(taken)
            return
        invalidated = conn.invalidated
        self._close(conn)
        if invalidated:
            self.drain()

    def drain(self) -> None:
        """Return every kept connection to the pool; one in use returns there when given back."""
        self._epoch += 1
        while self._pid == os.getpid() and self._idle:
            with suppress(IndexError):  # another thread took the last one
                self._close(self._idle.pop()[0])

    def close(self) -> None:
        """`drain`, then close the engine's pooled connections; in a forked child only forget
        them: those its parent opened are still the parent's (closing one ends its session)."""
        self.drain()
        self.engine.dispose(close=os.getpid() == self._origin)

    def _close(self, conn: Connection) -> None:
        self.cursors.pop(conn, None)
        conn.close()


class Serial:
    """`Checkouts.serial`: a reentrant lock that any thread may release, so that a read
    transaction streamed by a generator (`SQLStore.every_row`) and ended in another thread than
    the one that began it (a thread pool serving each chunk: Starlette's StreamingResponse) ends
    the lock with it; an RLock refused that release and stayed held: every later use hung. A
    forked child starts with it free: a thread that held it at the fork is not in the child."""

    __slots__ = ("_count", "_free", "_owner", "_pid")

    def __init__(self) -> None:
        self._free = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._count, self._pid = 0, os.getpid()

    def acquire(self) -> bool:
        if self._pid != os.getpid():
            self.__init__()  # type: ignore[misc]
        me = threading.get_ident()
        with self._free:
            if self._owner != me:
                while self._count:
                    self._free.wait()
                self._owner = me
            self._count += 1
        return True

    def release(self) -> None:
        with self._free:
            if not self._count:
                raise RuntimeError("release of a free lock")
            self._count -= 1
            if not self._count:
                self._owner = None
                self._free.notify()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class Held:
    """`SQLStore._connected`: a connection taken from the store's `Checkouts`, in a write
    transaction on its driver connection (`begin`: `_dialect.driver_begin`, committed on a clean
    exit, rolled back on an exception) or not, and given back (kept only after a clean exit).
    While something observes the engine's statements, `SQLStore._observed` instead. A class, not
    a generator context manager: four transactions per approved call made those a CPU cost."""

    __slots__ = ("_begin", "_other", "_store", "_taken")

    def __init__(self, store: SQLStore, begin: bool) -> None:
        self._store, self._begin = store, begin
        self._taken: tuple[Connection, Any, int] | None = None
        self._other: AbstractContextManager[Connection] | None = None

    def __enter__(self) -> Connection:
        store = self._store
        serial = store._checkouts.serial  # a store in memory: one thread at a time
        if serial is not None:
            serial.acquire()
        try:
            if not store._ready:
                store.check()
            if _dialect.observed(store.engine):
                self._other = store._observed()
                return self._other.__enter__()
            checkouts = store._checkouts
            self._taken = taken = checkouts.take()
            if self._begin:
                try:
                    _dialect.driver_begin(taken[0], taken[1])
                except BaseException:
                    checkouts.give(taken, False)
                    raise
            return taken[0]
        except BaseException:
            if serial is not None:
                serial.release()
            raise

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        serial = self._store._checkouts.serial
        try:
            if self._other is not None:
                return self._other.__exit__(typ, exc, tb)
            taken, ok = self._taken, False
            assert taken is not None
            try:
                if self._begin:
                    failed = bool(FAILED) and taken[0] in FAILED  # a statement of it failed
                    try:
                        _dialect.driver_end(taken[0], taken[1], commit=typ is None and not failed)
                    except Exception:
                        # A ROLLBACK that fails after the block raised (its connection lost: the
                        # server ended the session mid-transaction) does not replace the block's
                        # error, which names the loss; the connection is discarded below.
                        if typ is None:
                            raise
                    finally:
                        if FAILED:  # also one its COMMIT added
                            FAILED.discard(taken[0])
                    if failed and typ is None:
                        raise StoreError(
                            "a statement of this transaction failed and its error was caught "
                            "inside it: the transaction was rolled back, nothing of it is written"
                        )
                ok = typ is None
            finally:
                self._store._checkouts.give(taken, ok)
            return None
        finally:
            if serial is not None:
                serial.release()


@contextmanager
def reading(store: SQLStore) -> Iterator[Connection]:
    """`SQLStore.reading`: a read-only transaction (SQLite: DEFERRED, so it never waits for the
    write lock); on a store in memory, one thread at a time (`Checkouts.serial`)."""
    with store._checkouts.serially():
        if not store._ready:
            store.check()
        with store.engine.connect().execution_options(**{_dialect.READONLY: True}) as conn, conn.begin():
            yield conn
