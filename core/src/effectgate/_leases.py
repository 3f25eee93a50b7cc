"""Keeping the leases of running operations alive while their tools run (`LeaseKeeper`).

A claimed operation holds a lease of `Policy.lease_seconds` on its idempotency key. `recover()`,
in any worker, turns an in-flight record whose lease ran out into needs_reconciliation, and a
reconcile hook that finds nothing at the provider runs the tool again under the same key. A tool
that is merely slow (a payment provider taking two minutes) must not look dead: while it runs, the
keeper renews its lease every `lease_seconds / 3` (to `lease_seconds` from then), from one
background thread per gate. The thread starts with the first hold, and ends within a second of
the last release (and on `EffectGate.close()`), so a process that runs nothing keeps no thread. A
worker that dies stops renewing, so its lease still runs out and `recover` still finds it.

A renewal that finds the record no longer in flight under this owner (`recover` got there first)
stops renewing it and logs a WARNING on "effectgate._execution"; the tool's completion then meets
`LeaseLost` and its run is recorded as needing reconciliation (`_settle.py`). A renewal that
fails (the database unreachable) is logged and tried again at the next beat. A store that shares
one connection between threads (SQLite in memory) is never renewed from another thread: no other
process can recover it, and a second thread's transaction would collide with the caller's.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from .stores.protocol import Store

log = logging.getLogger("effectgate._execution")

LINGER = 1.0  #: seconds the thread waits at most between looks (its exit after the last release)


class LeaseKeeper:
    """Renews the leases of the operations whose tools are running; see the module docstring."""

    def __init__(self, store: Store, lease_seconds: float) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        #: False for a store whose one connection threads share (`SQLStore.concurrent`)
        self.enabled: bool = getattr(store, "concurrent", True)
        self._held: dict[str, str] = {}  # idempotency key -> lease owner
        self._lock = threading.Lock()  # the thread's start and its exit, against `hold`
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stop = threading.Event()

    def hold(self, key: str, owner: str) -> None:
        """Renew `key`'s lease (held by `owner`) until `release`: call it before the tool runs."""
        if not self.enabled:
            return
        if self._pid != os.getpid():  # forked: the parent's thread and its leases are not ours
            self._pid, self._held, self._thread = os.getpid(), {}, None
            self._lock, self._stop = threading.Lock(), threading.Event()
        with self._lock:
            self._held[key] = owner
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="effectgate-leases", daemon=True)
                self._thread.start()

    def release(self, key: str) -> None:
        """Stop renewing `key` (its tool returned or raised)."""
        self._held.pop(key, None)

    def beat(self) -> list[str]:
        """Renew every held lease once; the keys whose lease was lost (no longer renewed)."""
        lost: list[str] = []
        for key, owner in list(self._held.items()):
            try:
                renewed = self.store.renew_lease(key, owner, lease_seconds=self.lease_seconds)
            except Exception as exc:  # the next beat tries again; the tool is never disturbed
                log.warning("lease renewal failed (%s), retried next beat: key=%s", type(exc).__name__, key)
                continue
            if not renewed and self._held.get(key) == owner:  # not a run that just settled
                self._held.pop(key, None)
                lost.append(key)
                log.warning(
                    "lease lost while the tool runs (another worker took the operation over): key=%s", key
                )
        return lost

    def close(self) -> None:
        """Stop renewing (the gate closes): the thread ends now."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            stopped = self._stop.wait(min(self.interval, LINGER))
            with self._lock:  # decided and marked under the lock `hold` starts a thread under
                if stopped or not self._held:
                    self._thread = None
                    return
            if time.monotonic() - last >= self.interval:
                last = time.monotonic()
                self.beat()
