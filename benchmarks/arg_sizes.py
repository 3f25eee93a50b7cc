"""(g) Cost against argument size: a read call with 1 KB, 100 KB and 1 MB of arguments.

The gate walks the arguments once (freezing them), encodes them once in C and hashes them once,
at call time. The peer does exactly that floor by hand: `json` encode + sha256 of the same
arguments; the ratio shows what the gate adds per byte (it should stay near 1x as the arguments
grow, since the fixed per-call cost is amortised). Flushes are inside the gate's timer.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effectgate import CallContext, Effect, EffectGate, EffectTable, Executed, ToolSpec, open_store

from ._timing import Plan, Stats, interleaved, paired_ratio

AGENT = "bench"
SIZES = {"1 KB": 1_000, "100 KB": 100_000, "1 MB": 1_000_000}


def lookup(query: str, tags: list[str]) -> int:
    """Look something up (returns the query's length)."""
    return len(query)


@dataclass(frozen=True)
class SizeResult:
    label: str
    gated: Stats
    floor: Stats

    @property
    def ratio(self) -> float:
        return paired_ratio(self.gated, self.floor)


def _args(size: int) -> dict[str, Any]:
    tags = [f"tag-{i:05d}" for i in range(size // 40)]
    return {"query": "x" * (size // 2), "tags": tags}


def run(directory: Path, plan: Plan) -> list[SizeResult]:
    store = open_store(f"sqlite:///{directory / 'sizes.db'}")
    store.setup()
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow(AGENT, ["lookup"])
    gate = EffectGate(table, store)
    ctx = CallContext(session_id="bench", origin_message_id="m1", user_id="u1", agent_id=AGENT)
    encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
    out = []
    try:
        for label, size in SIZES.items():
            args = _args(size)
            check = gate.call("lookup", args, ctx)
            if not isinstance(check, Executed):
                raise RuntimeError(f"the gated read did not run: {check!r}")
            n = max(1, plan.n // max(1, size // 1000))

            def floor(n: int, args: dict[str, Any] = args) -> int:
                start = time.perf_counter_ns()
                for _ in range(n):
                    hashlib.sha256(encode({"args": args, "tool": "lookup"}).encode()).hexdigest()
                    lookup(**args)
                return time.perf_counter_ns() - start

            def gated(n: int, args: dict[str, Any] = args) -> int:
                start = time.perf_counter_ns()
                for _ in range(n):
                    gate.call("lookup", args, ctx)
                gate.flush()
                return time.perf_counter_ns() - start

            stats = interleaved(
                {"gated": gated, "floor": floor}, Plan(n=n, repeats=plan.repeats, warmup=plan.warmup)
            )
            out.append(SizeResult(label, stats["gated"], stats["floor"]))
    finally:
        gate.close()
        store.close()
    return out
