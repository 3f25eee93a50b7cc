"""The command line every adapter benchmark module shares: `python -m benchmarks.<adapter>`
(and benchmarks/processes.py, which has the same shape).

An adapter's module provides `FULL`, `SMOKE`, `run(directory, plans)`, `report(result)` (lines and
whether its target was met) and `to_json(result)`, and calls `main(module, title, argv)`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from effectgate import Effect, EffectGate, EffectTable, Keyring, ToolSpec, open_store

from ._timing import Plan, Stats, interleaved, paired_ratio


def duration(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def rows(cases: Sequence[tuple[str, Stats]]) -> list[str]:
    """One table row (median, p10, p90) per labelled case."""
    return [
        f"  {label:<52} {duration(s.median):>11} {duration(s.p10):>11} {duration(s.p90):>11}"
        for label, s in cases
    ]


def main(module: ModuleType, title: str, argv: Sequence[str] | None = None) -> int:
    name = module.__name__
    parser = argparse.ArgumentParser(
        prog=f"python -m {name}", description=(module.__doc__ or title).split("\n")[0]
    )
    parser.add_argument("--smoke", action="store_true", help="a few iterations; always exits 0")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--dir", metavar="DIR", help="where the database file goes (default: a temp dir)")
    args = parser.parse_args(argv)
    plans = module.SMOKE if args.smoke else module.FULL
    with tempfile.TemporaryDirectory(
        prefix=f"effectgate-bench-{name.rsplit('.', 1)[-1]}-", dir=args.dir
    ) as tmp:
        result = module.run(Path(tmp), plans)
    lines, met = module.report(result)
    mode = "smoke" if args.smoke else "full"
    print(f"effectgate {title} benchmarks ({mode}; median per operation over blocks, after warm-up)")
    print(f"  {'per operation':<52} {'median':>11} {'p10':>11} {'p90':>11}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": mode, **module.to_json(result)}, indent=2) + "\n")
    return 0 if args.smoke or met else 1


AGENT = "bench"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def read_gate(directory: Path, db_name: str) -> EffectGate:
    """A gate over one read row, `add`, that the agent `bench` may call: the read-path benchmarks' table."""
    store = open_store(f"sqlite:///{directory / db_name}")
    store.setup()
    table = EffectTable([ToolSpec(name="add", effect=Effect.READ, fn=add)])
    table.allow(AGENT, ["add"])
    return EffectGate(table, store, keyring=Keyring.generate())


def timed_block(once: Callable[[], None], after: Callable[[], None] | None = None) -> Callable[[int], int]:
    """A timing block that runs `once` n times, then `after` (a gate's flush: the block's read
    records written inside the timer), and returns the nanoseconds it took."""

    def run(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            once()
        if after is not None:
            after()
        return time.perf_counter_ns() - start

    return run


@dataclass(frozen=True)
class RunPair:
    """One whole agent run timed plain and gated, side by side."""

    plain_run: Stats
    gated_run: Stats

    @property
    def run_ratio(self) -> float:
        return paired_ratio(self.gated_run, self.plain_run)


def measure_pair(gate: EffectGate, blocks: Mapping[str, Callable[[int], int]], plan: Plan) -> RunPair:
    """Time the `plain_run` and `gated_run` blocks interleaved; the gate is closed after."""
    try:
        timed = interleaved(dict(blocks), plan)
    finally:
        gate.close()
        gate.store.close()
    return RunPair(plain_run=timed["plain_run"], gated_run=timed["gated_run"])


def pair_report(
    pair: RunPair, *, plain_label: str, gated_label: str, ratio_line: str, target: float
) -> tuple[list[str], bool]:
    """The two table rows and the ratio line (`ratio_line` names it), and whether `target` was met."""
    met = pair.run_ratio <= target
    lines = rows([(plain_label, pair.plain_run), (gated_label, pair.gated_run)])
    lines.append(
        f"{ratio_line}: {pair.run_ratio:.2f}x (target: <= {target:.2f}x) {'met' if met else 'MISSED'}"
    )
    return lines, met


def pair_json(pair: RunPair, target: float) -> dict[str, Any]:
    return {
        "cases": {"plain_run": pair.plain_run.to_dict(), "gated_run": pair.gated_run.to_dict()},
        "ratios": {"run": {"ratio": pair.run_ratio, "target": target, "met": pair.run_ratio <= target}},
    }
