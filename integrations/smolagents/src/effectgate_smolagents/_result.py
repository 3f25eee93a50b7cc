"""smolagents' `RunResult` for a gated run that finished, when the agent or the run asks for one.

`MultiStepAgent.run(task, return_full_result=...)` answers a `RunResult` (output, token usage,
timing, the memory's steps, "success" or "max_steps_error") when `return_full_result` is true, or
is None and the agent was built with `return_full_result=True`. `GatedAgent.run` drives smolagents'
own steps (streamed, to see each call), so it builds the same `RunResult` here, as smolagents 1.25
and 1.26 build it, and keeps it on `Finished.run_result`. A run that stopped at a gated call has
not finished, and has none.
"""

from __future__ import annotations

import time
from typing import Any

from smolagents.agents import MultiStepAgent, RunResult
from smolagents.memory import ActionStep, PlanningStep
from smolagents.monitoring import Timing, TokenUsage
from smolagents.utils import AgentMaxStepsError


def wants_full_result(agent: MultiStepAgent, asked: bool | None) -> bool:
    """The run's `return_full_result`, else the agent's (smolagents' rule)."""
    return bool(asked if asked is not None else getattr(agent, "return_full_result", False))


def run_result(agent: MultiStepAgent, output: Any, *, started: float) -> RunResult:
    """The `RunResult` smolagents' `run` returns for this finished run (started at `started`)."""
    inputs = outputs = 0
    known = True  # one step without usage and the run's is unknown
    for step in agent.memory.steps:
        if isinstance(step, ActionStep | PlanningStep):
            if step.token_usage is None:
                known = False
                break
            inputs += step.token_usage.input_tokens
            outputs += step.token_usage.output_tokens
    usage = TokenUsage(input_tokens=inputs, output_tokens=outputs) if known else None
    steps = agent.memory.steps
    last_error = getattr(steps[-1], "error", None) if steps else None
    return RunResult(
        output=output,
        token_usage=usage,
        steps=agent.memory.get_full_steps(),
        timing=Timing(start_time=started, end_time=time.time()),
        state="max_steps_error" if isinstance(last_error, AgentMaxStepsError) else "success",
    )
