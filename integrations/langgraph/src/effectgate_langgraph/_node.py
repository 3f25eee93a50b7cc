"""GatedToolNode: a drop-in for `langgraph.prebuilt.ToolNode` that runs every call through a gate.

Each time the node runs (first pass, or a re-run on resume) it:

1. settles the step's gated calls (`_step.py`): registers them through the core and, while any
   waits for a person, raises one `interrupt()` listing all of them;
2. then lets ToolNode dispatch every call as usual, with a `wrap_tool_call` that answers a
   gated call from step 1 and runs a read or write call through `gate.call`.

Nothing with an effect runs before the step is settled, so reads and writes run once, after the
last answer, and a gated call runs once because the core holds its grant and its result. The
LangChain tools given to the node are what the model is shown; what runs is the effect table's
row, so a tool the node offers must have a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel

from effectgate import CallContext, EffectGate, Outcome
from effectgate.adapter import is_gated
from effectgate.errors import TableError

from ._identity import call_context, messages_of, state_of, step_calls
from ._messages import render, tool_message
from ._step import Settled, StepFlow, adrive, drive, settle_step
from ._tools import table_tools

DEFAULT_RESUME_IDENTITY = "langgraph-resume"


@dataclass(frozen=True)
class _Step:
    gate: EffectGate
    ctx: CallContext
    settled: dict[str, Settled]


# The settled step, for the wrappers ToolNode calls on its worker threads (it copies the context).
_STEP: ContextVar[_Step | None] = ContextVar("effectgate_langgraph_step", default=None)


def _current(request: ToolCallRequest) -> tuple[_Step, CallContext]:
    step = _STEP.get()
    if step is None:
        raise RuntimeError("the effectgate tool wrapper runs only inside a GatedToolNode")
    return step, dataclasses.replace(step.ctx, tool_call_id=request.tool_call.get("id"))


class GatedToolNode(ToolNode):
    """A ToolNode whose calls go through an EffectGate. Use it where you would use ToolNode:
    `builder.add_node("tools", GatedToolNode(gate))` with `tools_condition`.

    The graph needs a checkpointer (gated calls pause with `interrupt()`), a `thread_id`, and the
    caller's `user_id` in the runtime context or `config["configurable"]`. See
    `effectgate_langgraph` for the interrupt payload and the resume value. For langchain tools you
    already have, `gated_node(tools, effects)` builds the gate and the node in one call.
    """

    def __init__(
        self,
        gate: EffectGate,
        tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
        *,
        agent_id: str | None = None,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: Any = None,
        messages_key: str = "messages",
        resume_identity: str = DEFAULT_RESUME_IDENTITY,
    ) -> None:
        offered = list(tools) if tools is not None else table_tools(gate.table, agent_id=agent_id)
        options: dict[str, Any] = {}
        if handle_tool_errors is not None:
            options["handle_tool_errors"] = handle_tool_errors
        super().__init__(
            offered,
            name=name,
            tags=tags,
            messages_key=messages_key,
            wrap_tool_call=self._wrap,
            awrap_tool_call=self._awrap,
            **options,
        )
        for tool_name in self.tools_by_name:
            if tool_name not in gate.table:
                raise TableError(tool_name, "tools", "the node offers a tool the effect table has no row for")
        self.gate = gate
        self.agent_id = agent_id
        self.resume_identity = resume_identity

    # -- the step

    def _flow(
        self, node_input: Any, config: RunnableConfig, runtime: Runtime[Any]
    ) -> tuple[CallContext, StepFlow | None]:
        """The step's context, and the flow settling its gated calls (None when it has none)."""
        messages: Sequence[AnyMessage] = messages_of(state_of(node_input), self._messages_key)
        own_calls, _ = self._parse_input(node_input)
        ctx = call_context(messages, config, runtime.context, agent_id=self.agent_id)
        step = step_calls(messages)
        own = frozenset(str(c.get("id") or "") for c in own_calls)
        if not own <= {str(c.get("id") or "") for c in step}:
            step = own_calls
        if not any(is_gated(self.gate, c["name"]) for c in own_calls):
            return ctx, None
        flow = settle_step(
            self.gate,
            step,
            ctx,
            own=own if len(own) < len(step) else None,
            resume_identity=self.resume_identity,
        )
        return ctx, flow

    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        ctx, flow = self._flow(input, config, runtime)
        token = _STEP.set(_Step(self.gate, ctx, drive(flow, self.gate) if flow is not None else {}))
        try:
            return super()._func(input, config, runtime)
        finally:
            _STEP.reset(token)

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        ctx, flow = self._flow(input, config, runtime)
        token = _STEP.set(_Step(self.gate, ctx, await adrive(flow, self.gate) if flow is not None else {}))
        try:
            return await super()._afunc(input, config, runtime)
        finally:
            _STEP.reset(token)

    # -- one call (on ToolNode's worker thread or task)

    @staticmethod
    def _wrap(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        step, ctx = _current(request)
        settled = step.settled.get(str(request.tool_call.get("id") or ""))
        if settled is not None:
            return render(settled.outcome, request.tool_call, settled.edited_args)
        call = request.tool_call
        outcome: Outcome = step.gate.call(call["name"], call["args"], ctx)
        return tool_message(outcome, call)

    @staticmethod
    async def _awrap(
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        step, ctx = _current(request)
        settled = step.settled.get(str(request.tool_call.get("id") or ""))
        if settled is not None:
            return render(settled.outcome, request.tool_call, settled.edited_args)
        call = request.tool_call
        outcome: Outcome = await step.gate.acall(call["name"], call["args"], ctx)
        return tool_message(outcome, call)


def gated_tool_node(
    gate: EffectGate,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    **options: Any,
) -> GatedToolNode:
    """`GatedToolNode(gate, tools, **options)`: the node to put where a ToolNode would go."""
    return GatedToolNode(gate, tools, **options)
