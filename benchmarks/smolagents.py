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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smolagents import ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from effectgate import EffectGate
from effectgate.testing import Script, call, say
from effectgate_smolagents import Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedModel

from . import _adapter
from ._timing import Plan

READ_RATIO_TARGET = 1.25
FULL = {"run": Plan(n=100, repeats=15, warmup=2)}
SMOKE = {"run": Plan(n=5, repeats=3, warmup=1)}


@tool
def add_tool(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


add_tool.name = "add"


def _script() -> Script:
    return Script([call("add", a=1, b=2), say("3")])


def _blocks(gate: EffectGate) -> dict[str, Any]:
    plain = ToolCallingAgent(tools=[add_tool], model=ScriptedModel(_script()), verbosity_level=LogLevel.OFF)
    gated_agent = ToolCallingAgent(
        tools=[add_tool], model=ScriptedModel(_script()), verbosity_level=LogLevel.OFF
    )
    gated = GatedAgent(gated_agent, gate, agent_id=_adapter.AGENT)

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

    # the gated block's read records are written inside its timer (as in (a))
    return {
        "plain_run": _adapter.timed_block(run_plain),
        "gated_run": _adapter.timed_block(run_gated, gate.flush),
    }


def run(directory: Path, plans: dict[str, Plan]) -> _adapter.RunPair:
    gate = _adapter.read_gate(directory, "smolagents.db")
    return _adapter.measure_pair(gate, _blocks(gate), plans["run"])


def report(result: _adapter.RunPair) -> tuple[list[str], bool]:
    return _adapter.pair_report(
        result,
        plain_label="(h) ToolCallingAgent.run, one read step, plain @tool",
        gated_label="(h) ToolCallingAgent.run, the same read via GatedAgent",
        ratio_line="ratio (h) smolagents read, gated / plain ToolCallingAgent.run",
        target=READ_RATIO_TARGET,
    )


def to_json(result: _adapter.RunPair) -> dict[str, Any]:
    return _adapter.pair_json(result, READ_RATIO_TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    return _adapter.main(sys.modules[__name__], "smolagents", argv)


if __name__ == "__main__":
    sys.exit(main())
