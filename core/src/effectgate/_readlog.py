"""Read records, written in batches off the caller's path.

A read must cost microseconds, and a SQLite commit costs tens of them, so reads are appended to
a buffer here and written: by a background thread at most `interval` seconds later (sooner when
`batch` records wait), on `flush()` and `close()`, and at interpreter exit.
Their args hash is computed at write time too. A batch whose write fails goes back to the buffer.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from .canonical import args_hash
from .stores.protocol import Store

_log = logging.getLogger("effectgate")


class ReadLog:
    def __init__(self, store: Store, *, batch: int = 256, interval: float = 0.2) -> None:
        self._store = store
        self._batch = max(1, batch)
        self._interval = interval
        self._items: list[tuple[dict[str, Any], Mapping[str, Any]]] = []
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one writer at a time, so flush() sees every record
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        atexit.register(_close_at_exit, weakref.ref(self))

    def add(self, event: dict[str, Any], args: Mapping[str, Any]) -> None:
        with self._lock:
            self._items.append((event, args))
            full = len(self._items) >= self._batch
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="effectgate-readlog", daemon=True)
                self._thread.start()
        if full:
            self._wake.set()

    def _take(self) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
        with self._lock:
            items, self._items = self._items, []
        return items

    def _restore(self, items: list[tuple[dict[str, Any], Mapping[str, Any]]]) -> None:
        with self._lock:
            self._items[:0] = items

    @staticmethod
    def _rows(items: list[tuple[dict[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any]]:
        rows = []
        for event, args in items:
            try:
                rows.append({**event, "args_hash": args_hash(event["tool"], args)})
            except Exception as exc:  # never let one record block the log: keep it, unhashed
                rows.append(
                    {**event, "detail_json": {**event.get("detail_json", {}), "unhashable": repr(exc)}}
                )
        return rows

    def flush(self) -> None:
        """Write everything buffered so far; waits for a batch the background writer holds."""
        with self._writing:
            items = self._take()
            if not items:
                return
            try:
                with self._store.transaction() as conn:
                    self._store.append_events(conn, self._rows(items))
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
