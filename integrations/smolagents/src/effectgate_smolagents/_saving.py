"""Saving a gated agent with smolagents' own `to_dict`, `save` and `push_to_hub`.

A gate is a store, a keyring and an effect table: none of it is code smolagents can write into a
folder. So what is saved is the agent as it was before it was wrapped (each tool's own code, as
smolagents saves it, and `final_answer` as it was) with a mark that says it ran gated:

- each gated tool's saved code starts with a `# effectgate: ...` comment and its `to_dict()`
  carries `"effectgate": {"gated": true, "note": ...}`;
- the agent's `to_dict()` (so `agent.json` in a saved folder) carries `"effectgate":
  {"gated_tools": [...], "note": ...}`.

smolagents' loaders (`from_folder`, `from_dict`, `from_hub`) ignore the marks and give a plain
agent: its tools run ungated until it is wrapped again,
`GatedAgent(MultiStepAgent.from_folder(path), effects={...})` (or with the gate built from your
effect table). The note says so wherever the saved agent is read. A CodeAgent's authorized imports
are saved (smolagents' `authorized_imports`) and load with it, but `allow_imports=` is the wrapping
user's decision, never read from a file: a loaded agent that needs it is refused until it is given
again (`_imports`).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from smolagents import Tool
from smolagents.agents import MultiStepAgent

MARK = "effectgate"
TOOL_NOTE = (
    "this tool ran behind an effectgate gate when it was saved; the gate (store, keyring, effect "
    "table) is not code and was not saved. Wrap the loaded agent again before running it: "
    "GatedAgent(agent, effects={...}) or GatedAgent(agent, gate, agent_id=...)."
)
AGENT_NOTE = (
    "this agent's tools ran behind an effectgate gate when it was saved; the saved tools are the "
    "inner, ungated tools. Wrap the loaded agent again before running it: "
    "GatedAgent(agent, effects={...}) or GatedAgent(agent, gate, agent_id=...). A CodeAgent's "
    "acknowledged imports (allow_imports=) are not saved either: give them again, or it is refused."
)


def saved_tool(inner: Tool) -> Callable[[], dict[str, Any]]:
    """What a gated tool's `to_dict()` returns: `inner`'s own, with its code and dict marked."""

    def to_dict() -> dict[str, Any]:
        data: dict[str, Any] = dict(inner.to_dict())
        data["code"] = f"# {MARK}: {TOOL_NOTE}\n{data['code']}"
        data[MARK] = {"gated": True, "note": TOOL_NOTE}
        return data

    return to_dict


def unmarked(inner: Tool) -> Callable[[], dict[str, Any]]:
    """`inner`'s own `to_dict()`, as a closure (for a wrapper that is saved as what it wraps)."""
    return lambda: dict(inner.to_dict())


def mark_saved_agent(agent: MultiStepAgent, gated: Callable[[], list[str]]) -> None:
    """Make the agent's `to_dict()` (and so `save`'s agent.json) name its gated tools. Once per
    agent: wrapping an agent twice does not mark it twice."""
    current = agent.to_dict
    if getattr(current, "_effectgate_marked", False):
        return

    def to_dict(self_: MultiStepAgent) -> dict[str, Any]:
        data: dict[str, Any] = current()
        data[MARK] = {"gated_tools": gated(), "note": AGENT_NOTE}
        return data

    to_dict._effectgate_marked = True  # type: ignore[attr-defined]
    agent.to_dict = types.MethodType(to_dict, agent)
