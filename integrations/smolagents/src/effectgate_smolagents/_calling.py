"""How a ToolCallingAgent's step reaches the gate.

smolagents' own argument check (`validate_tool_arguments`) is skipped for gated tools. The gate
validates the arguments as the tool receives them (`_arguments`: a bare value is the tool's first
input, as in smolagents) against the effect table instead, so a bad argument is recorded as
`invalid` and no approval is created. The one model step's gated calls are registered together
(`gate.call_step`) before any of them runs: two calls of one gated tool in a step register neither.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

from smolagents import ToolCallingAgent

from effectgate import EffectGate
from effectgate.adapter import is_gated
from effectgate.canonical import args_hash

from ._arguments import keywords, received
from ._tools import GatedTool


def route_tool_calls(
    agent: ToolCallingAgent,
    *,
    call: Callable[[str, Any], Any],
    start_step: Callable[[Sequence[Any]], None],
    end_step: Callable[[], None],
) -> None:
    """Patch the agent's `execute_tool_call` and `process_tool_calls`: a step's tool calls are
    given to `start_step` before smolagents runs them and `end_step` after, and a gated tool's
    arguments go to the gate as received (`call` when they are not keywords: the gate refuses it)."""
    original_execute = agent.execute_tool_call
    original_process = agent.process_tool_calls

    def execute_tool_call(self_: Any, tool_name: str, arguments: Any) -> Any:
        tool = self_.tools.get(tool_name)
        if isinstance(tool, GatedTool):  # the gate validates against the table, and records it
            arguments = received(self_, tool, arguments)
            if keywords(arguments):
                return tool(**arguments, sanitize_inputs_outputs=True)
            return call(tool_name, arguments)  # not keywords: the gate refuses it
        return original_execute(tool_name, arguments)

    def process_tool_calls(self_: Any, chat_message: Any, memory_step: Any) -> Any:
        start_step(chat_message.tool_calls or [])
        try:
            yield from original_process(chat_message, memory_step)
        finally:
            end_step()

    agent.execute_tool_call = types.MethodType(execute_tool_call, agent)
    agent.process_tool_calls = types.MethodType(process_tool_calls, agent)


def gated_calls(
    agent: ToolCallingAgent, gate: EffectGate, tool_calls: Sequence[Any]
) -> tuple[int, list[tuple[str, Any, str | None]]]:
    """How many calls smolagents runs of a step's `tool_calls` (the last under each id), and the
    gated ones among them as `gate.call_step` takes them: (name, arguments as the tool receives
    them, call id). The id is the model's: recorded as text (an id that is not, a number, must
    not fail the step: smolagents runs it)."""
    runs = {c.id: c for c in tool_calls}
    calls = []
    for c in runs.values():
        tool = agent.tools.get(c.function.name)
        if is_gated(gate, c.function.name) and isinstance(tool, GatedTool):
            # what execute_tool_call will send (smolagents gives it `arguments or {}`)
            args = received(agent, tool, c.function.arguments or {})
            calls.append((c.function.name, args, None if c.id is None else str(c.id)))
    return len(runs), calls


def step_key(name: str, args: Any) -> tuple[str, str]:
    """What a step's registered gated call is found by when it runs: its tool and args hash."""
    try:
        return name, args_hash(name, args)
    except Exception:
        return name, repr(args)
