"""The tools a `GatedAgent` puts in place of the agent's own, and the gate's view of an agent's tools.

smolagents' interpreter lets a CodeAgent's code read and set any attribute that is not a dunder,
so a `GatedTool` (and a CodeAgent's guarded `final_answer`, `StopGuard`) keeps its owner, the
`GatedAgent`, only in a closure: code cannot reach the gate or the agent through a tool.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from smolagents import Tool
from smolagents.agents import MultiStepAgent
from smolagents.default_tools import FinalAnswerTool

from effectgate.rows import NativeTool

from ._native import native_tool
from ._saving import saved_tool, unmarked


class Owner(Protocol):
    """What a wrapped tool calls back: the `GatedAgent` that wrapped it."""

    def _call(self, name: str, args: Any) -> Any: ...

    def _check_stopped(self, answer: bool = False) -> None: ...


class GatedTool(Tool):
    """A smolagents Tool standing for `inner`, whose every call goes through the gate.

    It keeps no attribute that leads to the gate, the `GatedAgent` or `inner`: a CodeAgent's
    code can read and set any attribute whose name is not a dunder (`refund_order._owner`,
    `setattr`), so what it may reach from a tool is only the call itself, held in a closure."""

    skip_forward_signature_validation = True

    def __init__(self, inner: Tool, owner: Owner) -> None:
        _described_as(self, inner)
        _HELD_BY[self] = weakref.ref(owner)
        self.output_schema = getattr(inner, "output_schema", None)
        self.positional = positional_order(inner)  # what `forward(*args)` binds, in order
        self._run = _through(owner, inner.name)
        self._saved = saved_tool(inner)  # a closure too: `to_dict` gives inner's code, marked
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args:  # bound as Python binds them to the inner tool's `forward(...)`, or refused
            if len(args) > len(self.positional):
                took = f"{len(self.positional)} positional arguments but {len(args)} were given"
                raise TypeError(f"{self.name}() takes {took}")
            positional = dict(zip(self.positional, args, strict=False))
            for name in positional.keys() & kwargs.keys():
                raise TypeError(f"{self.name}() got multiple values for argument {name!r}")
            kwargs = {**positional, **kwargs}
        return self._run(kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The inner tool's `to_dict()`, marked as gated: what `agent.save` writes (`_saving`)."""
        return self._saved()


def positional_order(inner: Tool) -> tuple[str, ...]:
    """The inputs of `inner` in the order its `forward` takes them positionally: smolagents only
    checks that `forward` names the same inputs, so `inputs` may list them in another order. The
    order of `inputs` when `forward` has no such signature (`*args`, `**kwargs`)."""
    try:
        parameters = inspect.signature(inner.forward).parameters.values()
    except (TypeError, ValueError):
        return tuple(inner.inputs)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in parameters if p.kind in kinds)
    return names if sorted(names) == sorted(inner.inputs) else tuple(inner.inputs)


def _described_as(tool: Tool, inner: Tool) -> None:
    """Give `tool` what the model is shown of `inner`: its name, description, inputs, output type."""
    tool.name = inner.name
    tool.description = inner.description
    tool.inputs = dict(inner.inputs)
    tool.output_type = inner.output_type


def _through(owner: Owner, name: str) -> Callable[[Any], Any]:
    """`owner._call(name, args)` as a closure: reachable from model code only through dunders."""

    def run(args: Any) -> Any:
        return owner._call(name, args)

    return run


class StopGuard(Tool):
    """A CodeAgent's `final_answer`, refused (raising `ApprovalRequired` again) once a gated call
    has stopped the run: the snippet cannot end the run as if nothing waited."""

    skip_forward_signature_validation = True

    def __init__(self, inner: Tool, owner: Owner) -> None:
        _described_as(self, inner)
        _HELD_BY[self] = weakref.ref(owner)
        self._answer = _guarded(owner, inner)  # a closure, like GatedTool's: nothing to reach
        self._saved = unmarked(inner)  # final_answer is saved as it was
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._answer(*args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return self._saved()


def _guarded(owner: Owner, inner: Tool) -> Callable[..., Any]:
    def answer(*args: Any, **kwargs: Any) -> Any:
        owner._check_stopped(answer=True)
        return inner(*args, **kwargs)

    return answer


def is_wrapped(tool: Tool) -> bool:
    """Whether `tool` is one a `GatedAgent` put in place (a `GatedTool` or a `StopGuard`)."""
    return isinstance(tool, GatedTool | StopGuard)


def wrapped_by(tool: Tool, owner: object) -> bool:
    """Whether `tool` is one `owner` put in place. Another GatedAgent's runs its calls with that
    agent's identity (session, user), whichever agent holds it: it is no tool of `owner`'s."""
    held = _HELD_BY.get(tool) if is_wrapped(tool) else None
    return held is not None and held() is owner


# wrapped tool -> the GatedAgent it calls back: kept here, never on the tool (model code reads it)
_HELD_BY: weakref.WeakKeyDictionary[Tool, weakref.ref[Owner]] = weakref.WeakKeyDictionary()


def is_own_final_answer(name: str, tool: Tool) -> bool:
    """Whether `tool` is smolagents' own `final_answer`, the one tool the gate does not wrap: it
    only returns its argument. That is `FinalAnswerTool` exactly (what the agent installs when no
    tool of the user's is named `final_answer`), or that class as `from_folder`, `from_dict` and
    `from_hub` load it back from its saved code: same attributes, same `forward`, nothing added.
    A tool of the user's named `final_answer` (smolagents lets one replace the default) is not:
    it is gated like any other tool, so it needs a row."""
    if name != "final_answer" or any(type(v) not in _PLAIN for v in vars(tool).values()):
        return False  # an instance attribute could stand in for `forward` (or run code as a flag)
    cls = type(tool)
    if cls is FinalAnswerTool:
        return dict(vars(cls)) == _OWN  # nothing patched (`forward`, `__call__`, `setup`) since loaded
    return (
        cls.__bases__ == (Tool,)
        and vars(cls).keys() == vars(FinalAnswerTool).keys()
        and all(getattr(cls, a) == getattr(FinalAnswerTool, a) for a in _DESCRIBED)
        and _same_code(vars(cls)["forward"])
    )


_OWN = dict(vars(FinalAnswerTool))  # the class as smolagents defines it
_OWN_FORWARD = FinalAnswerTool.forward
#: the types of the instance attributes smolagents gives a tool (`is_initialized`: a bool)
_PLAIN = frozenset({bool, int, str, type(None)})


_DESCRIBED = ("name", "description", "inputs", "output_type")
_CODE = ("co_code", "co_consts", "co_names", "co_varnames", "co_argcount", "co_kwonlyargcount")
# what kind of function it is (not its `__future__` flags: `Tool.from_code` compiles with others)
_KIND = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE


def _same_code(fn: object) -> bool:
    """Whether `fn` is a plain function compiled from the code of `FinalAnswerTool.forward`."""
    if not isinstance(fn, types.FunctionType) or fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__:
        return False
    code, own = fn.__code__, _OWN_FORWARD.__code__
    return code.co_flags & _KIND == own.co_flags & _KIND and all(
        getattr(code, a) == getattr(own, a) for a in _CODE
    )


def native_tools(agent: MultiStepAgent) -> list[NativeTool]:
    """The gate's view (`native_tool`) of every tool of `agent` but smolagents' own `final_answer`
    (`is_own_final_answer`): what `GatedAgent(agent, effects=...)` builds its gate from. For gate
    options `GatedAgent` does not take (`policy=`, `keyring=`, ...): `gate_for(native_tools(agent),
    effects, agent_id=..., ...)`, then `GatedAgent(agent, gate, agent_id=...)`. An agent already
    gated is refused (TypeError)."""
    tools: list[NativeTool] = []
    for name, tool in agent.tools.items():
        if is_own_final_answer(name, tool):
            continue
        if is_wrapped(tool):
            raise TypeError(f"tool {name!r} is already gated: this agent was given to a GatedAgent")
        tools.append(native_tool(tool))
    return tools
