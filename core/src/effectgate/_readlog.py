"""Read records, written in batches off the caller's path.

A read must cost microseconds, and a SQLite commit costs tens of them, so reads are appended to
a buffer here, as rows already built on the call path (`records.READ_COLUMNS`, the args hash
computed when the call was made), and written: by a background thread at most `interval`
seconds later (sooner when `batch` records wait), on `flush()` and `close()`, and at interpreter
exit. A batch whose write fails goes back to the buffer.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any

from .stores.protocol import Store

_log = logging.getLogger("effectgate")

ReadRow = tuple[Any, ...]


class ReadLog:
    def __init__(self, store: Store, *, batch: int = 256, interval: float = 0.2) -> None:
        self._store = store
        self._batch = max(1, batch)
        self._interval = interval
        self._items: list[ReadRow] = []
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one writer at a time, so flush() sees every record
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        atexit.register(_close_at_exit, weakref.ref(self))

    def add(self, row: ReadRow) -> None:
        """Buffer one read record (a tuple in `records.READ_COLUMNS` order)."""
        with self._lock:  # the writer swaps the list under this lock: no row lands in a taken list
            self._items.append(row)
            full = len(self._items) >= self._batch
        if self._thread is None:
            self._start()
        if full:
            self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="effectgate-readlog", daemon=True)
                self._thread.start()

    def _take(self) -> list[ReadRow]:
        with self._lock:
            items, self._items = self._items, []
        return items

    def _restore(self, items: list[ReadRow]) -> None:
        with self._lock:
            self._items[:0] = items

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

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the records stay buffered; the next round or close() retries
                _log.warning("effectgate: writing read records failed; retrying", exc_info=True)

    def close(self) -> None:
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.flush()


def _close_at_exit(ref: weakref.ref[ReadLog]) -> None:
    log = ref()
    if log is None:
        return
    try:
        log.close()
    except Exception:  # the store may already be gone at exit; nothing more can be done
        return
