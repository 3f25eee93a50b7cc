"""Interleaved, repeated timing: the median of per-operation times over blocks, after a warm-up."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Runs `n` operations and returns the nanoseconds its timed part took (setup excluded).
Block = Callable[[int], int]


@dataclass(frozen=True)
class Plan:
    """How much to run: `n` operations per block, `repeats` timed blocks after `warmup` untimed."""

    n: int
    repeats: int
    warmup: int


@dataclass(frozen=True)
class Stats:
    """Per-operation nanoseconds, one sample per timed block (wall), and the process's CPU time
    per operation over the same blocks (`cpu_ns`: every thread, the background writers included)."""

    samples_ns: tuple[float, ...]
    cpu_samples_ns: tuple[float, ...] = ()

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_samples_ns) if self.cpu_samples_ns else None

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ns)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples_ns)
        if len(ordered) == 1:
            return ordered[0]
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    @property
    def p10(self) -> float:
        return self.quantile(0.10)

    @property
    def p90(self) -> float:
        return self.quantile(0.90)

    def to_dict(self) -> dict[str, object]:
        return {
            "median_ns": self.median,
            "p10_ns": self.p10,
            "p90_ns": self.p90,
            "samples_ns": list(self.samples_ns),
            "cpu_median_ns": self.cpu_median,
        }


def paired_ratio(a: Stats, b: Stats) -> float:
    """The median of a/b over blocks timed side by side: drift between blocks cancels in each pair."""
    return statistics.median(x / y for x, y in zip(a.samples_ns, b.samples_ns, strict=True))


def paired_difference(a: Stats, b: Stats) -> float:
    """The median of a-b (ns) over blocks timed side by side."""
    return statistics.median(x - y for x, y in zip(a.samples_ns, b.samples_ns, strict=True))


def interleaved(blocks: Mapping[str, Block], plan: Plan) -> dict[str, Stats]:
    """Time every block `plan.repeats` times, alternating their order so drift hits them alike.

    The collector runs before each block and is off inside it (as `timeit` does), so one
    block does not pay for the garbage of another.
    """
    for _ in range(plan.warmup):
        for block in blocks.values():
            block(plan.n)
    samples: dict[str, list[float]] = {name: [] for name in blocks}
    cpu: dict[str, list[float]] = {name: [] for name in blocks}
    order = list(blocks)
    for r in range(plan.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            gc.collect()
            gc.disable()
            try:
                started = time.process_time_ns()
                elapsed = blocks[name](plan.n)
                used = time.process_time_ns() - started
            finally:
                gc.enable()
            samples[name].append(elapsed / plan.n)
            cpu[name].append(used / plan.n)
    return {name: Stats(tuple(values), tuple(cpu[name])) for name, values in samples.items()}
