"""Keeping the leases of running operations alive while their tools run (`LeaseKeeper`).

A claimed operation holds a lease of `Policy.lease_seconds` on its idempotency key. `recover()`,
in any worker, turns an in-flight record whose lease ran out into needs_reconciliation, and a
reconcile hook that finds nothing at the provider runs the tool again under the same key. A tool
that is merely slow (a payment provider taking two minutes) must not look dead: while it runs, the
keeper renews its lease every `lease_seconds / 3` (to `lease_seconds` from then), from one
background thread per gate, from the claim to the stored outcome (`Settlement.run_claimed`). The
thread starts with the first hold (about 0.1 ms of CPU; one that cannot start, at the process's
thread limit, is logged and tried again at the next hold) and ends after `IDLE` seconds with
nothing held, so a process that runs nothing keeps no thread; `close()` stops it at once, also
for the calls still running, and a later hold starts it again. A worker that dies stops renewing, so its
lease still runs out and `recover` still finds it; a call interrupted by a BaseException is
released by the flow driver (`flow._abandon`), not kept renewed, unless its work still runs in a
worker thread (an async call cancelled under a sync tool: released when that work ends,
`flow._Worker`). The hold ends just before the outcome is stored, so a beat never mistakes a
settled record for a lease another worker took over.

A renewal that finds the record no longer in flight under this owner (`recover` got there first)
stops renewing it and logs a WARNING on "effectgate._execution"; the tool's completion then meets
`LeaseLost` and its run is recorded as needing reconciliation (`_failures.py`). A renewal that
fails (the database unreachable) is logged and tried again at the next beat. A store in memory
(SQLite, one connection that threads share) is renewed too: its work runs one thread at a time
(`Checkouts.serial`), and a `recover` in another thread of the process would take a live run over.
"""

from __future__ import annotations

import os
import threading
import time

from ._logging import logger
from .stores.protocol import Store

log = logger("effectgate._execution")

LOOK = 1.0  #: the longest the thread waits between looks at what it holds
IDLE = 30.0  #: seconds with nothing held after which the thread ends (a later hold starts another)


class LeaseKeeper:
    """Renews the leases of the operations whose tools are running; see the module docstring."""

    def __init__(self, store: Store, lease_seconds: float) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        self._held: dict[str, str] = {}  # idempotency key -> lease owner
        self._lock = threading.Lock()  # the thread's start and its exit, against `hold`
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stop = threading.Event()

    def hold(self, key: str, owner: str) -> None:
        """Renew `key`'s lease (held by `owner`) until `release`: call it before the tool runs."""
        self._after_fork()
        with self._lock:
            self._held[key] = owner
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, args=(self._stop,), name="effectgate-leases", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # at the thread limit: the run goes on, the next hold retries
                    log.warning("lease renewal could not start (%s); tried again at the next hold", exc)
                    return
                self._thread = thread

    def release(self, key: str, owner: str) -> None:
        """Stop renewing `key` for `owner` (its run ended, or its outcome is about to be stored):
        only that run's hold, never a later run's of the same key (a reconcile that ran it again
        under a new lease)."""
        self._after_fork()
        self._drop(key, owner)

    def _after_fork(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread, lock and leases are not ours
            self._pid, self._held, self._thread = os.getpid(), {}, None
            self._lock, self._stop = threading.Lock(), threading.Event()

    def _drop(self, key: str, owner: str) -> bool:
        with self._lock:
            if self._held.get(key) != owner:
                return False
            del self._held[key]
            return True

    def beat(self) -> list[str]:
        """Renew every held lease once; the keys whose lease was lost (no longer renewed)."""
        lost: list[str] = []
        for key, owner in list(self._held.items()):
            try:
                renewed = self.store.renew_lease(key, owner, lease_seconds=self.lease_seconds)
            except Exception as exc:  # the next beat tries again; the tool is never disturbed
                log.warning("lease renewal failed (%s), retried next beat: key=%s", type(exc).__name__, key)
                continue
            if not renewed and self._drop(key, owner):  # not a run that just settled
                lost.append(key)
                log.warning(
                    "lease lost while the tool runs (another worker took the operation over): key=%s", key
                )
        return lost

    def close(self) -> None:
        """Stop the thread now (the gate closes). A lease held later starts it again."""
        self._after_fork()
        with self._lock:
            stop, thread = self._stop, self._thread
            stop.set()
            # a later hold starts a thread of its own, even while this one finishes a beat
            self._stop, self._thread = threading.Event(), None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self, stop: threading.Event) -> None:
        me, last, idle_since = threading.current_thread(), time.monotonic(), None
        while True:
            stopped = stop.wait(min(self.interval, LOOK))
            now = time.monotonic()
            with self._lock:  # decided and marked under the lock `hold` starts a thread under
                held = bool(self._held)
                idle_since = None if held else (idle_since or now)
                if stopped or (idle_since is not None and now - idle_since >= IDLE):
                    if self._thread is me:
                        self._thread = None
                    return
            if held and now - last >= self.interval:
                last = now
                self.beat()
