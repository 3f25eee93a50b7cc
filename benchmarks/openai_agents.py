"""OpenAI Agents SDK: one `Runner.run` with a read tool call, gated against ungated.

`python -m benchmarks.openai_agents [--smoke] [--json FILE] [--dir DIR]`

(g) One whole `Runner.run` on a scripted model that makes one read call and then answers (two
    model calls, one tool call): the tool wrapped by `gate_agent` (needs_approval decided by the
    table, the call validated, scope-checked, run and logged by the gate) against the same
    function as a plain `@function_tool`. Same agent shape, same scripted turns, tracing off.
    Target: at most 1.10x.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled

from effectgate import Effect, EffectGate, EffectTable, Keyring, ToolSpec, open_store
from effectgate.testing import Script, call, say
from effectgate_openai_agents import gate_agent
from effectgate_openai_agents.testing import ScriptedModel

from . import _adapter
from ._timing import Plan, Stats, interleaved, paired_ratio

READ_RATIO_TARGET = 1.10
AGENT = "bench"
FULL = {"run": Plan(n=100, repeats=15, warmup=2)}
SMOKE = {"run": Plan(n=5, repeats=3, warmup=1)}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@dataclass(frozen=True)
class OpenAIAgentsResult:
    plain_run: Stats
    gated_run: Stats

    @property
    def run_ratio(self) -> float:
        return paired_ratio(self.gated_run, self.plain_run)


def _gate(directory: Path) -> EffectGate:
    store = open_store(f"sqlite:///{directory / 'openai_agents.db'}")
    store.setup()
    table = EffectTable([ToolSpec(name="add", effect=Effect.READ, fn=add)])
    table.allow(AGENT, ["add"])
    return EffectGate(table, store, keyring=Keyring.generate())


def _blocks(gate: EffectGate) -> dict[str, Any]:
    plain = Agent(name=AGENT, tools=[function_tool(add)])
    gated = gate_agent(Agent(name=AGENT, tools=[function_tool(add)]), gate)
    context = {"session_id": "bench", "origin_message_id": "m1", "user_id": "u1"}

    def config() -> RunConfig:
        script = Script([call("add", a=1, b=2), say("3")])
        return RunConfig(model=ScriptedModel(script), tracing_disabled=True)

    async def once(agent: Agent[Any]) -> None:
        result = await Runner.run(agent, "add 1 and 2", context=dict(context), run_config=config())
        outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
        if outputs not in ([3], ["3"]) or result.final_output != "3":
            raise RuntimeError(f"{agent.name}: the read did not run as expected: {outputs!r}")

    for agent in (plain, gated):
        asyncio.run(once(agent))

    def block(agent: Agent[Any]) -> Any:
        def run(n: int) -> int:
            async def many() -> int:
                start = time.perf_counter_ns()
                for _ in range(n):
                    await once(agent)
                return time.perf_counter_ns() - start

            return asyncio.run(many())

        return run

    return {"plain_run": block(plain), "gated_run": block(gated)}


def run(directory: Path, plans: dict[str, Plan]) -> OpenAIAgentsResult:
    set_tracing_disabled(True)
    gate = _gate(directory)
    try:
        timed = interleaved(_blocks(gate), plans["run"])
    finally:
        gate.close()
        gate.store.close()
    return OpenAIAgentsResult(plain_run=timed["plain_run"], gated_run=timed["gated_run"])


def report(result: OpenAIAgentsResult) -> tuple[list[str], bool]:
    """The lines to print, and whether the target was met."""
    met = result.run_ratio <= READ_RATIO_TARGET
    rows = [
        ("(g) Runner.run, one read call, plain function_tool", result.plain_run),
        ("(g) Runner.run, the same read through gate_agent", result.gated_run),
    ]
    lines = _adapter.rows(rows)
    lines.append(
        f"ratio (g) openai-agents read, gated / plain Runner.run: {result.run_ratio:.2f}x "
        f"(target: <= {READ_RATIO_TARGET:.2f}x) {'met' if met else 'MISSED'}"
    )
    return lines, met


def to_json(result: OpenAIAgentsResult) -> dict[str, Any]:
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
    return _adapter.main(sys.modules[__name__], "OpenAI Agents", argv)


if __name__ == "__main__":
    sys.exit(main())
