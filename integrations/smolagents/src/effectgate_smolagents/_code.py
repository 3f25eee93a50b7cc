"""How a CodeAgent's snippet stops at a gated call, and what its step keeps.

`ApprovalRequired` is raised at the gated call, so nothing after it in the snippet runs. It is a
`BaseException`, because smolagents turns every Exception from a tool into an observation and
runs the rest of the code. It also passes by the code that records the step's observations, so
`keep_logs_at_a_stop` records them the way smolagents does for a snippet that failed: the print
output up to the stop ("Execution logs:\\n..."), then what the gated call waits for. The step's
memory (what the model reads when the run continues) and the step callbacks see the result of
every call that ran before the stop, as they would for a plain run.
"""

from __future__ import annotations

import types
from collections.abc import Generator
from typing import Any

from smolagents import CodeAgent

from effectgate import Pending

from ._errors import Snippet


class ApprovalRequired(BaseException):
    """Raised inside a CodeAgent's code at the gated call: stops the snippet there.

    A BaseException, because smolagents turns every Exception from a tool into an observation and
    runs the rest of the code."""

    def __init__(self, pending: Pending) -> None:
        super().__init__(f"{pending.card.tool} awaits approval {pending.approval_id}")
        self.pending = pending


def stopped_observation(logs: str, pending: Pending) -> str:
    """The step's observations at a stop: the snippet's print output, then the waiting call."""
    return f"Execution logs:\n{logs}{pending.for_model()} The rest of the code did not run."


def keep_logs_at_a_stop(agent: CodeAgent, snippet: Snippet) -> None:
    """Make the agent's step record its observations when a gated call stops its snippet, and
    start each step with no refusal in `snippet` (the code block in progress)."""
    step_stream = agent._step_stream
    if getattr(step_stream, "_effectgate_logs", False):
        return

    def _step_stream(self_: CodeAgent, memory_step: Any) -> Generator[Any]:
        snippet.refusal = ""
        try:
            yield from step_stream(memory_step)
        except ApprovalRequired as stop:
            state = getattr(self_.python_executor, "state", None) or {}
            memory_step.observations = stopped_observation(str(state.get("_print_outputs", "")), stop.pending)
            raise

    _step_stream._effectgate_logs = True  # type: ignore[attr-defined]
    agent._step_stream = types.MethodType(_step_stream, agent)
