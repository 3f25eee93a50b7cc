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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled

from effectgate import EffectGate
from effectgate.testing import Script, call, say
from effectgate_openai_agents import gate_agent
from effectgate_openai_agents.testing import ScriptedModel

from . import _adapter
from ._timing import Plan

READ_RATIO_TARGET = 1.10
FULL = {"run": Plan(n=100, repeats=15, warmup=2)}
SMOKE = {"run": Plan(n=5, repeats=3, warmup=1)}


def _blocks(gate: EffectGate) -> dict[str, Any]:
    plain = Agent(name=_adapter.AGENT, tools=[function_tool(_adapter.add)])
    gated = gate_agent(Agent(name=_adapter.AGENT, tools=[function_tool(_adapter.add)]), gate)
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

    def block(agent: Agent[Any], after: Callable[[], None] | None = None) -> Any:
        def run(n: int) -> int:
            async def many() -> int:
                start = time.perf_counter_ns()
                for _ in range(n):
                    await once(agent)
                if after is not None:
                    after()
                return time.perf_counter_ns() - start

            return asyncio.run(many())

        return run

    # the gated block's read records are written inside its timer (as in (a))
    return {"plain_run": block(plain), "gated_run": block(gated, gate.flush)}


def run(directory: Path, plans: dict[str, Plan]) -> _adapter.RunPair:
    set_tracing_disabled(True)
    gate = _adapter.read_gate(directory, "openai_agents.db")
    return _adapter.measure_pair(gate, _blocks(gate), plans["run"])


def report(result: _adapter.RunPair) -> tuple[list[str], bool]:
    """The lines to print, and whether the target was met."""
    return _adapter.pair_report(
        result,
        plain_label="(g) Runner.run, one read call, plain function_tool",
        gated_label="(g) Runner.run, the same read through gate_agent",
        ratio_line="ratio (g) openai-agents read, gated / plain Runner.run",
        target=READ_RATIO_TARGET,
    )


def to_json(result: _adapter.RunPair) -> dict[str, Any]:
    return _adapter.pair_json(result, READ_RATIO_TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    return _adapter.main(sys.modules[__name__], "OpenAI Agents", argv)


if __name__ == "__main__":
    sys.exit(main())
