"""One writer process of benchmarks/processes.py: what runs in the child, and what it reports.

It opens its `sqlite3` connection or its store on the first task for a file (an untimed warm-up
round), keeps both open between rounds, waits at the round's barrier, then times each operation.
"""

from __future__ import annotations

import gc
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

from effectgate import open_store

HASH = "h" * 64
BUSY_TIMEOUT_S = 30  # the store's: `connect_args={"timeout": 30}` and `PRAGMA busy_timeout=30000`
#: Longest a process waits for the others at a round's start: only a dead process makes it wait.
BARRIER_TIMEOUT_S = 300.0

RAW_DDL = (
    "CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, payload_hash TEXT NOT NULL, "
    "status TEXT NOT NULL, lease_owner TEXT, lease_expires_at REAL, result_json TEXT, "
    "created_at REAL NOT NULL, updated_at REAL NOT NULL)"
)
RAW_CLAIM = (
    "INSERT INTO idempotency (key, payload_hash, status, lease_owner, lease_expires_at, created_at, "
    "updated_at) VALUES (?, ?, 'in_progress', ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING key"
)
RAW_COMPLETE = (
    "UPDATE idempotency SET status = 'succeeded', result_json = ?, lease_expires_at = NULL, "
    "updated_at = ? WHERE key = ? AND lease_owner = ? AND status = 'in_progress' RETURNING key"
)


@dataclass(frozen=True)
class Outcome:
    """One process's round: its start and finish on the machine's monotonic clock (one clock for
    every process), its own CPU time, the latency of each operation that completed, its errors."""

    start_ns: int
    end_ns: int
    cpu_ns: int
    latencies_ns: tuple[int, ...]
    errors: int
    locked: int
    first_error: str | None


def connect(path: str) -> sqlite3.Connection:
    """A `sqlite3` connection set up as the store sets up its own (see stores/_dialect.py)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
    return conn


def _raw_op(path: str, owner: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    conn = connect(path)
    execute = conn.execute

    def op(key: str) -> None:
        now = time.time()
        if not execute(RAW_CLAIM, (key, HASH, owner, now + 60, now, now)).fetchall():
            raise RuntimeError(f"raw: a fresh key was not claimed: {key}")
        if not execute(RAW_COMPLETE, ('{"ok": true}', time.time(), key, owner)).fetchall():
            raise RuntimeError(f"raw: the claim on {key} was lost before completion")

    return op, conn.close


def _gate_op(url: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    store = open_store(url)
    ran = 0

    def noop() -> dict[str, Any]:
        nonlocal ran
        ran += 1
        return {"ok": True}

    def op(key: str) -> None:
        before = ran
        store.run(key, HASH, noop)
        if ran == before:  # a stored result returned: a replay, not the execution being timed
            raise RuntimeError(f"effectgate: the tool did not run for the fresh key {key}")

    return op, store.close


def _is_lock_wait(exc: BaseException | None) -> bool:
    """Whether SQLite gave up waiting for its lock somewhere in `exc`'s chain of causes."""
    while exc is not None:
        if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
            return True
        # SQLAlchemy raises its own error from the driver's and also keeps it as `orig`.
        exc = exc.__cause__ or exc.__context__ or getattr(exc, "orig", None)
    return False


def timed(op: Callable[[str], None], keys: list[str], barrier: Barrier) -> Outcome:
    """Wait at `barrier`, then run `op` once per key, timing each; an operation that raises is
    counted (with whether SQLite gave up on its lock) and the next one runs."""
    latencies: list[int] = []
    errors = locked = 0
    first_error: str | None = None
    gc.collect()
    gc.disable()  # as in _timing.interleaved: no process pays for garbage made before its round
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        cpu = time.process_time_ns()
        start = time.monotonic_ns()
        for key in keys:
            began = time.perf_counter_ns()
            try:
                op(key)
            except Exception as exc:  # counted, reported, never retried
                errors += 1
                locked += _is_lock_wait(exc)
                first_error = first_error or f"{type(exc).__name__}: {exc}"
                continue
            latencies.append(time.perf_counter_ns() - began)
        end = time.monotonic_ns()
        cpu = time.process_time_ns() - cpu
    finally:
        gc.enable()
    return Outcome(start, end, cpu, tuple(latencies), errors, locked, first_error)


def serve(inbox: Connection, barriers: dict[int, Barrier]) -> None:
    """The writer process's body: for each task (side, where, process count, ops, round) it runs one
    round and sends back its `Outcome`; `None` ends it. Connections and stores stay open between
    rounds, so only the first (untimed) round of each side opens them."""
    owner = uuid.uuid4().hex
    ops: dict[str, Callable[[str], None]] = {}
    closers: list[Callable[[], None]] = []
    try:
        while (task := inbox.recv()) is not None:
            side, where, count, n, round_no = task
            if where not in ops:
                op, close = _raw_op(where, owner) if side == "raw" else _gate_op(where)
                ops[where] = op
                closers.append(close)
            keys = [f"{owner}-{round_no}-{i}" for i in range(n)]
            inbox.send(timed(ops[where], keys, barriers[count]))
    finally:
        for close in closers:
            close()
