"""EffectGateMiddleware: the gate for langchain's `create_agent`, where HITL middleware would go.

    agent = create_agent(model, middleware=[EffectGateMiddleware(gate, agent_id="support")],
                         checkpointer=InMemorySaver())

It gates in `wrap_tool_call`, the execution boundary, so no `after_model` hook or jump can route
a call around it. `create_agent` runs each tool call of a model step as its own task, so:

- a read or write call runs at once through `gate.call`, without waiting for approvals;
- a gated call registers itself through `gate.call_step`, as an outer middleware changed it
  (the reviewer sees, and the gate runs, what the middleware passed on), with its step's other
  calls of the same tool (the parallel-calls rule: none of them is registered), and pauses its
  own task with an interrupt listing its own call, in the same payload shape as the node's.
  Several gated calls of one step therefore surface as several interrupts at once.

Resume with a mapping from approval id to decision: `resume(decisions, out.interrupts)` sends
each interrupt the decisions for the approvals it lists; `Command(resume=decisions)` works too.
HumanInTheLoopMiddleware's answer, `{"decisions": [...]}` (one decision per interrupt here, each
interrupt listing its own call), is bridged as for the node (`_hitl.py`): a reject closes the
approval, an approve goes through `gate.approve` as the configured `native_approver`.
The middleware answers every call itself: the tool functions (and any middleware listed after
it) are never invoked, because what runs is the effect table's row. A langchain tool given to
`gated_middleware` runs as create_agent's ToolNode would run it: injected keys are dropped from
the call before the gate sees it, and the trusted values are added from the call's
`request.runtime` (ToolNode's `_inject_tool_args`) when it runs, including a gated call that
runs on resume. A read's `Command` goes to the graph, checked as ToolNode checks it. A read's or
write's arguments the gate finds invalid are answered with the `ToolInvocationError` text
create_agent's ToolNode gives for them (`_fidelity.invocation_error`), after the tool's
`on_tool_start` and `on_tool_error` (`_spans.answered`), as there; nothing runs either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE, ToolCallRequest
from langgraph.types import Command

from effectgate import CallContext, Effect, EffectGate, Executed, Invalid, Outcome
from effectgate.adapter import is_gated, native_approver

from ._arguments import InvalidToolArguments
from ._fidelity import (
    Flight,
    ToolReportedError,
    flying,
    framework_keys,
    invocation_error,
    model_call,
    raise_injection_error,
)
from ._grants import Settled
from ._hitl import NativeApprover
from ._identity import call_context, messages_of, reused_id_refusal, reused_ids, step_calls
from ._messages import tool_message
from ._node import DEFAULT_RESUME_IDENTITY
from ._spans import answered, settled_answer
from ._step import StepFlow, adrive, drive, settle_step
from ._tools import may_call, table_tools


def _not_offered(gate: EffectGate, request: ToolCallRequest, ctx: CallContext) -> ToolMessage | None:
    """create_agent's ToolNode answer to a call of a table row the agent may call but does not
    offer: an error ToolMessage, as ToolNode gives it; nothing is registered or run. (A tool the
    table or its allowlist lacks goes to the gate, which refuses it and records the refusal.)"""
    call = request.tool_call
    if request.tool is not None or not may_call(gate, ctx, call["name"]):
        return None
    offered = ", ".join(t.name for t in request.runtime.tools or ())
    content = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(requested_tool=call["name"], available_tools=offered)
    return ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")


def _raise(e: Exception) -> str:
    """A tool's failure is raised to create_agent's ToolNode, which applies its own flag."""
    raise e


class EffectGateMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Gate every tool call of a `create_agent` agent through `gate`; see the module docstring.

    `tools`: the tools the middleware registers with the agent (what the model is shown);
    by default the table rows `agent_id` may call. Pass `tools=[]` when the agent is given its
    tools itself; every tool it offers must then have a row in the table. For langchain tools
    you already have, `gated_middleware(tools, effects)` builds the gate and the middleware.
    `native_approver`: who approves and rejects a HITL answer, as for `GatedToolNode` (a function
    is called with the tool call's `request.runtime.config` and `.context`).
    """

    def __init__(
        self,
        gate: EffectGate,
        *,
        agent_id: str | None = None,
        tools: Sequence[BaseTool] | None = None,
        resume_identity: str = DEFAULT_RESUME_IDENTITY,
        native_approver: NativeApprover | None = None,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.agent_id = agent_id
        self.resume_identity = resume_identity
        self.native_approver = native_approver
        self.tools = list(tools) if tools is not None else table_tools(gate.table, agent_id=agent_id)
        #: The arguments the framework supplies, by tool name: dropped from every call the gate sees.
        self.injected_keys = framework_keys(gate, self.tools)
        # ToolNode's own injection and Command checks (create_agent's ToolNode is not reachable
        # from a middleware; a tool it does not know is read on the fly, as ToolNode does).
        self._tool_node = ToolNode(self.tools)

    def _context(self, request: ToolCallRequest) -> CallContext:
        messages = messages_of(request.state)
        ctx = call_context(messages, request.runtime.config, request.runtime.context, agent_id=self.agent_id)
        return dataclasses.replace(ctx, tool_call_id=request.tool_call.get("id"))

    def _model_call(self, call: ToolCall) -> ToolCall:
        return model_call(call, self.injected_keys.get(call["name"]))

    def _reused(self, request: ToolCallRequest, call: ToolCall) -> bool:
        """Whether the model wrote this call's id on another call of its step too (`reused_ids`):
        then it is refused, unregistered, and nothing runs for it."""
        step = [self._model_call(c) for c in step_calls(messages_of(request.state))]
        return str(call.get("id") or "") in reused_ids(self.gate, step)

    def _flow(self, request: ToolCallRequest, call: ToolCall, ctx: CallContext) -> StepFlow:
        step = [self._model_call(c) for c in step_calls(messages_of(request.state))]
        offered = {t.name for t in request.runtime.tools or ()}
        step = [c for c in step if c["name"] in offered]  # the rest are refused (`_not_offered`)
        if not any(c.get("id") == call.get("id") and c["name"] == call["name"] for c in step):
            step = [call]  # a call an outer middleware made or renamed (its id kept): settled alone
        else:  # as an outer middleware changed its arguments, if it did (the reviewer sees them)
            step = [call if c.get("id") == call.get("id") and c["name"] == call["name"] else c for c in step]
        own = frozenset({str(call.get("id") or "")})
        runtime = request.runtime
        return settle_step(
            self.gate,
            step,
            ctx,
            own=own,
            resume_identity=self.resume_identity,
            injected_keys=self.injected_keys,
            approver_of=lambda: native_approver(self.native_approver, runtime.config, runtime.context),
        )

    def _flight(self, call: ToolCall, request: ToolCallRequest) -> AbstractContextManager[Flight]:
        """The call runs with the ToolRuntime create_agent's ToolNode built for it."""
        spec = self.gate.table.get(call["name"])
        return flying(
            [call],
            request.runtime.config,
            runtimes={str(call.get("id") or ""): request.runtime},
            inject=self._tool_node._inject_tool_args,
            graph_updates=spec is not None and spec.effect is Effect.READ,
        )

    def _answer(
        self, call: ToolCall, outcome: Outcome, flight: Flight, request: ToolCallRequest
    ) -> ToolMessage | Command[Any]:
        call_id = str(call.get("id") or "")
        update = flight.updates.get(call_id)
        if update is not None and isinstance(outcome, Executed):
            # create_agent sends each call to its ToolNode on its own ("tool_calls" input).
            out: Any = self._tool_node._normalize_tool_response(update, call, "tool_calls")
            return cast("ToolMessage | Command[Any]", out)
        answer = tool_message(outcome, call, ran=flight.messages.get(call_id))
        if isinstance(outcome, Invalid):  # ToolNode's answer, after its tool's start and error
            answer = self._invalid(call, request) or answer
            return answered(answer, outcome, call, request.runtime.config, self._tool_node.tools_by_name)
        return answer

    def _settled(
        self, settled: Settled, call: ToolCall, flight: Flight, request: ToolCallRequest
    ) -> ToolMessage | Command[Any]:
        ran = flight.messages.get(str(call.get("id") or ""))
        config, tools = request.runtime.config, self._tool_node.tools_by_name
        return settled_answer(settled, call, ran, _raise, config, tools)

    def _invalid(self, call: ToolCall, request: ToolCallRequest) -> ToolMessage | None:
        """A read's or write's invalid arguments as create_agent's ToolNode answers them (its
        default `handle_tool_errors` turns the tool's `ToolInvocationError` into this message);
        nothing ran either way. None for a row that is not a langchain tool the agent offers."""
        tool = self._tool_node.tools_by_name.get(call["name"])
        if tool is None:
            return None
        injected = self._tool_node._injected_args.get(call["name"])
        error = invocation_error(
            tool, request.tool_call, request.runtime, self._tool_node._inject_tool_args, injected
        )
        if error is None:
            return None
        return ToolMessage(
            content=error.message, name=call["name"], tool_call_id=str(call.get("id") or ""), status="error"
        )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        call = self._model_call(request.tool_call)
        if self._reused(request, call):
            return tool_message(reused_id_refusal(call), call)
        ctx = self._context(request)
        if (unknown := _not_offered(self.gate, request, ctx)) is not None:
            return unknown
        call_id = str(call.get("id") or "")
        with self._flight(call, request) as flight:
            if is_gated(self.gate, call["name"]):
                settled = drive(self._flow(request, call, ctx), self.gate)[call_id]
                return self._settled(settled, call, flight, request)
            try:
                outcome: Outcome = self.gate.call(call["name"], call["args"], ctx)
            except InvalidToolArguments as exc:
                raise_injection_error(exc)
                raise
            except ToolReportedError as exc:  # the tool's own error ToolMessage, as ToolNode gives it
                return exc.message
        return self._answer(call, outcome, flight, request)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call = self._model_call(request.tool_call)
        if self._reused(request, call):
            return tool_message(reused_id_refusal(call), call)
        ctx = self._context(request)
        if (unknown := _not_offered(self.gate, request, ctx)) is not None:
            return unknown
        call_id = str(call.get("id") or "")
        with self._flight(call, request) as flight:
            if is_gated(self.gate, call["name"]):
                settled = (await adrive(self._flow(request, call, ctx), self.gate))[call_id]
                return self._settled(settled, call, flight, request)
            try:
                outcome: Outcome = await self.gate.acall(call["name"], call["args"], ctx)
            except InvalidToolArguments as exc:
                raise_injection_error(exc)
                raise
            except ToolReportedError as exc:  # the tool's own error ToolMessage, as ToolNode gives it
                return exc.message
        return self._answer(call, outcome, flight, request)
