"""The swap: every FunctionTool the vendored tests build runs through `effectgate_openai_agents.gate_tools`.

`FunctionTool.__post_init__` is wrapped (only while this suite collects or runs a test), so a tool
built by `@function_tool`, `FunctionTool(...)`, `dataclasses.replace` or `copy.copy` keeps its
name, schema and attributes and has three of them replaced by delegates to its gated copy:

- `on_invoke_tool` -> the gated tool's `on_invoke_tool` (every call through the core);
- `is_enabled` -> the gated tool's (it settles the SDK's native decisions, then asks the tool's own);
- `needs_approval` -> the gated tool's when the tool asks for approval itself; a tool that does not
  keeps `False`, which is exactly what the gate answers for a read row.

The gated copy is `gate_tools([tool as built], gate, agent_id=AGENT, native_approver=APPROVER)`
over a one-row table: `read()` for a tool without `needs_approval`, and for a tool with one (a read
row refuses that by design) the gated row `send(ROLE)`, whose pauses the SDK's own
`state.approve` / `state.reject` settle through the gate as `APPROVER`. It is built on first use in
each test, on that test's SQLite store, and cached per tool object.

Identity: a new run (`Runner.run*`), or a direct `on_invoke_tool` / `is_enabled` /
`needs_approval` call, whose context is `None` gets a dict with `session_id`, `origin_message_id`
(fresh per run, as a new user message) and `user_id`; a dict context lacking them gets them
added. Any other context object is left alone (effectgate refuses it: `MissingIdentity`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import inspect
import itertools
from collections.abc import Iterator, MutableMapping
from typing import Any

from agents import FunctionTool
from agents.run import AgentRunner
from agents.run_state import RunState

from effectgate import Approver, EffectGate, read, send
from effectgate.rows import table_for
from effectgate.stores import SQLStore
from effectgate_openai_agents import gate_tools, native_tool

AGENT = "framework-suite"
ROLE = "suite-approver"
APPROVER = Approver("suite-reviewer", ROLE)
USER = "suite-user"
SESSION = "suite-session"

_ids = itertools.count(1)
#: while True, new FunctionTools are swapped (this suite's collection and its tests only)
SWAPPING: contextvars.ContextVar[bool] = contextvars.ContextVar("suite_swapping", default=False)
_RAW: contextvars.ContextVar[bool] = contextvars.ContextVar("suite_raw", default=False)


def identity() -> dict[str, str]:
    return {"session_id": SESSION, "origin_message_id": f"suite-message-{next(_ids)}", "user_id": USER}


def supply_identity(context: Any) -> Any:
    """The context a run gets: a fresh identity for None, the identity added to a dict."""
    if context is None:
        return identity()
    if isinstance(context, MutableMapping):
        for key, value in identity().items():
            context.setdefault(key, value)
    return context


def with_identity(wrapper: Any) -> None:
    """A run context wrapper (or ToolContext) without an identity gets one."""
    if wrapper is not None and hasattr(wrapper, "context"):
        wrapper.context = supply_identity(wrapper.context)


class Gates:
    """One test's gates: one per tool object, on the test's store."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.gates: list[EffectGate] = []
        self.by_tool: dict[int, tuple[FunctionTool, FunctionTool]] = {}
        self.reached = False

    def gated(self, tool: FunctionTool) -> FunctionTool:
        self.reached = True
        hit = self.by_tool.get(id(tool))
        if hit is not None and hit[0] is tool:
            return hit[1]
        with raw():
            plain = copy.copy(tool)
            invoker = tool.on_invoke_tool
            inner = invoker.inner if isinstance(invoker, GatedInvoker) else invoker
            bind = getattr(inner, "__agents_bind_function_tool__", None)
            plain.on_invoke_tool = bind(plain) if callable(bind) else inner
            plain.needs_approval = own(tool.needs_approval)
            plain.is_enabled = own(tool.is_enabled)
            row = read() if plain.needs_approval is False else send(ROLE)
            table = table_for([native_tool(plain)], {plain.name: row}, agent_id=AGENT)
            gate = EffectGate(table, self.store)
            self.gates.append(gate)
            [gated] = gate_tools([plain], gate, agent_id=AGENT, native_approver=APPROVER)
        self.by_tool[id(tool)] = (tool, gated)
        return gated

    def close(self) -> None:
        for gate in self.gates:
            gate.close()


CURRENT: contextvars.ContextVar[Gates | None] = contextvars.ContextVar("suite_gates", default=None)
_ACTIVE: list[Gates] = []  # the running test's gates (worker threads do not inherit contextvars)


def current() -> Gates:
    gates = CURRENT.get() or (_ACTIVE[-1] if _ACTIVE else None)
    if gates is None:
        raise RuntimeError("a swapped FunctionTool was used outside a framework-suite test")
    return gates


@contextlib.contextmanager
def raw() -> Iterator[None]:
    token = _RAW.set(True)
    try:
        yield
    finally:
        _RAW.reset(token)


def own(value: Any) -> Any:
    """The tool's own value behind a delegate (or the value itself)."""
    return value.own if isinstance(value, (GatedNeeds, GatedEnabled)) else value


class GatedInvoker:
    """`on_invoke_tool` of a swapped tool: the call goes to its gated copy."""

    def __init__(self, owner: FunctionTool, inner: Any) -> None:
        self.owner = owner
        self.inner = inner

    async def __call__(self, ctx: Any, arguments: str) -> Any:
        with_identity(ctx)
        return await current().gated(self.owner).on_invoke_tool(ctx, arguments)


class GatedNeeds:
    """`needs_approval` of a swapped tool that asks for approval: the gated copy decides."""

    def __init__(self, owner: FunctionTool, own: Any) -> None:
        self.owner = owner
        self.own = own

    async def __call__(self, ctx: Any, params: Any, call_id: str) -> bool:
        with_identity(ctx)
        needs = current().gated(self.owner).needs_approval
        if isinstance(needs, bool):
            return needs
        return bool(await needs(ctx, params, call_id))


class GatedEnabled:
    """`is_enabled` of a swapped tool: the gated copy's (native decisions settled, then its own)."""

    def __init__(self, owner: FunctionTool, own: Any) -> None:
        self.owner = owner
        self.own = own

    async def __call__(self, ctx: Any, agent: Any) -> bool:
        with_identity(ctx)
        enabled = current().gated(self.owner).is_enabled
        if isinstance(enabled, bool):
            return enabled
        answer = enabled(ctx, agent)
        return bool(await answer if hasattr(answer, "__await__") else answer)


_post_init = FunctionTool.__post_init__
_copy = FunctionTool.__copy__
_COPYING: contextvars.ContextVar[bool] = contextvars.ContextVar("suite_copying", default=False)


def _swapped_copy(self: FunctionTool) -> FunctionTool:
    token = _COPYING.set(True)
    try:
        return _copy(self)
    finally:
        _COPYING.reset(token)


def _swapped_post_init(self: FunctionTool) -> None:
    _post_init(self)
    if _RAW.get() or not (SWAPPING.get() or _ACTIVE):
        return
    invoker = self.on_invoke_tool
    inner = invoker.inner if isinstance(invoker, GatedInvoker) else invoker
    if isinstance(invoker, GatedInvoker):
        bind = getattr(inner, "__agents_bind_function_tool__", None)
        if callable(bind):
            inner = bind(self)
        elif _COPYING.get() and inspect.ismethod(inner) and inner.__self__ is invoker.owner:
            inner = inner.__func__.__get__(self, type(self))  # as FunctionTool.__copy__ rebinds
    self.on_invoke_tool = GatedInvoker(self, inner)
    needs = own(self.needs_approval)
    self.needs_approval = needs if needs is False else GatedNeeds(self, needs)
    self.is_enabled = GatedEnabled(self, own(self.is_enabled))


_run = AgentRunner.run
_run_sync = AgentRunner.run_sync
_run_streamed = AgentRunner.run_streamed


def _with_identity(input: Any, kwargs: dict[str, Any]) -> None:
    if isinstance(input, RunState):
        wrapper = getattr(input, "_context", None)
        if wrapper is not None:
            wrapper.context = supply_identity(wrapper.context)
        if kwargs.get("context") is not None:
            supply_identity(kwargs["context"])
        return
    kwargs["context"] = supply_identity(kwargs.get("context"))


async def _swapped_run(self: AgentRunner, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
    if _ACTIVE:
        _with_identity(input, kwargs)
    return await _run(self, starting_agent, input, **kwargs)


def _swapped_run_sync(self: AgentRunner, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
    if _ACTIVE:
        _with_identity(input, kwargs)
    return _run_sync(self, starting_agent, input, **kwargs)


def _swapped_run_streamed(self: AgentRunner, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
    if _ACTIVE:
        _with_identity(input, kwargs)
    return _run_streamed(self, starting_agent, input, **kwargs)


def install() -> None:
    """Wrap the SDK entry points once; they swap only while SWAPPING or a suite test is active."""
    FunctionTool.__post_init__ = _swapped_post_init  # type: ignore[method-assign]
    FunctionTool.__copy__ = _swapped_copy  # type: ignore[method-assign]
    AgentRunner.run = _swapped_run  # type: ignore[method-assign]
    AgentRunner.run_sync = _swapped_run_sync  # type: ignore[method-assign]
    AgentRunner.run_streamed = _swapped_run_streamed  # type: ignore[method-assign]


@contextlib.contextmanager
def active(gates: Gates) -> Iterator[None]:
    token = CURRENT.set(gates)
    _ACTIVE.append(gates)
    try:
        yield
    finally:
        _ACTIVE.remove(gates)
        CURRENT.reset(token)
        gates.close()
