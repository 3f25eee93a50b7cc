"""smolagents: one ToolCallingAgent run with a read tool step, gated against ungated.

`python -m benchmarks.smolagents [--smoke] [--json FILE] [--dir DIR]`

(h) One `ToolCallingAgent.run` on a scripted model: a step that calls one read tool, then the
    final answer. Gated: the tool wrapped by `GatedAgent` (the gate validates, runs and logs the
    read; the step's gated calls are registered, none here). Plain: the same function as `@tool`.
    Target: at most 1.25x. A smolagents step is cheap (~0.13 ms) next to its ~2 ms fixed cost per
    run (prompt rendering, memory, logger), so the gate's per-call cost is what shows.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smolagents import ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from effectgate import Effect, EffectGate, EffectTable, Keyring, ToolSpec, open_store
from effectgate.testing import Script, call, say
from effectgate_smolagents import Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedModel

from . import _adapter
from ._timing import Plan, Stats, interleaved, paired_ratio

READ_RATIO_TARGET = 1.25
AGENT = "bench"
FULL = {"run": Plan(n=100, repeats=15, warmup=2)}
SMOKE = {"run": Plan(n=5, repeats=3, warmup=1)}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def add_tool(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


add_tool.name = "add"


@dataclass(frozen=True)
class SmolagentsResult:
    plain_run: Stats
    gated_run: Stats

    @property
    def run_ratio(self) -> float:
        return paired_ratio(self.gated_run, self.plain_run)


def _gate(directory: Path) -> EffectGate:
    store = open_store(f"sqlite:///{directory / 'smolagents.db'}")
    store.setup()
    table = EffectTable([ToolSpec(name="add", effect=Effect.READ, fn=add)])
    table.allow(AGENT, ["add"])
    return EffectGate(table, store, keyring=Keyring.generate())


def _script() -> Script:
    return Script([call("add", a=1, b=2), say("3")])


def _blocks(gate: EffectGate) -> dict[str, Any]:
    plain = ToolCallingAgent(tools=[add_tool], model=ScriptedModel(_script()), verbosity_level=LogLevel.OFF)
    gated_agent = ToolCallingAgent(
        tools=[add_tool], model=ScriptedModel(_script()), verbosity_level=LogLevel.OFF
    )
    gated = GatedAgent(gated_agent, gate, agent_id=AGENT)

    def run_plain() -> None:
        plain.model = ScriptedModel(_script())
        if plain.run("add 1 and 2") != "3":
            raise RuntimeError("the plain run did not answer")

    def run_gated() -> None:
        gated_agent.model = ScriptedModel(_script())
        out = gated.run("add 1 and 2", session_id="bench", origin_message_id="m1", user_id="u1")
        if not isinstance(out, Finished) or out.output != "3" or out.observations != (("add", "3"),):
            raise RuntimeError(f"the gated run did not run the read: {out!r}")

    for once in (run_plain, run_gated):
        once()

    def block(once: Any) -> Any:
        def run(n: int) -> int:
            start = time.perf_counter_ns()
            for _ in range(n):
                once()
            return time.perf_counter_ns() - start

        return run

    return {"plain_run": block(run_plain), "gated_run": block(run_gated)}


def run(directory: Path, plans: dict[str, Plan]) -> SmolagentsResult:
    gate = _gate(directory)
    try:
        timed = interleaved(_blocks(gate), plans["run"])
    finally:
        gate.close()
        gate.store.close()
    return SmolagentsResult(plain_run=timed["plain_run"], gated_run=timed["gated_run"])


def report(result: SmolagentsResult) -> tuple[list[str], bool]:
    met = result.run_ratio <= READ_RATIO_TARGET
    lines = _adapter.rows(
        [
            ("(h) ToolCallingAgent.run, one read step, plain @tool", result.plain_run),
            ("(h) ToolCallingAgent.run, the same read via GatedAgent", result.gated_run),
        ]
    )
    lines.append(
        f"ratio (h) smolagents read, gated / plain ToolCallingAgent.run: {result.run_ratio:.2f}x "
        f"(target: <= {READ_RATIO_TARGET:.2f}x) {'met' if met else 'MISSED'}"
    )
    return lines, met


def to_json(result: SmolagentsResult) -> dict[str, Any]:
    return {
        "cases": {"plain_run": result.plain_run.to_dict(), "gated_run": result.gated_run.to_dict()},
        "ratios": {
            "run": {
                "ratio": result.run_ratio,
                "target": READ_RATIO_TARGET,
                "met": result.run_ratio <= READ_RATIO_TARGET,
            }
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    return _adapter.main(sys.modules[__name__], "smolagents", argv)


if __name__ == "__main__":
    sys.exit(main())
