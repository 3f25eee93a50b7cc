"""How a ToolCallingAgent's step reaches the gate.

smolagents' own argument check (`validate_tool_arguments`) is skipped for gated tools. The gate
validates the arguments as the tool receives them (`_arguments`: a bare value is the tool's first
input, as in smolagents) against the effect table instead, so a bad argument is recorded as
`invalid` and no approval is created. The one model step's gated calls are registered together
(`gate.call_step`) before any of them runs: two calls of one gated tool in a step register neither.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any, Protocol

from smolagents import ToolCallingAgent

from effectgate import CallContext, EffectGate
from effectgate.adapter import is_gated
from effectgate.canonical import args_hash

from ._arguments import keywords, received
from ._tools import GatedTool


class StepOwner(Protocol):
    """What a ToolCallingAgent's patched step calls back: its `GatedAgent`."""

    gate: EffectGate

    def _call(self, name: str, args: Any) -> Any: ...

    def _context(self) -> CallContext: ...

    def _register_step(self, tool_calls: Sequence[Any]) -> None: ...

    def _end_step(self) -> None: ...


#: a final answer beside other calls of its step: smolagents refuses such a step, after running them all
ALONE = (
    "final_answer did not run: a final answer must be its step's only tool call, and this step made "
    "others. Read what they did, then answer"
)


def route_tool_calls(agent: ToolCallingAgent, owner: StepOwner) -> None:
    """Patch the agent's `execute_tool_call` and `process_tool_calls`: a step's tool calls are
    registered with `owner` before smolagents runs them and ended after, and a gated tool's
    arguments go to the gate as received (`owner._call` when they are not keywords: refused).

    smolagents refuses a step whose final answer comes beside other calls (an error the model
    reads), but only once all of them ran, and drops their observations. So a final answer
    beside other calls does not run (a user's own, gated, may send the answer: it would tell
    the customer of a call that waits or was refused; its refusal is recorded), and is yielded
    after the others, once the step has recorded what they did for the model."""
    original_execute = agent.execute_tool_call
    original_process = agent.process_tool_calls
    crowded = [False]  # the step in progress has more than one tool call

    def execute_tool_call(self_: Any, tool_name: str, arguments: Any) -> Any:
        tool = self_.tools.get(tool_name)
        if tool_name == "final_answer" and crowded[0]:
            if not isinstance(tool, GatedTool):
                return ALONE
            return owner.gate.refuse(
                tool_name, owner._context(), code="parallel_calls", message=ALONE
            ).for_model()
        if isinstance(tool, GatedTool):  # the gate validates against the table, and records it
            arguments = received(self_, tool, arguments)
            if keywords(arguments):
                return tool(**arguments, sanitize_inputs_outputs=True)
            return owner._call(tool_name, arguments)  # not keywords: the gate refuses it
        return original_execute(tool_name, arguments)

    def process_tool_calls(self_: Any, chat_message: Any, memory_step: Any) -> Any:
        crowded[0] = len(chat_message.tool_calls or []) > 1
        owner._register_step(chat_message.tool_calls or [])
        answers = []
        try:
            for output in original_process(chat_message, memory_step):
                if crowded[0] and getattr(output, "is_final_answer", False):
                    answers.append(output)
                else:
                    yield output
            yield from answers  # the step's observations are recorded: smolagents refuses it now
        finally:
            crowded[0] = False
            owner._end_step()

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
        if c.function.name == "final_answer" and len(tool_calls) > 1:
            continue  # it does not run beside other calls (`route_tool_calls`): no approval for it
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
