"""What else a gated agent can run besides its function tools: MCP servers, handoffs, agents as tools.

`gate_agent` gates an agent's function tools. Anything else on the agent that the model can make
run would bypass the effect table, so it is refused when the agent is wrapped (deny by default,
`TypeError` naming what to do), and checked again on every model answer of the gated agent,
before any call of that answer runs, because an `Agent` is a mutable object (a handoff appended
after wrapping, e.g. to close a cycle between two gated agents, is checked there):

- `mcp_servers`: an MCP server's tools run in the server and never reach `on_invoke_tool`. Route
  the server through effectgate's MCP proxy (`effectgate mcp proxy --config proxy.toml`, the
  README's MCP section), whose gate decides every call, and name that connection in
  `gate_agent(..., mcp_proxies=[server])`. Any other server is refused.
- `handoffs`: the target agent takes over the run with its own tools. A target made by
  `gate_agent` on the same gate is accepted: its tools run through this gate, under the run's one
  signed identity, and it is checked the same way when it answers. A `Handoff` object is accepted
  only when its target can be inspected (`handoff(agent)` keeps a reference to it) and is such an
  agent; the agent its `on_invoke_handoff` returns is checked again before the SDK switches to it.
  Any other handoff is refused: gate the target first, on the same gate.
- agents as tools (`agent.as_tool(...)` among the tools): the call is gated by the tool's own row,
  and the inner agent's run must be gated too, by the same rule as a handoff target. When that
  agent (or a gated agent it reaches) has a gated tool, its run can pause for approval, and the
  SDK resumes it by calling the tool again: the tool's row must then be a read, which runs every
  call (a write or gated row would answer the second call from its record of the first, which
  returned while the agent waited, so the approved call would never run). An agent that
  defers gated calls (`mode="deferred"`) cannot be a tool: its deferred answer would end only
  its own run, inside the tool, where `deferred_operations` never finds it. The gate runs a
  row's function, not the tool the agent holds: a row made with `native_tool(agent.as_tool(...))`
  is checked by the same rules (an ungated agent there would run its tools with no approval).

Hosted tools never reach `on_invoke_tool` and are refused too (`_agent._function_tools`).
Guardrails, hooks, `tool_use_behavior` and handoff callbacks are the application's code, not
something the model calls, and are not checked.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from agents import Agent, Handoff, RunContextWrapper

from effectgate import EffectGate
from effectgate.adapter import is_gated
from effectgate.effects import Effect

from ._native import SOURCE_ATTR

#: The attribute a gated tool's `on_invoke_tool` carries: the gate every call of it goes through.
GATE_ATTR = "_effectgate_gate"
_MODE_ATTR = "_effectgate_mode"


def mark(on_invoke: Callable[..., Any], gate: EffectGate, mode: str = "approval") -> None:
    """Tag a gated tool's `on_invoke_tool` with its gate (`tool_gate` reads it) and its mode."""
    setattr(on_invoke, GATE_ATTR, gate)
    setattr(on_invoke, _MODE_ATTR, mode)


def tool_gate(tool: Any) -> EffectGate | None:
    """The gate every call of `tool` goes through (None: not a tool effectgate wrapped)."""
    gate = getattr(getattr(tool, "on_invoke_tool", None), GATE_ATTR, None)
    return gate if isinstance(gate, EffectGate) else None


def agent_gate(agent: Any) -> EffectGate | None:
    """The gate of an agent `gate_agent` made (its hooks carry it), else None."""
    gate = getattr(getattr(agent, "hooks", None), "gate", None)
    return gate if isinstance(gate, EffectGate) else None


def _target(entry: Any) -> Any:
    """A handoff's target agent, or None when it cannot be inspected."""
    if isinstance(entry, Agent):
        return entry
    ref = getattr(entry, "_agent_ref", None) if isinstance(entry, Handoff) else None
    return ref() if callable(ref) else None


def _gated_here(agent: Any, gate: EffectGate, what: str) -> str | None:
    """Why `agent` may not be reached from a gated agent (None: it may)."""
    if not isinstance(agent, Agent):
        return f"{what} cannot be inspected, so effectgate cannot tell whether its tools are gated"
    found = agent_gate(agent)
    if found is None:
        return f"{what} reaches agent {agent.name!r}, which effectgate has not gated"
    if found is not gate:
        return f"{what} reaches agent {agent.name!r}, which is gated by another gate"
    return None


def _pauses(agent: Any, gate: EffectGate) -> tuple[bool, bool]:
    """Whether a run of `agent`, or of an agent it reaches (handoffs, agents as tools), can pause
    for approval (a tool of a row `gate` gates), and whether it can defer such a call."""
    seen: set[int] = set()
    todo = [agent]
    pause = defer = False
    while todo:
        other = todo.pop()
        if not isinstance(other, Agent) or id(other) in seen:
            continue
        seen.add(id(other))
        for tool in other.tools:
            if is_gated(gate, str(getattr(tool, "name", ""))):
                deferred = getattr(getattr(tool, "on_invoke_tool", None), _MODE_ATTR, None) == "deferred"
                defer, pause = defer or deferred, pause or not deferred
            todo.append(getattr(tool, "_agent_instance", None))
        todo += [_target(e) for e in other.handoffs]
    return pause, defer


def _resumable(tool: Any, gate: EffectGate) -> str | None:
    """Why the agent tool `tool` could lose its agent's paused or deferred call (None: it cannot)."""
    spec = gate.table.get(str(tool.name))
    inner = getattr(tool, "_agent_instance", None)
    if spec is None or not isinstance(inner, Agent):
        return None
    pause, defer = _pauses(inner, gate)
    if defer:
        return (
            f"tool {tool.name!r} runs agent {inner.name!r}, which defers gated calls: a deferred "
            "answer ends that agent's run only, inside the tool, so deferred_operations of the "
            "run never lists it and nothing would execute it. Gate that agent in approval mode"
        )
    if not pause or spec.effect is Effect.READ:
        return None
    return (
        f"tool {tool.name!r} runs agent {inner.name!r}, which can pause for approval: the SDK "
        f"resumes it by calling the tool again, which its {spec.effect.value} row would answer "
        "from its record of the first call (made while the agent waited), so the approved call "
        "would never run. Give the tool a read row: each of the agent's own tools is gated by "
        "its row"
    )


def problems(
    agent: Agent[Any], gate: EffectGate, *, proxies: Sequence[Any], tools: Sequence[Any]
) -> list[str]:
    """What `agent` (with `tools` as the tools it will have) can run outside `gate`."""
    found: list[str] = []
    for server in getattr(agent, "mcp_servers", None) or ():
        if not any(server is p for p in proxies):
            found.append(
                f"MCP server {getattr(server, 'name', server)!r}: its tools run in the server, not "
                "through effectgate. Route it through effectgate's MCP proxy (`effectgate mcp proxy "
                "--config proxy.toml`, see the README's MCP section) and pass that connection as "
                "gate_agent(..., mcp_proxies=[server]), or remove it"
            )
    for entry in agent.handoffs:
        name = getattr(entry, "tool_name", None) or getattr(entry, "name", entry)
        why = _gated_here(_target(entry), gate, f"handoff {name!r}")
        if why is not None:
            found.append(
                f"{why}: its tools would run outside the effect table. Gate the target on this "
                "gate first (handoffs=[gate_agent(target, gate)], or handoff(gated_target)), with "
                "a table that has rows for its tools"
            )
    for tool in tools:
        if getattr(tool, "_is_agent_tool", False):
            why = _gated_here(getattr(tool, "_agent_instance", None), gate, f"tool {tool.name!r}")
            if why is not None:
                found.append(
                    f"{why}: the agent's own tools would run outside the effect table. Gate that "
                    "agent on this gate first: gate_agent(agent, gate).as_tool(...)"
                )
            elif (stuck := _resumable(tool, gate)) is not None:
                found.append(stuck)
    return found


def _row_tools(gate: EffectGate, tools: Sequence[Any]) -> list[Any]:
    """The SDK tools the gate runs for `tools`' rows (`native_tool` functions), other than those."""
    found = []
    for tool in tools:
        spec = gate.table.get(str(getattr(tool, "name", "")))
        source = getattr(getattr(spec, "fn", None), SOURCE_ATTR, None)
        if source is not None and source is not tool and all(source is not t for t in tools):
            found.append(source)
    return found


def check_reach(agent: Agent[Any], gate: EffectGate, *, proxies: Sequence[Any], tools: Sequence[Any]) -> None:
    """At wrap time: `TypeError` listing everything `agent` could run outside `gate`, including
    through the gated agents it reaches (their tools must all be this gate's). A row whose function
    is an SDK tool (`native_tool`) runs that tool, not the one the agent holds: it is checked too."""
    tools = [*tools, *_row_tools(gate, tools)]
    found = problems(agent, gate, proxies=proxies, tools=tools)
    seen = {id(agent)}
    todo = [_target(e) for e in agent.handoffs] + [getattr(t, "_agent_instance", None) for t in tools]
    while todo:  # the gated agents reachable from here, as they are now
        other = todo.pop()
        if not isinstance(other, Agent) or id(other) in seen or agent_gate(other) is not gate:
            continue
        seen.add(id(other))
        found += [f"agent {other.name!r}: {why}" for why in current_problems(other, gate)]
        todo += [_target(e) for e in other.handoffs]
    if found:
        raise TypeError(
            f"gate_agent({agent.name!r}) would let the model run what effectgate does not gate:\n- "
            + "\n- ".join(found)
        )


def current_problems(agent: Agent[Any], gate: EffectGate) -> list[str]:
    """What a gated agent, as it is now, can run outside `gate` (tools, MCP servers, handoffs)."""
    hooks = getattr(agent, "hooks", None)
    found = problems(agent, gate, proxies=getattr(hooks, "mcp_proxies", ()), tools=())
    for tool in agent.tools:
        if tool_gate(tool) is not gate:
            found.append(
                f"tool {getattr(tool, 'name', tool)!r} does not run through this gate (added after "
                "gate_agent?): wrap the agent again with every tool"
            )
    return found


def check_current(agent: Agent[Any], gate: EffectGate) -> None:
    """On each model answer of a gated agent, before its calls run: `TypeError` (the run ends,
    nothing of that answer runs) when the agent can now run something outside `gate`."""
    found = current_problems(agent, gate)
    if found:
        raise TypeError(
            f"gated agent {agent.name!r} was changed after gate_agent; effectgate does not gate:\n- "
            + "\n- ".join(found)
        )


def checked_handoffs(handoffs: Sequence[Any], gate: EffectGate) -> list[Any]:
    """The handoffs for a gated clone: each `Handoff` object a copy whose `on_invoke_handoff` checks
    the agent it returns before the SDK switches to it (a plain `Agent` entry is its own target)."""
    out: list[Any] = []
    for entry in handoffs:
        if not isinstance(entry, Handoff):
            out.append(entry)
            continue
        invoke = entry.on_invoke_handoff

        async def checked(ctx: RunContextWrapper[Any], arguments: str, _invoke: Any = invoke) -> Any:
            target = await _invoke(ctx, arguments)
            why = _gated_here(target, gate, "the handoff")
            if why is not None:
                raise TypeError(f"{why}; effectgate refused the handoff and nothing of it ran")
            return target

        made = copy.copy(entry)  # keeps the SDK's reference to the target
        made.on_invoke_handoff = checked
        out.append(made)
    return out


__all__ = [
    "GATE_ATTR",
    "agent_gate",
    "check_current",
    "check_reach",
    "checked_handoffs",
    "mark",
    "tool_gate",
]
