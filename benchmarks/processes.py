"""(c) SQLite writer processes: N OS processes executing exactly once on one shared SQLite file.

`python -m benchmarks.processes [--smoke] [--json FILE] [--dir DIR]`

With 1, 4 and 16 processes (smoke: 1 and 2), each round splits `plan.n` operations among them,
all on one file per side (WAL, `synchronous=FULL`, a 30 s busy timeout: what the store sets):

- raw: plain `sqlite3`, `INSERT ... ON CONFLICT DO NOTHING RETURNING` (the claim) then
  `UPDATE ... RETURNING` (the completion), each its own autocommit transaction, as in (d): the
  two commits an exactly-once execution needs, and the least a hand-written one holds the write
  lock for. The store's `BEGIN IMMEDIATE ... COMMIT` around each is part of what it costs (the
  raw side wrapped the same way runs ~40% slower at 16 processes on 2 cores: a process that
  holds the lock across three calls is more often descheduled holding it);
- effectgate: `store.run(key, hash, noop)` on each process's own store, as (d) times it: claim,
  run a no-op tool, complete.

The processes are started (forkserver, else spawn) once, and open their connection and store in
an untimed warm-up round; a barrier releases them together into each timed round, and raw and
effectgate rounds alternate (A B, B A, ...). Wall time runs from the first process's start to the
last one's finish; latency is timed per operation in each process and merged; CPU time is the sum
of the processes' own. An error ("database is locked" after the busy timeout, or any other) is
counted and reported, never retried or hidden; one on the effectgate side fails the measurement,
at any process count. Target, at 16 processes: at least 0.8x raw's throughput and a p99 latency
at most 2x raw's. A 2-core machine runs 16 processes oversubscribed: that is part of the cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing as mp
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate import open_store

from . import _adapter, _writer
from ._timing import Plan, Stats, paired_ratio

if TYPE_CHECKING:  # ForkServerContext does not exist on Windows
    from multiprocessing.context import ForkServerContext, SpawnContext

TARGET_PROCESSES = 16
THROUGHPUT_TARGET = 0.8
P99_TARGET = 2.0


@dataclass(frozen=True)
class Sweep:
    """Process counts to measure; each round runs about `plan.n` operations split among them."""

    counts: tuple[int, ...]
    plan: Plan


FULL = Sweep((1, 4, TARGET_PROCESSES), Plan(n=960, repeats=9, warmup=1))
SMOKE = Sweep((1, 2), Plan(n=16, repeats=2, warmup=1))


@dataclass(frozen=True)
class Side:
    """One side at one process count, one sample per timed round: `per_op` is the whole wall time
    over the operations completed (the inverse of throughput) with the processes' summed CPU time
    per operation; `p50` and `p99` are the quantiles of the round's merged latencies."""

    per_op: Stats
    p50: Stats
    p99: Stats
    ops: int
    errors: int
    locked: int
    first_error: str | None
    records_ok: bool

    @property
    def per_second(self) -> float:
        return 1e9 / self.per_op.median


@dataclass(frozen=True)
class ProcessesResult:
    processes: int
    ops_per_process: int
    rounds: int
    raw: Side
    gate: Side

    @property
    def throughput_ratio(self) -> float:
        """effectgate's operations per second over raw's, paired round by round."""
        return paired_ratio(self.raw.per_op, self.gate.per_op)

    @property
    def p99_ratio(self) -> float:
        return paired_ratio(self.gate.p99, self.raw.p99)

    @property
    def failed(self) -> bool:
        """The store raised, or did not leave exactly one completed record per operation."""
        return self.gate.errors > 0 or not self.gate.records_ok

    @property
    def met(self) -> bool | None:
        """None below the target's process count (no target there)."""
        if self.processes != TARGET_PROCESSES:
            return None
        return not self.failed and self.throughput_ratio >= THROUGHPUT_TARGET and self.p99_ratio <= P99_TARGET


def summarise(
    rounds: list[list[_writer.Outcome]], warm: list[list[_writer.Outcome]], *, completed: int
) -> Side:
    """The timed `rounds` make the figures; errors and records count the warm-up too: every
    operation that reported success must have left one completed record, and no other."""
    per_op: list[float] = []
    cpu: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    for outcomes in rounds:
        latencies = tuple(ns for o in outcomes for ns in o.latencies_ns)
        wall = max(o.end_ns for o in outcomes) - min(o.start_ns for o in outcomes)
        done = max(len(latencies), 1)  # a round where every operation failed still has a number
        per_op.append(wall / done)
        cpu.append(sum(o.cpu_ns for o in outcomes) / done)
        merged = Stats(latencies or (float(wall),))
        p50.append(merged.quantile(0.50))
        p99.append(merged.quantile(0.99))
    everything = [o for outcomes in warm + rounds for o in outcomes]
    return Side(
        per_op=Stats(tuple(per_op), tuple(cpu)),
        p50=Stats(tuple(p50)),
        p99=Stats(tuple(p99)),
        ops=sum(len(o.latencies_ns) for outcomes in rounds for o in outcomes),
        errors=sum(o.errors for o in everything),
        locked=sum(o.locked for o in everything),
        first_error=next((o.first_error for o in everything if o.first_error), None),
        records_ok=completed == sum(len(o.latencies_ns) for o in everything),
    )


def _completed_raw(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (n,) = conn.execute("SELECT count(*) FROM idempotency WHERE status = 'succeeded'").fetchone()
    return int(n)


def _completed_gate(url: str) -> int:
    with open_store(url) as store:
        return len(store.idempotency_records(status="succeeded"))


def _measure(directory: Path, inboxes: list[Connection], plan: Plan) -> ProcessesResult:
    count = len(inboxes)
    raw_path = directory / f"processes-raw-{count}.db"
    with contextlib.closing(_writer.connect(str(raw_path))) as conn:
        conn.execute(_writer.RAW_DDL)
    gate_url = f"sqlite:///{directory / f'processes-gate-{count}.db'}"
    with open_store(gate_url) as store:
        store.setup()
    where = {"raw": str(raw_path), "gate": gate_url}
    per_process = max(1, plan.n // count)
    numbers = itertools.count()

    def round_(side: str) -> list[_writer.Outcome]:
        task = (side, where[side], count, per_process, next(numbers))
        for inbox in inboxes:
            inbox.send(task)
        try:
            return [inbox.recv() for inbox in inboxes]
        except EOFError as exc:
            raise RuntimeError("a writer process died (its traceback is above)") from exc

    warm: dict[str, list[list[_writer.Outcome]]] = {side: [] for side in where}
    for _ in range(plan.warmup):
        for side in where:
            warm[side].append(round_(side))
    timed: dict[str, list[list[_writer.Outcome]]] = {side: [] for side in where}
    order = list(where)
    for r in range(plan.repeats):
        for side in order if r % 2 == 0 else order[::-1]:
            timed[side].append(round_(side))
    return ProcessesResult(
        processes=count,
        ops_per_process=per_process,
        rounds=plan.repeats,
        raw=summarise(timed["raw"], warm["raw"], completed=_completed_raw(raw_path)),
        gate=summarise(timed["gate"], warm["gate"], completed=_completed_gate(gate_url)),
    )


def _context() -> ForkServerContext | SpawnContext:
    """forkserver where there is one: each process forks from a server that imported effectgate
    once (an import costs ~2 s of CPU, paid 16 times under spawn); spawn elsewhere."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["effectgate"])
        return ctx
    return mp.get_context("spawn")


def run(directory: Path, sweep: Sweep) -> list[ProcessesResult]:
    """One result per process count; the processes are started once, for the largest count."""
    ctx = _context()
    barriers = {count: ctx.Barrier(count) for count in sweep.counts}
    pipes = [ctx.Pipe() for _ in range(max(sweep.counts))]
    workers = [ctx.Process(target=_writer.serve, args=(child, barriers), daemon=True) for _, child in pipes]
    for worker in workers:
        worker.start()
    for _, child in pipes:
        child.close()  # so a process that dies shows as EOF on our end
    try:
        return [_measure(directory, [p for p, _ in pipes[:count]], sweep.plan) for count in sweep.counts]
    finally:
        for inbox, _ in pipes:
            with contextlib.suppress(OSError):  # that process is gone already
                inbox.send(None)
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()


def _errors(side: Side) -> str:
    return f"{side.errors} errors ({side.locked} lock waits given up), first: {side.first_error}"


def report(results: Sequence[ProcessesResult]) -> tuple[list[str], bool]:
    """Table rows, one detail line and one ratio line per process count, and whether every
    measured target was met and the store never failed."""
    lines: list[str] = []
    ratios: list[str] = []
    ok = True
    d = _adapter.duration
    for r in results:
        n = r.processes
        lines += _adapter.rows(
            [
                (f"(c) {n:>2} processes: store.run, wall / op", r.gate.per_op),
                (f"(c) {n:>2} processes: raw sqlite3, 2 commits, wall / op", r.raw.per_op),
            ]
        )
        lines.append(
            f"  (c) {n} processes x {r.ops_per_process} ops, {r.rounds} rounds: p50 / p99 latency "
            f"store.run {d(r.gate.p50.median)} / {d(r.gate.p99.median)}, raw {d(r.raw.p50.median)} / "
            f"{d(r.raw.p99.median)}; CPU per op (all processes) store.run "
            f"{d(r.gate.per_op.cpu_median or 0)}, raw {d(r.raw.per_op.cpu_median or 0)}; errors "
            f"store.run {r.gate.errors}, raw {r.raw.errors}"
        )
        if r.met is None:
            verdict = "(target at 16 processes)"
        else:
            verdict = (
                f"(target: >= {THROUGHPUT_TARGET}x, p99 <= {P99_TARGET:g}x) {'met' if r.met else 'MISSED'}"
            )
        line = (
            f"ratio (c) SQLite writer processes, {n:>2}: store.run / raw 2 commits: "
            f"{r.throughput_ratio:.2f}x throughput ({r.gate.per_second:,.0f} vs {r.raw.per_second:,.0f} "
            f"per s), p99 {r.p99_ratio:.2f}x {verdict}"
        )
        if r.failed:
            line += f"; store FAILED: {_errors(r.gate)}" + ("" if r.gate.records_ok else "; RECORDS WRONG")
        if r.raw.errors or not r.raw.records_ok:
            line += f"; raw baseline: {_errors(r.raw)}" + ("" if r.raw.records_ok else "; RECORDS WRONG")
        ratios.append(line)
        ok = ok and not r.failed and r.met is not False
    return lines + ratios, ok


def _side_json(side: Side) -> dict[str, Any]:
    return {
        "per_op": side.per_op.to_dict(),
        "per_second": side.per_second,
        "p50": side.p50.to_dict(),
        "p99": side.p99.to_dict(),
        "ops": side.ops,
        "errors": side.errors,
        "lock_waits_given_up": side.locked,
        "first_error": side.first_error,
        "records_ok": side.records_ok,
    }


def to_json(results: Sequence[ProcessesResult]) -> dict[str, Any]:
    return {
        "ratios": {
            "processes": [
                {
                    "processes": r.processes,
                    "ops_per_process": r.ops_per_process,
                    "rounds": r.rounds,
                    "throughput_ratio": r.throughput_ratio,
                    "p99_ratio": r.p99_ratio,
                    "target_throughput": THROUGHPUT_TARGET if r.met is not None else None,
                    "target_p99": P99_TARGET if r.met is not None else None,
                    "failed": r.failed,
                    "met": r.met,
                    "gate": _side_json(r.gate),
                    "raw": _side_json(r.raw),
                }
                for r in results
            ]
        }
    }


def with_repeats(sweep: Sweep, repeats: int) -> Sweep:
    return dataclasses.replace(sweep, plan=dataclasses.replace(sweep.plan, repeats=repeats))


def main(argv: Sequence[str] | None = None) -> int:
    return _adapter.main(sys.modules[__name__], "SQLite writer processes", argv)


if __name__ == "__main__":
    sys.exit(main())
