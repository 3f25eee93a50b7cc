"""The swap: every agent the vendored smolagents tests build runs through a `GatedAgent`.

When a `ToolCallingAgent`, `CodeAgent` or other `MultiStepAgent` has been constructed (the
outermost of the three `__init__`s returns), it is given to
`GatedAgent(agent, gate, agent_id=AGENT)` over a table with a `read()` row per tool (every tool
but smolagents' own `final_answer`, which the adapter leaves as it is; a test's custom
`final_answer` gets a row too), on the test's SQLite store. Its tools
become `GatedTool`s, in place, as a user's would.

A tool step driven directly (`agent.execute_tool_call`, `process_tool_calls`, `step`) outside any
run gets an identity of its own (the adapter's `_context` falls back to it).

`agent.run(task, ...)` then goes to `GatedAgent.run(task, session_id=..., origin_message_id=...,
user_id=..., return_full_result=...)` with a fresh message id per run, and answers with what
smolagents' own `run` answers: `Finished.run_result` when the run or the agent asked for the full
result, else `Finished.output`. `GatedAgent.run` has no `stream`, `images` or `additional_args`:
a run that passes one drives smolagents' own run with the gated identity set (every tool call
still goes through the gate), and the test is recorded in `OUTSIDE_RUN`, which the suite reports.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections.abc import Callable, Iterator
from typing import Any

from smolagents import CodeAgent, ToolCallingAgent
from smolagents.agents import MultiStepAgent

from effectgate import CallContext, EffectGate, read
from effectgate.rows import spec_of
from effectgate.stores import SQLStore
from effectgate.table import EffectTable
from effectgate_smolagents import Finished, GatedAgent, native_tools

AGENT = "framework-suite"
SESSION = "suite-session"
USER = "suite-user"

_ids = itertools.count(1)
_ACTIVE: list[Gates] = []
OUTSIDE_RUN: set[str] = set()


class Gates:
    """One test's gated agents, on the test's store."""

    def __init__(self, store: SQLStore, nodeid: str) -> None:
        self.store = store
        self.nodeid = nodeid
        self.gates: list[EffectGate] = []
        self.reached = False

    def wrap(self, agent: MultiStepAgent) -> None:
        plain_run = agent.run  # smolagents' own (bound) run
        tools = native_tools(agent)
        # one gate per test, its table grown by each agent's tools: a manager and the agents it
        # manages must be gated on one gate (the adapter refuses a managed agent on another)
        if not self.gates:
            self.gates.append(EffectGate(EffectTable([]), self.store))
        gate = self.gates[0]
        for t in tools:
            if gate.table.get(t.name) is None:
                gate.table.register(spec_of(t, read()))
        gate.table.allow_all(AGENT)
        gated = GatedAgent(agent, gate, agent_id=AGENT)
        # a tool step driven directly (agent.execute_tool_call, process_tool_calls, step) outside
        # any run gets an identity too, as a run without one would be given
        outside = CallContext(agent_id=AGENT, run_id="", **_identity())
        gated._context = lambda: gated._current or outside  # type: ignore[method-assign]
        agent.run = types.MethodType(_run_through(self, gated, plain_run), agent)  # type: ignore[method-assign]

    def close(self) -> None:
        for gate in self.gates:
            gate.close()


def _identity() -> dict[str, str]:
    return {"session_id": SESSION, "origin_message_id": f"suite-message-{next(_ids)}", "user_id": USER}


def _run_through(gates: Gates, gated: GatedAgent, plain_run: Callable[..., Any]) -> Callable[..., Any]:
    def run(
        self_: MultiStepAgent,
        task: str,
        stream: bool = False,
        reset: bool = True,
        images: Any = None,
        additional_args: Any = None,
        max_steps: int | None = None,
        return_full_result: bool | None = None,
    ) -> Any:
        gates.reached = True
        if not stream and images is None and additional_args is None:
            out = gated.run(
                task, reset=reset, max_steps=max_steps, return_full_result=return_full_result, **_identity()
            )
            if isinstance(out, Finished):
                return out.output if out.run_result is None else out.run_result
            return out
        OUTSIDE_RUN.add(gates.nodeid)
        ctx = CallContext(agent_id=AGENT, run_id="", **_identity())
        options = {
            "stream": stream,
            "reset": reset,
            "images": images,
            "additional_args": additional_args,
            "max_steps": max_steps,
            "return_full_result": return_full_result,
        }
        if stream:
            return _streamed(gated, ctx, plain_run(task, **options))
        with _identity_set(gated, ctx):
            return plain_run(task, **options)

    return run


@contextlib.contextmanager
def _identity_set(gated: GatedAgent, ctx: CallContext) -> Iterator[None]:
    gated._current = ctx
    try:
        yield
    finally:
        gated._current = None


def _streamed(gated: GatedAgent, ctx: CallContext, events: Iterator[Any]) -> Iterator[Any]:
    with _identity_set(gated, ctx):
        yield from events


_inits = {cls: cls.__init__ for cls in (MultiStepAgent, ToolCallingAgent, CodeAgent)}
_depth: dict[int, int] = {}


def _swapped(cls: type) -> Callable[..., None]:
    original = _inits[cls]

    def __init__(self: MultiStepAgent, *args: Any, **kwargs: Any) -> None:
        key = id(self)
        _depth[key] = _depth.get(key, 0) + 1
        try:
            original(self, *args, **kwargs)
        finally:
            _depth[key] -= 1
            outermost = _depth[key] == 0
            if outermost:
                del _depth[key]
        if outermost and _ACTIVE:
            _ACTIVE[-1].wrap(self)

    return __init__


def install() -> None:
    """Wrap the three `__init__`s once; they gate only while a suite test is active."""
    for cls in _inits:
        cls.__init__ = _swapped(cls)  # type: ignore[method-assign]


@contextlib.contextmanager
def active(gates: Gates) -> Iterator[None]:
    _ACTIVE.append(gates)
    try:
        yield
    finally:
        _ACTIVE.remove(gates)
        gates.close()
