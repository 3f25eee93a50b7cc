"""(d) Claims under concurrency, SQLite and PostgreSQL: the full execute path against raw SQL.

With 1, 8 and 32 worker threads (each raw worker has its own connection; the store shares its
pool, sized to the workers as a user running that many threads sizes it: `open_store(pool_size=)`),
in one run, raw and effectgate alternating over `ROUNDS` rounds (the ratio is the median of the
rounds'); every worker makes one untimed operation first and the store's pool holds one
connection per worker, so connections open before the timer:

- raw: `INSERT ... ON CONFLICT DO NOTHING RETURNING` (the claim) then an `UPDATE ... RETURNING`
  (the completion), each its own commit: the two commits an exactly-once execution needs;
- effectgate: `store.run(key, hash, noop)`: claim, run a no-op tool, complete.

The ratio is effectgate's operations per second over raw's; the target, at 8 and 32 workers,
is at least 0.5.
PostgreSQL runs on the throwaway test server (tests/pgserver.py), which has fsync off, so its
commits are cheap and the ratio shows effectgate's CPU cost at its most visible.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effectgate import open_store

WORKERS = (1, 8, 32)
ROUNDS = 3
#: what each measured side opened (connections, stores), closed once its rate is taken
_OPENED: list[Callable[[], None]] = []
TARGET = 0.5
HASH = "h" * 64


@dataclass(frozen=True)
class Rate:
    backend: str
    workers: int
    raw_per_s: float
    gate_per_s: float

    @property
    def ratio(self) -> float:
        return self.gate_per_s / self.raw_per_s

    @property
    def met(self) -> bool | None:
        """None at one worker: the target is at 8 and 32 workers."""
        return None if self.workers == 1 else self.ratio >= TARGET


def _rate(workers: int, ops_per_worker: int, make_worker: Callable[[int], Callable[[int], None]]) -> float:
    """Operations per second with `workers` threads, each doing `ops_per_worker` operations."""
    fns = [make_worker(w) for w in range(workers)]
    barrier = threading.Barrier(workers + 1)

    def body(w: int) -> None:
        fn = fns[w]
        fn(-1)  # untimed: the worker's connection is open (and its statements prepared) before the timer
        barrier.wait()
        for i in range(ops_per_worker):
            fn(i)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(body, w) for w in range(workers)]
        barrier.wait()
        start = time.perf_counter()
        for f in futures:
            f.result()
        elapsed = time.perf_counter() - start
    while _OPENED:
        _OPENED.pop()()
    return workers * ops_per_worker / elapsed


RAW_DDL = (
    "CREATE TABLE IF NOT EXISTS raw_claims (key TEXT PRIMARY KEY, payload_hash TEXT NOT NULL, "
    "status TEXT NOT NULL, owner TEXT, result TEXT)"
)


def _sqlite_raw(path: Path) -> Callable[[int], Callable[[int], None]]:
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute(RAW_DDL)
    setup.close()

    def make(w: int) -> Callable[[int], None]:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        _OPENED.append(conn.close)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        tag = uuid.uuid4().hex

        def op(i: int) -> None:
            key = f"{tag}-{i}"
            conn.execute(
                "INSERT INTO raw_claims VALUES (?, ?, 'in_progress', ?, NULL) ON CONFLICT (key) DO NOTHING "
                "RETURNING key",
                (key, HASH, tag),
            ).fetchall()
            conn.execute(
                "UPDATE raw_claims SET status='succeeded', result=? WHERE key=? AND owner=? RETURNING key",
                ('{"ok":true}', key, tag),
            ).fetchall()

        return op

    return make


def _pg_raw(url: str) -> Callable[[int], Callable[[int], None]]:
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RAW_DDL)

    def make(w: int) -> Callable[[int], None]:
        conn = psycopg.connect(dsn, autocommit=True)
        _OPENED.append(conn.close)
        tag = uuid.uuid4().hex

        def op(i: int) -> None:
            key = f"{tag}-{i}"
            conn.execute(
                "INSERT INTO raw_claims VALUES (%s, %s, 'in_progress', %s, NULL) "
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, HASH, tag),
            ).fetchall()
            conn.execute(
                "UPDATE raw_claims SET status='succeeded', result=%s WHERE key=%s AND owner=%s RETURNING key",
                ('{"ok":true}', key, tag),
            ).fetchall()

        return op

    return make


def _gate(url: str, workers: int) -> tuple[Callable[[int], Callable[[int], None]], Callable[[], int]]:
    """The effectgate side, and how many times its tool ran so far (every operation must run it:
    an execution, not the replay of a stored result)."""
    store = open_store(url, pool_size=workers)
    _OPENED.append(store.close)
    store.setup()
    # the pool's connections open before the timer, as each raw worker's does: the workers'
    # untimed first operations may run one after another and leave one connection open
    held = [store.engine.connect() for _ in range(workers)]
    for conn in held:
        conn.close()
    ids = itertools.count()
    lock = threading.Lock()
    # keys new to the database: PostgreSQL's is shared by every round and worker count, and a
    # key claimed before would be a replay (the stored result returned), not an execution
    tag = uuid.uuid4().hex
    ran = [0]

    def make(w: int) -> Callable[[int], None]:
        def noop() -> dict[str, Any]:
            with lock:
                ran[0] += 1
            return {"ok": True}

        def op(i: int) -> None:
            with lock:
                n = next(ids)
            store.run(f"{tag}-{n}", HASH, noop)

        return op

    return make, lambda: ran[0]


def run(directory: Path, pg_url: str | None, *, ops: int, rounds: int | None = None) -> list[Rate]:
    """Rates for SQLite (file in `directory`) and, when `pg_url` is given, PostgreSQL: per worker
    count, the round whose ratio is the median of `rounds` (default `ROUNDS`) alternating
    raw/effectgate rounds."""
    rounds = ROUNDS if rounds is None else rounds
    rates: list[Rate] = []
    # each side's connections (and store) are opened just before its own rate, which closes them
    backends: list[tuple[str, Callable[[int, int], Any], Callable[[int, int], tuple[Any, Any]]]] = [
        (
            "sqlite",
            lambda w, r: _sqlite_raw(directory / f"raw-{w}-{r}.db"),
            lambda w, r: _gate(f"sqlite:///{directory / f'gate-{w}-{r}.db'}", w),
        )
    ]
    if pg_url is not None:
        backends.append(("postgresql", lambda w, r: _pg_raw(pg_url), lambda w, r: _gate(pg_url, w)))
    for backend, raw_side, gate_side in backends:
        for workers in WORKERS:
            per_worker = max(2, ops // workers)
            measured = []
            for r in range(rounds):
                raw = _rate(workers, per_worker, raw_side(workers, r))
                gate_make, ran = gate_side(workers, r)
                gate = _rate(workers, per_worker, gate_make)
                expected = workers * (per_worker + 1)  # with each worker's untimed first operation
                if ran() != expected:
                    raise RuntimeError(f"{expected} operations ran the tool {ran()} times ({backend})")
                measured.append(Rate(backend, workers, raw, gate))
            rates.append(sorted(measured, key=lambda rate: rate.ratio)[len(measured) // 2])
    return rates
