"""Managed agents: the team members smolagents lets a manager call as if they were tools.

smolagents calls a managed agent with `agent(task=..., additional_args=...)`
(`MultiStepAgent.__call__`, which runs it with its own `run`): from a ToolCallingAgent's
`execute_tool_call`, or from a CodeAgent's code, which is handed every managed agent by name.
The managed agent then runs its own tools, and a managed agent's own managed agents theirs: none
of them is in the manager's `tools`, so the manager's gate would never see them.

So a `GatedAgent` takes a manager only when every managed agent, at every depth, is itself
wrapped by a `GatedAgent` on the same gate (`check_team`): then every tool any of them can run
is a `GatedTool`. Anything else raises `UnknownTool` when the manager is wrapped, whatever
`unknown=` says, and nothing is changed; a run checks again before the model is asked anything,
so a tool or a managed agent added after wrapping is refused too. So is a CodeAgent whose
executor has `additional_functions` (its code could call them, and they are not tools), or whose
code may import a module that is neither effect-free nor acknowledged with `allow_imports=`
(`_imports`): a member is checked against its own `GatedAgent`'s `allow_imports`.

A gated agent's own `run` (what `agent(task)` calls) runs it as a team member
(`serve_as_member`): through its `GatedAgent`, with the identity of the run of the gated
manager that calls it (session, user message, user; its own `agent_id`), so each of its tools
goes through the gate as the manager's own would. A gated call in it stops the manager's run as
the manager's own gated call would (`hold`; a CodeAgent manager's code stops at
the call), and the member's run ends there (its memory is reset when it is called next, as
smolagents resets a managed agent for every call). The manager's run returns
`AwaitingApproval` and `resume` on the manager decides it. Called when none of its gated
managers is running (smolagents' plain `agent.run(task)`), it raises `MissingIdentity`.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from smolagents import Tool
from smolagents.agents import MultiStepAgent
from smolagents.remote_executors import RemotePythonExecutor

from effectgate import EffectGate, Pending
from effectgate.adapter import UnknownTool

from ._code import ApprovalRequired
from ._errors import GateRefusal
from ._format import refuse_format
from ._identity import model_id_of, plain_run_refused
from ._imports import check_imports
from ._outcomes import AwaitingApproval
from ._plain import memory_copy, plain
from ._tools import is_own_final_answer, wrapped_by

if TYPE_CHECKING:
    from ._agent import GatedAgent

# agent -> the GatedAgent its tools call back; kept here, never on the agent (a CodeAgent's code
# can read any attribute of a managed agent it is handed that is not a dunder)
_OWNERS: weakref.WeakKeyDictionary[MultiStepAgent, weakref.ref[GatedAgent]] = weakref.WeakKeyDictionary()
# a member -> the gated managers that have it as a managed agent
_MANAGERS: weakref.WeakKeyDictionary[GatedAgent, weakref.WeakSet[GatedAgent]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

WRAP_FIRST = (
    "smolagents runs a managed agent's own tools, which the gate would never see. Wrap it on the "
    "manager's gate first, GatedAgent(member, gate, agent_id=...), then the manager with the same "
    "gate (or take it out of managed_agents)"
)


def own(agent: MultiStepAgent, owner: GatedAgent) -> None:
    """Record `owner` as the GatedAgent `agent`'s tools go through (the first that wrapped it)."""
    with _LOCK:
        ref = _OWNERS.get(agent)
        if ref is None or ref() is None:
            _OWNERS[agent] = weakref.ref(owner)


def owner_of(agent: object) -> GatedAgent | None:
    if not isinstance(agent, MultiStepAgent):
        return None
    ref = _OWNERS.get(agent)
    return None if ref is None else ref()


def _members(agent: MultiStepAgent) -> list[tuple[str, Any]]:
    managed = getattr(agent, "managed_agents", None) or {}
    if not isinstance(managed, Mapping):
        raise UnknownTool(f"managed_agents is a {type(managed).__name__}, not smolagents' dict: refused")
    return list(managed.items())


def check_executor(agent: MultiStepAgent, who: str, allowed: frozenset[str]) -> None:
    """`UnknownTool` if a CodeAgent's code can call functions that are not tools: the local
    executor's `additional_functions` (`executor_kwargs`) run without the gate; or import a module
    beyond the effect-free ones that `allowed` (its `GatedAgent`'s `allow_imports`) does not name;
    or if it runs in a remote sandbox (smolagents rebuilds its tools there, outside the gate)."""
    executor = getattr(agent, "python_executor", None)
    if isinstance(executor, RemotePythonExecutor):  # smolagents rebuilds the tools there from source
        raise UnknownTool(
            f"{who} runs its code in a {type(executor).__name__}, a remote sandbox: smolagents "
            "defines its tools there from their source, and a gated tool runs only through the "
            "gate in this process. Use the local executor (executor_type='local')"
        )
    check_imports(agent, who, allowed)
    extra = getattr(executor, "additional_functions", None)
    if extra:
        raise UnknownTool(
            f"{who}'s code executor has additional_functions {sorted(extra)}: its code would call "
            "them without the gate. Give them to the agent as tools, each with a row, instead"
        )


def check_tools(agent: MultiStepAgent, who: str, allowed: frozenset[str]) -> None:
    """`UnknownTool` unless every tool of a wrapped agent but smolagents' own `final_answer`
    (`is_own_final_answer`; a tool of the user's named `final_answer` is not) is a gated one,
    and its code (a CodeAgent's) can call or import nothing else (`check_executor`)."""
    check_executor(agent, who, allowed)
    owner = owner_of(agent)
    for name, tool in list(agent.tools.items()):
        if not wrapped_by(tool, owner) and not is_own_final_answer(name, tool):
            raise UnknownTool(
                f"{who} has tool {name!r}, added after it was wrapped: it would run without the "
                "gate, or with another GatedAgent's run identity. Give an agent all its tools "
                "before wrapping it, or wrap a new agent"
            )


def hide_members(agent: MultiStepAgent) -> None:
    """Hand a CodeAgent's code each managed agent as a function that only calls it (its executor's
    `send_tools`, at each run). smolagents hands the agent itself, and the interpreter lets code
    read any attribute that is not a dunder: the member's executor, model and tools, whose class
    is smolagents' `Tool` (`type(tool).mro()`) with `from_code`, an `exec` of any Python, and
    `save`. Through them, code sent what it liked with no approval and no record. Each tool is
    handed as a new function of the run too (`_tool_call`): smolagents' wrapper shares the tool's
    attributes (its `inputs` dict, its call function), where code kept one user's data for the
    next user's run, and wrote text into the next user's system prompt. Its code may not call
    `str.format` (`_format`)."""
    executor = getattr(agent, "python_executor", None)
    send = getattr(executor, "send_tools", None)
    if send is None or getattr(send, "_effectgate_members", False):
        return

    def send_tools(tools: Mapping[str, Any]) -> None:
        send({name: _handed(t) for name, t in tools.items()})
        refuse_format(executor)  # a format string's fields read any attribute (`_format`)

    send_tools._effectgate_members = True  # type: ignore[attr-defined]
    executor.send_tools = send_tools  # type: ignore[union-attr]


def _handed(tool: Any) -> Any:
    """What a CodeAgent's code is handed for one entry of its tools (see `hide_members`)."""
    if isinstance(tool, MultiStepAgent):
        return _calling(tool)
    return _tool_call(tool) if isinstance(tool, Tool) else tool


def _tool_call(tool: Tool) -> Callable[..., Any]:
    """`tool` as a function that only calls it, with plain copies of what describes it."""
    call = _only_call(tool, tool.name, tool.description)
    vars(call).update({a: plain(getattr(tool, a, None)) for a in _DESCRIBING})
    return call


_DESCRIBING = ("name", "description", "inputs", "output_type", "output_schema")


def _calling(member: MultiStepAgent) -> Callable[..., Any]:
    """`member` as a function that only calls it, with what code read of it before: its `tools`,
    each a function that only calls the tool (outside the member's run a gated one refuses,
    `MissingIdentity`), its `task` and a copy of its `memory` of plain data (`_plain`: its
    steps held live images, whose `save` wrote files), as the run started and after each call
    (`forget_others` cleared another user's)."""
    run = _only_call(member, member.name or "managed_agent", member.description)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        finally:
            vars(call).update(memory=memory_copy(member.memory), task=plain(member.task))

    call.__name__ = call.__qualname__ = run.__name__
    call.__doc__ = run.__doc__
    tools = {n: _refusing(n, run.__name__, getattr(t, "description", None)) for n, t in member.tools.items()}
    vars(call).update(tools=tools, memory=memory_copy(member.memory), task=plain(member.task))
    return call


def _refusing(name: str, member: str, doc: str | None) -> Callable[..., Any]:
    """A member's tool as the manager's code sees it: a function that runs nothing and tells the
    model how to have it done (`GateRefusal`, an error it reads). Calling the tool itself, outside
    the member's run, raised `MissingIdentity` out of the application's run."""

    def call(*args: Any, **kwargs: Any) -> Any:
        raise GateRefusal(
            f"{name} is a tool of the managed agent {member}: code cannot call it (nothing ran); "
            f"ask the agent: {member}(task=...)"
        )

    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    return call


def _only_call(target: Callable[..., Any], name: str, doc: str | None) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    return call


def check_team(
    agent: MultiStepAgent, gate: EffectGate | None, allowed: frozenset[str], owner: GatedAgent | None = None
) -> list[GatedAgent]:
    """The GatedAgents of `agent`'s managed agents, after checking that every managed agent at
    every depth is wrapped by a GatedAgent on `gate` with no tool added since. `UnknownTool`
    otherwise; with `gate` None (the manager's gate is not built yet) every managed agent is.
    `agent`'s own executor is checked too (`check_executor`, with `allowed`, the `allow_imports`
    it is wrapped with); its tools are its `GatedAgent`'s. A member's imports are checked against
    its own `GatedAgent`'s `allow_imports`. TypeError if a GatedAgent other than `owner` gated
    `agent` already: its tools would call that one, outside its runs."""
    if owner_of(agent) not in (None, owner):
        raise TypeError("this agent is already gated by another GatedAgent: wrap a new agent instead")
    check_executor(agent, "the agent", allowed)
    direct: list[GatedAgent] = []
    seen = {id(agent)}
    todo: list[tuple[MultiStepAgent, str]] = [(agent, "")]
    while todo:
        manager, path = todo.pop()
        for name, member in _members(manager):
            where = f"managed agent '{path}{name}'"
            owner = owner_of(member)
            if gate is None:
                raise UnknownTool(
                    f"{where}: a manager and its managed agents are gated on one gate, and effects= "
                    "would build a new one. Build the gate first (gate_for(native_tools(member) + "
                    "native_tools(manager), effects, agent_id=...), or from your effect table), "
                    "wrap each managed agent on it, then GatedAgent(manager, gate, agent_id=...)"
                )
            if owner is None:
                raise UnknownTool(f"{where} is not gated: {WRAP_FIRST}")
            if owner.gate is not gate:
                raise UnknownTool(
                    f"{where} is gated on another gate: its approvals would be out of the "
                    "manager's pause and resume. Wrap it on the manager's gate"
                )
            if manager is agent:
                direct.append(owner)
            if id(member) in seen:
                continue
            seen.add(id(member))
            check_tools(member, where, owner.allow_imports)
            todo.append((member, f"{path}{name}."))
    return direct


def adopt(manager: GatedAgent, members: list[GatedAgent]) -> None:
    """Record `manager` as a gated manager of each member (whose run then runs as its member)."""
    with _LOCK:
        for member in members:
            _MANAGERS.setdefault(member, weakref.WeakSet()).add(manager)


def _manages(outer: GatedAgent, inner: GatedAgent) -> bool:
    """Whether `inner` is a member of `outer`, at any depth (with `_LOCK` held)."""
    todo, seen = [inner], set()
    while todo:
        for manager in _MANAGERS.get(todo.pop(), ()):
            if manager is outer:
                return True
            if id(manager) not in seen:
                seen.add(id(manager))
                todo.append(manager)
    return False


def _running_manager(member: GatedAgent) -> GatedAgent:
    """The gated manager of `member` whose run is in progress and innermost: in a nested team
    (M runs A, A calls B, and M manages B too) A's run, which M's run contains; `MissingIdentity`
    if none runs, and ambiguous (it does not run) when two unrelated runs could be served."""
    with _LOCK:
        running = [m for m in _MANAGERS.get(member, ()) if m._current is not None]
        running = [m for m in running if not any(o is not m and _manages(m, o) for o in running)]
    if not running:
        raise plain_run_refused()
    if len(running) > 1:
        raise RuntimeError(
            f"managed agent {member.agent.name!r} was called while {len(running)} of its gated "
            "managers run: whose run it serves is ambiguous, so it does not run"
        )
    return running[0]


def hold(manager: GatedAgent, member: str, pending: Sequence[Pending]) -> str:
    """Managed agent `member` stopped at gated calls: they wait with the manager's run's own, and
    that run stops as at a gated call of its own (a CodeAgent manager's code at the call)."""
    with manager._lock:
        for p in pending:
            manager._pending[p.approval_id] = p
    manager.agent.interrupt()
    if manager.code:
        manager._stopped = pending[0]
        raise ApprovalRequired(pending[0])
    return f"{member} stopped: " + " ".join(p.for_model() for p in pending)


def serve_as_member(member: GatedAgent) -> Callable[..., Any]:
    """What the wrapped agent's own `run` does (`refuse_plain_runs`): run as a team member of
    its gated manager's run in progress, and return what smolagents' `run` would (the output)."""

    def run(task: str, *args: Any, additional_args: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        manager = _running_manager(member)
        if args or kwargs or not isinstance(additional_args, Mapping | None):
            raise TypeError(
                f"managed agent {member.agent.name!r} takes a task and additional_args (a dict), "
                f"not {', '.join([*map(repr, args), *kwargs]) or repr(additional_args)}"
            )
        manager._check_stopped()  # a CodeAgent manager already stopped: nothing more runs
        ctx = dataclasses.replace(
            manager._context(),
            agent_id=member.agent_id,
            tool_call_id=None,
            model_id=model_id_of(member.agent),
        )
        outcome = member._drive(
            task, ctx, reset=True, max_steps=None, return_full_result=False, additional_args=additional_args
        )
        if isinstance(outcome, AwaitingApproval):  # the manager's run stops too
            return hold(manager, member.agent.name or "a managed agent", outcome.pending)
        return outcome.output

    return run
