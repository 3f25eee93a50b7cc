"""A ToolCallingAgent call's arguments as the tool receives them, and what a bad one raises.

smolagents' `execute_tool_call` substitutes state variables in a dict of arguments, then calls
`tool(**arguments)` for a dict and `tool(arguments)` for anything else: a bare value (a string, a
list) is given positionally to `forward`, so it is the tool's first input. The gate validates and
hashes what the tool receives, so `received` builds that object before the gate sees it:

- a dict: state variables substituted, agent types (`AgentImage`, ...) as their raw values, as
  `Tool.__call__` gives them to `forward`;
- a bare value, for a tool with inputs: `{first input of forward: value}` (a tool with more than one input
  then misses the others, and the gate refuses it: smolagents' `forward` would fail to bind);
- anything else (a value for a tool without inputs, a mapping with a key that is not a string) as
  it is: the gate refuses it (`Invalid`) and nothing runs.

A bad argument (the gate answers `Invalid`, nothing ran) in a step with one call raises
`AgentToolCallError`, as smolagents' own check (`validate_tool_arguments`) does: the step records
it as its error and the model reads it as "Error: ... Now let's retry". The text is the gate's,
which names each failing field. In a step with parallel calls it is the call's observation
instead, as a tool's own failure is there (`_errors`), so the step's other calls keep theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smolagents import Tool
from smolagents.agent_types import handle_agent_input_types
from smolagents.agents import MultiStepAgent
from smolagents.monitoring import AgentLogger
from smolagents.utils import AgentToolCallError

from effectgate import Invalid

from ._errors import Snippet, refused

#: `Tool.__call__`'s own keyword: an argument of that name cannot be passed through it
_CALL_OPTION = "sanitize_inputs_outputs"


def received(agent: MultiStepAgent, tool: Tool, arguments: Any) -> Any:
    """The arguments `tool` receives when `agent.execute_tool_call` is given `arguments`."""
    arguments = agent._substitute_state_variables(arguments)
    if isinstance(arguments, Mapping):
        if not keywords(arguments):
            return arguments
        _, kwargs = handle_agent_input_types(**arguments)
        return kwargs
    order = getattr(tool, "positional", None) or tuple(tool.inputs)  # a GatedTool's: forward's order
    if order:
        return {order[0]: handle_agent_input_types(arguments)[0][0]}
    return arguments


def keywords(arguments: Any) -> bool:
    """Whether `arguments` can be passed as `tool(**arguments, sanitize_inputs_outputs=True)`."""
    return (
        isinstance(arguments, Mapping)
        and all(isinstance(key, str) for key in arguments)
        and _CALL_OPTION not in arguments
    )


def bad_argument(outcome: Invalid, *, code: Snippet | None, parallel: bool, logger: AgentLogger) -> str:
    """Raise `AgentToolCallError` for a ToolCallingAgent step's only call (see the module
    docstring); in a CodeAgent's code (`code`) raise it as a refusal is raised (`refused`: the
    block's `final_answer` cannot claim the call done unread); otherwise return the gate's text."""
    text = outcome.for_model()
    if code is not None:
        return refused(text, code=code)
    if parallel:
        return text
    raise AgentToolCallError(text, logger)
