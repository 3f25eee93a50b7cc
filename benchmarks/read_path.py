"""(a) The read path: `gate.call` of a trivial read tool against calling the function directly.

The gate validates the arguments, checks the allowlist and scope, runs the tool and buffers a
read record (written in batches by a background writer); each timed block ends with
`gate.flush()`, so every record of the block is durably written inside the timer: the batch
writes are part of the measured cost, amortised over the calls, which is what an agent pays.
CPU time (every thread of the process) is reported beside wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from effectgate import CallContext, Effect, EffectGate, EffectTable, Executed, ToolSpec, open_store

from ._timing import Plan, Stats, interleaved, paired_difference, paired_ratio

AGENT = "bench"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@dataclass(frozen=True)
class ReadResult:
    direct: Stats
    gated: Stats

    @property
    def overhead_us(self) -> float:
        return paired_difference(self.gated, self.direct) / 1000

    @property
    def ratio(self) -> float:
        return paired_ratio(self.gated, self.direct)


def run(directory: Path, plan: Plan) -> ReadResult:
    store = open_store(f"sqlite:///{directory / 'read.db'}")
    store.setup()
    table = EffectTable([ToolSpec(name="add", effect=Effect.READ, fn=add)])
    table.allow(AGENT, ["add"])
    gate = EffectGate(table, store)
    ctx = CallContext(session_id="bench", origin_message_id="m1", user_id="u1", agent_id=AGENT)
    args = {"a": 1, "b": 2}
    check = gate.call("add", args, ctx)
    if not (isinstance(check, Executed) and check.result == 3):
        raise RuntimeError(f"the gated read did not run: {check!r}")

    def direct(n: int) -> int:
        fn = add
        start = time.perf_counter_ns()
        for _ in range(n):
            fn(1, 2)
        return time.perf_counter_ns() - start

    def gated(n: int) -> int:
        call = gate.call
        start = time.perf_counter_ns()
        for _ in range(n):
            call("add", args, ctx)
        gate.flush()  # the block's read records are durably written inside the timer
        return time.perf_counter_ns() - start

    try:
        stats = interleaved({"direct": direct, "gated": gated}, plan)
    finally:
        gate.close()
        store.close()
    return ReadResult(direct=stats["direct"], gated=stats["gated"])
