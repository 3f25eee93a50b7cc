"""Read records, written in batches off the caller's path.

A read must cost microseconds, and a SQLite commit costs tens of them, so reads are appended to
a buffer here, as rows already built on the call path (`records.READ_COLUMNS`, the args hash
computed when the call was made), and written: by a background thread at most `interval`
seconds later (sooner when `batch` records wait), on `flush()` and `close()`, and at interpreter
exit (a multiprocessing child's too, which skips atexit: `_flush_all`). The thread ends after
`IDLE` seconds with nothing to write (a later read starts another), so a gate dropped without
`close()` keeps no thread, nor its store; one that cannot start (the process at its thread limit)
is tried again at the next read. A read made once the interpreter exits (a thread it joins, a
later atexit hook, a daemon thread) is written on its caller's path: no writer is left to lose
it. A batch whose write fails goes back to the buffer, tried again every `interval` (logged: the
first failure with its traceback, then a line at most every `QUIET` seconds, and the write that
succeeds again). The buffer holds at most `LIMIT` records: the read that finds it full writes it
on the caller's path (waiting for a batch the writer holds), and when that fails too (the
database has been failing all along), raises `StoreError` instead of returning its result, its
record kept in the buffer: no record is dropped, and reads are refused loudly, not served without
a record, until the database takes them again. A log whose `close()` could not write is kept
alive (its gate may be dropped) until its records are written, at exit at the latest; records
that cannot be written at exit are logged as lost (an ERROR with their count). A forked child
starts with an empty buffer and a writer of its own (the rows buffered before the fork are the
parent's to write).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import threading
import time
import weakref
from typing import Any

from ._logging import logger
from .errors import StoreError
from .stores.protocol import Store

_log = logger("effectgate")

IDLE = 30.0  #: seconds with nothing to write after which the thread ends
QUIET = 60.0  #: seconds between the warnings of a writer whose writes keep failing
LIMIT = 100_000  #: records buffered at most (the read that finds as many writes them itself)

ReadRow = tuple[Any, ...]


class ReadLog:
    def __init__(
        self, store: Store, *, batch: int = 4096, interval: float = 0.2, limit: int | None = None
    ) -> None:
        self._store = store
        self._limit = max(1, LIMIT if limit is None else limit)
        self._batch = max(1, min(batch, self._limit))  # never more than the buffer holds
        self._interval = interval
        self._exiting = False  # the interpreter exits: no thread starts, reads are written inline
        self._forked()
        _LOGS.add(self)  # written at exit (`_close_all`), renewed in a forked child

    def _forked(self) -> None:
        """Fresh state: at construction, and in a forked child (whose parent's writer thread and
        locks are not its own, and whose parent writes the rows it buffered)."""
        # deque.append and popleft are atomic: the caller appends without a lock, and the writer
        # takes exactly the rows it pops, so no row lands in a batch already written
        self._items: collections.deque[ReadRow] = collections.deque()
        self._lock = threading.Lock()  # starting the background thread
        self._writing = threading.Lock()  # one writer at a time, so flush() sees every record
        self._wake = threading.Event()  # the running thread's: close() gives a later one its own
        self._thread: threading.Thread | None = None

    def add(self, row: ReadRow) -> None:
        """Buffer one read record (a tuple in `records.READ_COLUMNS` order)."""
        items = self._items
        items.append(row)
        if self._thread is None:
            self._start()
        if (n := len(items)) >= self._batch:
            if n >= self._limit:
                self._overflow()
            elif not self._wake.is_set():
                self._wake.set()

    def _overflow(self) -> None:
        """The buffer is full: write it here, or refuse the read that filled it (its record kept)."""
        try:
            self.flush()
        except Exception as exc:
            raise StoreError(
                f"{len(self._items)} read records could not be written ({exc!r}); reads are refused "
                "until the database takes them (the records stay buffered)"
            ) from exc

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._exiting:
                thread = threading.Thread(
                    target=self._run, args=(self._wake,), name="effectgate-readlog", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # at the thread limit: buffered, the next add retries
                    _log.warning("effectgate: the read writer could not start (%s); retried", exc)
                    return
                self._thread = thread
        if self._exiting:  # the interpreter exits (`_flush_at_exit`): no writer starts any more,
            self._overflow()  # so written here, never left for one (`os._exit` would end it)

    def _take(self) -> list[ReadRow]:
        pop = self._items.popleft
        return [pop() for _ in range(len(self._items))]  # only this writer pops (under _writing)

    def _restore(self, items: list[ReadRow]) -> None:
        self._items.extendleft(reversed(items))  # back in front, in their order

    def flush(self) -> None:
        """Write everything buffered so far; waits for a batch the background writer holds."""
        with self._writing:
            items = self._take()
            if not items:
                return
            try:
                with self._store.transaction() as conn:
                    self._store.append_reads(conn, items)
            except BaseException:
                self._restore(items)
                raise
            _HELD.discard(self)

    def _run(self, wake: threading.Event) -> None:
        idle_since = time.monotonic()
        failed, told = 0, 0.0  # writes failed in a row; when that was last logged
        while wake is self._wake:  # until close() or IDLE (a later add starts another thread)
            wake.wait(self._interval)
            wake.clear()
            busy = bool(self._items)
            try:
                self.flush()
            except Exception:  # the records stay buffered; the next round or close() retries
                failed, now = failed + 1, time.monotonic()
                if failed == 1:  # the first with its traceback, then a line every QUIET seconds
                    _log.warning("effectgate: writing read records failed; retrying", exc_info=True)
                    told = now
                elif now - told >= QUIET:
                    told = now
                    _log.warning(
                        "effectgate: writing read records still fails (%d attempts, %d records "
                        "buffered); retrying",
                        failed,
                        len(self._items),
                    )
            else:
                if failed:  # seen wherever the failure was
                    _log.warning("effectgate: read records written again after %d failed attempts", failed)
                failed = 0
            now = time.monotonic()
            if busy or self._items:
                idle_since = now
            elif now - idle_since >= IDLE and self._retire(wake):
                return

    def _retire(self, wake: threading.Event) -> bool:
        """End this thread unless a row came meanwhile: `_thread` is cleared before the buffer is
        looked at, so an add either is seen here or sees no thread and starts one."""
        with self._lock:
            if wake is not self._wake:  # closed meanwhile: close() took the thread
                return True
            me, self._thread = self._thread, None
            if self._items:
                self._thread = me
                return False
            return True

    def close(self) -> None:
        """Stop the thread and write what is buffered. A later add starts the thread again."""
        with self._lock:
            wake, thread = self._wake, self._thread
            self._wake, self._thread = threading.Event(), None
        wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        try:
            self.flush()
        except BaseException:
            _HELD.add(self)  # its records outlive its gate: written at exit, or said lost there
            raise


_LOGS: weakref.WeakSet[ReadLog] = weakref.WeakSet()  # the live logs, renewed in a forked child
_HELD: set[ReadLog] = set()  # closed with records unwritten: kept alive until they are written


def _forked() -> None:
    for log in list(_LOGS):
        log._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _flush_at_exit(ref: weakref.ref[ReadLog]) -> None:
    log = ref()
    if log is None:
        return
    log._exiting = True  # from now on a read is written on its caller's path (`_start`)
    with contextlib.suppress(Exception):  # the store may be gone; atexit's close tries again
        log.close()


def _close_at_exit(ref: weakref.ref[ReadLog]) -> None:
    log = ref()
    if log is None:
        return
    log._exiting = True
    try:
        log.close()
    except Exception:  # the store may already be gone at exit: said, with what is lost
        _log.error(
            "effectgate: %d read records could not be written at exit: lost", len(log._items), exc_info=True
        )


def _flush_all() -> None:
    for log in list(_LOGS):
        _flush_at_exit(weakref.ref(log))


def _close_all() -> None:
    for log in list(_LOGS):
        _close_at_exit(weakref.ref(log))


# Every live log's records are written at exit: closed before the threads are joined
# (`threading._shutdown`, which a multiprocessing child runs before its `os._exit`, skipping
# atexit), so a worker process's last reads are written, not lost with it; the threads still
# running (not daemons) read on, each read written as it is made (no writer is left to outlive
# them: a child's `os._exit` would end it with their last reads), and closed again at atexit.
# Registered once for all logs (atexit never forgets a registration: one per log accumulated).
atexit.register(_close_all)
with contextlib.suppress(AttributeError, RuntimeError):  # CPython's, as concurrent.futures uses it
    threading._register_atexit(_flush_all)  # type: ignore[attr-defined]
