"""GatedToolNode: a drop-in for `langgraph.prebuilt.ToolNode` that runs every call through a gate.

Each time the node runs (first pass, or a re-run on resume) it:

1. settles the step's gated calls (`_step.py`): registers them through the core and, while any
   waits for a person, raises one `interrupt()` listing all of them;
2. then lets ToolNode dispatch every call as usual, with a `wrap_tool_call` that answers a gated call
   from step 1 and runs a read or write call through `gate.call`. Wrappers given as `wrap_tool_call=`
   / `awrap_tool_call=` run outside it, as ToolNode runs them: their `execute` is the gate, where an
   approved call's grant is spent (`_grants.py`); one the dispatch left unspent as it raised (a
   wrapper's own `interrupt()`), if a HITL approve's, is given back for the next run (`_regrant`).

What the model receives is what a plain ToolNode would give it (`_fidelity.py`): a native tool runs
through `tool.invoke(tool_call, config)` with its callbacks, its own error handling and its ToolMessage;
`handle_tool_errors` is applied as ToolNode applies it, to the tool's own exception. Injected arguments
are dropped from each call before the gate sees it and supplied by ToolNode's `_inject_tool_args` when
the tool runs, from the ToolRuntime ToolNode built for the call (for a gated call run while the step is
settled, one built the same way from this run's input). A read's `Command` goes to the graph. A gated
call's refusal or denial is the gate's answer (an error ToolMessage), not an exception, and an approved
call whose outcome is unknown is reported for reconciliation, whatever the flag.

Nothing with an effect runs before the step is settled, so reads and writes run once, after the last
answer, and a gated call runs once because the core holds its grant and its result. The LangChain tools
given to the node are what the model is shown; what runs is the table's row, so each needs a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, cast

from langchain_core.callbacks import CallbackManagerForToolRun
from langchain_core.messages import AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallRequest,
    ToolCallWrapper,
    ToolRuntime,
    _default_handle_tool_errors,
)
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel

from effectgate import CallContext, Effect, EffectGate, Executed, Outcome, flow
from effectgate.adapter import is_gated, native_approver
from effectgate.errors import TableError

from . import _fidelity
from ._fidelity import Flight, error_message, flying, framework_keys, model_call
from ._grants import Granted, Settled, settled_for, spent, unsettled
from ._hitl import NativeApprover
from ._identity import call_context, call_id, messages_of, reused_id_refusal, reused_ids, state_of, step_calls
from ._messages import tool_message
from ._regrant import agiven_back, given_back
from ._spans import answered, ran_now, row_span, settled_answer
from ._step import StepFlow, adrive, drive, settle_step
from ._tools import may_call, table_tools

DEFAULT_RESUME_IDENTITY = "langgraph-resume"
#: Fields a newer ToolRuntime has, passed when this one has them too.
_NEWER = {f.name for f in dataclasses.fields(ToolRuntime)} & {"execution_info", "server_info"}


@dataclass(frozen=True)
class _Step:
    gate: EffectGate
    ctx: CallContext
    settled: dict[str, Settled]  # with a wrapper, a grant is spent when its `execute` runs (`_grants`)
    ran: dict[str, ToolMessage]  # the ToolMessages of gated calls that ran in this step, by call id
    input_type: Literal["list", "dict", "tool_calls"]  # ToolNode's reading of the node's input
    reused: frozenset[str] = frozenset()  # ids on more than one call of the step (`reused_ids`)


# The settled step, for the wrappers ToolNode calls on its worker threads (it copies the context).
_STEP: ContextVar[_Step | None] = ContextVar("effectgate_langgraph_step", default=None)


def _propagate(e: Exception) -> str:
    """ToolNode's own flag: the gate's wrapper applied `handle_tool_errors`; the rest is raised."""
    raise e


def _current(request: ToolCallRequest) -> tuple[_Step, CallContext]:
    if (step := _STEP.get()) is None:
        raise RuntimeError("the effectgate tool wrapper runs only inside a GatedToolNode")
    return step, dataclasses.replace(step.ctx, tool_call_id=request.tool_call.get("id"))


class GatedToolNode(ToolNode):
    """A ToolNode whose calls go through an EffectGate. Use it where you would use ToolNode:
    `builder.add_node("tools", GatedToolNode(gate))` with `tools_condition`.

    The graph needs a checkpointer (gated calls pause with `interrupt()`), a `thread_id`, and the
    caller's `user_id` in the runtime context or `config["configurable"]`. See
    `effectgate_langgraph` for the interrupt payload and the resume value. For langchain tools you
    already have, `gated_node(tools, effects)` builds the gate and the node in one call.

    `handle_tool_errors`, `wrap_tool_call` and `awrap_tool_call` mean what they mean for ToolNode
    (see the module docstring for how they meet the gate); `None` is ToolNode's default.
    `native_approver` decides a langchain HITL answer (`_hitl.py`): an `Approver`, or a function
    of the invoke's `(config, context)` returning one or None."""

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
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
        resume_identity: str = DEFAULT_RESUME_IDENTITY,
        native_approver: NativeApprover | None = None,
    ) -> None:
        offered = list(tools) if tools is not None else table_tools(gate.table, agent_id=agent_id)
        super().__init__(
            offered,
            name=name,
            tags=tags,
            messages_key=messages_key,
            wrap_tool_call=self._outer_wrap,
            awrap_tool_call=self._outer_awrap,
            handle_tool_errors=_propagate,
        )
        #: ToolNode's `handle_tool_errors`, applied by the gate's wrapper (see `error_message`).
        self.handle_tool_errors: Any = (
            _default_handle_tool_errors if handle_tool_errors is None else handle_tool_errors
        )
        self.wrap_tool_call = wrap_tool_call
        self.awrap_tool_call = awrap_tool_call
        for tool_name in self.tools_by_name:
            if tool_name not in gate.table:
                raise TableError(tool_name, "tools", "the node offers a tool the effect table has no row for")
        self.gate = gate
        self.agent_id = agent_id
        self.resume_identity = resume_identity
        self.native_approver = native_approver
        #: The arguments the framework supplies, by tool name: dropped from every call the gate sees.
        self.injected_keys = framework_keys(gate, self.tools_by_name.values())

    def _model_call(self, call: ToolCall) -> ToolCall:
        return model_call(call, self.injected_keys.get(call["name"]))

    # -- the step

    def _flow(
        self, node_input: Any, config: RunnableConfig, runtime: Runtime[Any]
    ) -> tuple[CallContext, StepFlow | None, frozenset[str]]:
        """The step's context, the flow settling its gated calls (None when it has none), and the
        ids the model wrote on more than one call of the step (refused, `reused_ids`)."""
        messages: Sequence[AnyMessage] = messages_of(state_of(node_input), self._messages_key)
        own_calls = self._own_calls(node_input)
        ctx = call_context(messages, config, runtime.context, agent_id=self.agent_id)
        step = [self._model_call(c) for c in step_calls(messages)]
        own, pairs = frozenset(map(call_id, own_calls)), {(call_id(c), c["name"]) for c in step}
        if not {(call_id(c), c["name"]) for c in own_calls} <= pairs:
            step = own_calls  # a call its `Send` made or renamed: settled alone, as the middleware does
        elif len({i for i, _ in pairs}) == len(step):  # as the task was sent them (a router may cap one)
            sent = {call_id(c): c for c in own_calls}
            step = [sent.get(call_id(c), c) for c in step]
        reused = reused_ids(self.gate, step) | reused_ids(self.gate, own_calls)
        step = [c for c in step if c["name"] in self.tools_by_name]  # the rest: `_ready` refuses
        own &= {str(c.get("id") or "") for c in step}
        if not any(is_gated(self.gate, c["name"]) for c in step if str(c.get("id") or "") in own):
            return ctx, None, reused
        steps = settle_step(
            self.gate,
            step,
            ctx,
            own=own if len(own) < len(step) else None,
            resume_identity=self.resume_identity,
            injected_keys=self.injected_keys,
            approver_of=lambda: native_approver(self.native_approver, config, runtime.context),
            defer=self.wrap_tool_call is not None or self.awrap_tool_call is not None,
        )
        return ctx, steps, reused

    def _gated_flight(
        self, node_input: Any, config: RunnableConfig, runtime: Runtime[Any], steps: StepFlow | None
    ) -> AbstractContextManager[Flight]:
        """The flight of the step's gated calls, each with the ToolRuntime `ToolNode._func` builds
        for it in this run: they run (on a resume, in whatever process) with this run's state."""
        if steps is None:
            return flying([], config)
        all_calls, _ = self._parse_input(node_input)
        gated = {str(c.get("id") or "") for c in all_calls if is_gated(self.gate, c["name"])}
        newer = {k: getattr(runtime, k, None) for k in _NEWER}
        runtimes: dict[str, ToolRuntime[Any, Any]] = {}
        for call, cfg in zip(all_calls, get_config_list(config, len(all_calls)), strict=False):
            if (cid := str(call.get("id") or "")) in gated:
                runtimes[cid] = ToolRuntime(
                    state=self._extract_state(node_input, cfg),
                    tool_call_id=call["id"],
                    config=cfg,
                    context=runtime.context,
                    store=runtime.store,
                    stream_writer=runtime.stream_writer,
                    tools=list(self.tools_by_name.values()),
                    **newer,
                )
        calls = [c for c in self._own_calls(node_input) if str(c.get("id") or "") in gated]
        return flying(calls, config, runtimes=runtimes, inject=self._inject_tool_args)

    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        ctx, steps, reused = self._flow(input, config, runtime)
        with self._gated_flight(input, config, runtime, steps) as flight:
            settled = drive(steps, self.gate) if steps is not None else {}
        step = _Step(self.gate, ctx, settled, flight.messages, self._parse_input(input)[1], reused)
        token = _STEP.set(step)
        try:
            with given_back(self.gate, ctx, settled):
                return super()._func(input, config, runtime)
        finally:
            _STEP.reset(token)

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        ctx, steps, reused = self._flow(input, config, runtime)
        with self._gated_flight(input, config, runtime, steps) as flight:
            settled = await adrive(steps, self.gate) if steps is not None else {}
        step = _Step(self.gate, ctx, settled, flight.messages, self._parse_input(input)[1], reused)
        token = _STEP.set(step)
        try:
            async with agiven_back(self.gate, ctx, settled):
                return await super()._afunc(input, config, runtime)
        finally:
            _STEP.reset(token)

    def _own_calls(self, node_input: Any) -> list[ToolCall]:
        """This run's calls as the gate sees them (without injected keys)."""
        return [self._model_call(c) for c in self._parse_input(node_input)[0]]

    # -- one call (on ToolNode's worker thread or task)

    def _outer_wrap(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        """The caller's `wrap_tool_call` around the gate, as ToolNode runs it around the tool."""
        if self.wrap_tool_call is None:
            return self._wrap(request)
        try:
            return self.wrap_tool_call(request, self._wrap)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return _fidelity.wrapper_failed(exc, request.tool_call, self.handle_tool_errors)

    async def _outer_awrap(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        if self.awrap_tool_call is None and self.wrap_tool_call is None:
            return await self._awrap(request)
        try:
            if self.awrap_tool_call is not None:
                return await self.awrap_tool_call(request, self._awrap)
            assert self.wrap_tool_call is not None  # ToolNode's fallback: the sync wrapper
            return self.wrap_tool_call(request, self._wrap)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return _fidelity.wrapper_failed(exc, request.tool_call, self.handle_tool_errors)

    def _ready(
        self, step: _Step, call: ToolCall, config: RunnableConfig
    ) -> ToolMessage | Command[Any] | None:
        """The answer to a call its step settled, or refuses (its id reused); None: run it now."""
        call_id = str(call.get("id") or "")
        if call_id in step.reused:
            return tool_message(reused_id_refusal(call), call)
        if call["name"] not in self.tools_by_name and may_call(step.gate, step.ctx, call["name"]):
            return self._validate_tool_call(call)  # ToolNode's answer to a row it does not offer
        if (settled := settled_for(step.settled, call)) is None:
            return unsettled(step.gate, step.ctx, call)  # None: a read or write, run it now
        if isinstance(settled.outcome, Granted):
            return None  # a grant is spent now, where its call runs (`_grants.spent`)
        span = row_span(step.gate, self.tools_by_name, call, config) if ran_now(settled) else None
        ran, tools = step.ran.get(call_id), self.tools_by_name
        return settled_answer(settled, call, ran, self.handle_tool_errors, config, tools, span)

    def _wrap(self, request: ToolCallRequest) -> ToolMessage | Command[Any]:
        step, ctx = _current(request)
        call = self._model_call(request.tool_call)
        if (ready := self._ready(step, call, request.runtime.config)) is not None:
            return ready
        if (settled := settled_for(step.settled, call)) is not None:  # its grant, spent here
            span = row_span(step.gate, self.tools_by_name, call, request.runtime.config)
            with self._flight(step.gate, call, request) as flight:
                return self._granted(flow.drive(spent(step.gate, ctx, settled)), call, flight, span)
        span = row_span(step.gate, self.tools_by_name, call, request.runtime.config)
        with self._flight(step.gate, call, request) as flight:
            try:
                outcome: Outcome = step.gate.call(call["name"], call["args"], ctx)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                return self._failed(exc, call, span)
        return self._answer(step, call, outcome, flight, span)

    async def _awrap(self, request: ToolCallRequest) -> ToolMessage | Command[Any]:
        step, ctx = _current(request)
        call = self._model_call(request.tool_call)
        if (ready := self._ready(step, call, request.runtime.config)) is not None:
            return ready
        if (settled := settled_for(step.settled, call)) is not None:  # its grant, spent here
            span = row_span(step.gate, self.tools_by_name, call, request.runtime.config)
            with self._flight(step.gate, call, request) as flight:
                return self._granted(await flow.adrive(spent(step.gate, ctx, settled)), call, flight, span)
        span = row_span(step.gate, self.tools_by_name, call, request.runtime.config)
        with self._flight(step.gate, call, request) as flight:
            try:
                outcome: Outcome = await step.gate.acall(call["name"], call["args"], ctx)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                return self._failed(exc, call, span)
        return self._answer(step, call, outcome, flight, span)

    def _granted(
        self, settled: Settled, call: ToolCall, flight: Flight, span: CallbackManagerForToolRun | None
    ) -> ToolMessage | Command[Any]:
        ran, tools = flight.messages.get(str(call.get("id") or "")), self.tools_by_name
        return settled_answer(settled, call, ran, self.handle_tool_errors, flight.config, tools, span)

    def _flight(
        self, gate: EffectGate, call: ToolCall, request: ToolCallRequest
    ) -> AbstractContextManager[Flight]:
        """A read or write runs with the ToolRuntime ToolNode built for it; a read's Command
        goes to the graph."""
        spec = gate.table.get(call["name"])
        return flying(
            [call],
            request.runtime.config,
            runtimes={str(call.get("id") or ""): request.runtime},
            inject=self._inject_tool_args,
            graph_updates=spec is not None and spec.effect is Effect.READ,
        )

    def _answer(
        self,
        step: _Step,
        call: ToolCall,
        outcome: Outcome,
        flight: Flight,
        span: CallbackManagerForToolRun | None,
    ) -> ToolMessage | Command[Any]:
        call_id = str(call.get("id") or "")
        update = flight.updates.get(call_id)
        if update is not None and isinstance(outcome, Executed):
            try:  # ToolNode's checks of a tool's Command (a matching ToolMessage, the update's shape)
                out: Any = self._normalize_tool_response(update, call, step.input_type)
            except Exception as exc:
                return self._failed(exc, call, span)
            return cast("ToolMessage | Command[Any]", out)
        answer = tool_message(outcome, call, ran=flight.messages.get(call_id))
        return answered(answer, outcome, call, flight.config, self.tools_by_name, span)

    def _failed(self, exc: Exception, call: ToolCall, span: CallbackManagerForToolRun | None) -> ToolMessage:
        if span is not None:
            span.on_tool_error(exc, tool_call_id=call.get("id"))
        return error_message(exc, call, self.handle_tool_errors)


def gated_tool_node(
    gate: EffectGate,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    **options: Any,
) -> GatedToolNode:
    """`GatedToolNode(gate, tools, **options)`: the node to put where a ToolNode would go."""
    return GatedToolNode(gate, tools, **options)
