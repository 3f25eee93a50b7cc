"""EffectGateMiddleware: the gate for langchain's `create_agent`, where HITL middleware would go.

    agent = create_agent(model, middleware=[EffectGateMiddleware(gate, agent_id="support")],
                         checkpointer=InMemorySaver())

It gates in `wrap_tool_call`, the execution boundary, so no `after_model` hook or jump can route
a call around it. `create_agent` runs each tool call of a model step as its own task, so:

- a read or write call runs at once through `gate.call`, without waiting for approvals;
- a gated call registers the step's gated calls through `gate.call_step` (the parallel-calls
  rule sees the whole step; the core's intent key makes the siblings' registrations one) and
  pauses its own task with an interrupt listing its own call, in the same payload shape as the
  node's. Several gated calls of one step therefore surface as several interrupts at once.

Resume with a mapping from approval id to decision: `resume(decisions, out.interrupts)` sends
each interrupt the decisions for the approvals it lists; `Command(resume=decisions)` works too.
The middleware answers every call itself: the tool functions (and any middleware listed after
it) are never invoked, because what runs is the effect table's row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from effectgate import CallContext, EffectGate, Outcome
from effectgate.adapter import is_gated

from ._fidelity import flying
from ._identity import call_context, messages_of, step_calls
from ._messages import tool_message
from ._node import DEFAULT_RESUME_IDENTITY, answer_settled
from ._step import StepFlow, adrive, drive, settle_step
from ._tools import table_tools


def _raise(e: Exception) -> str:
    """A tool's failure is raised to create_agent's ToolNode, which applies its own flag."""
    raise e


class EffectGateMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Gate every tool call of a `create_agent` agent through `gate`; see the module docstring.

    `tools`: the tools the middleware registers with the agent (what the model is shown);
    by default the table rows `agent_id` may call. Pass `tools=[]` when the agent is given its
    tools itself; every tool it offers must then have a row in the table. For langchain tools
    you already have, `gated_middleware(tools, effects)` builds the gate and the middleware.
    """

    def __init__(
        self,
        gate: EffectGate,
        *,
        agent_id: str | None = None,
        tools: Sequence[BaseTool] | None = None,
        resume_identity: str = DEFAULT_RESUME_IDENTITY,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.agent_id = agent_id
        self.resume_identity = resume_identity
        self.tools = list(tools) if tools is not None else table_tools(gate.table, agent_id=agent_id)

    def _context(self, request: ToolCallRequest) -> CallContext:
        messages = messages_of(request.state)
        ctx = call_context(messages, request.runtime.config, request.runtime.context, agent_id=self.agent_id)
        return dataclasses.replace(ctx, tool_call_id=request.tool_call.get("id"))

    def _flow(self, request: ToolCallRequest, ctx: CallContext) -> StepFlow:
        call = request.tool_call
        step = step_calls(messages_of(request.state))
        if call.get("id") not in {c.get("id") for c in step}:
            step = [call]
        own = frozenset({str(call.get("id") or "")})
        return settle_step(self.gate, step, ctx, own=own, resume_identity=self.resume_identity)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        ctx = self._context(request)
        call_id = str(call.get("id") or "")
        with flying([call], request.runtime.config) as flight:
            if is_gated(self.gate, call["name"]):
                settled = drive(self._flow(request, ctx), self.gate)[call_id]
                return answer_settled(settled, call, flight.messages.get(call_id), _raise)
            outcome: Outcome = self.gate.call(call["name"], call["args"], ctx)
        return tool_message(outcome, call, ran=flight.messages.get(call_id))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        ctx = self._context(request)
        call_id = str(call.get("id") or "")
        with flying([call], request.runtime.config) as flight:
            if is_gated(self.gate, call["name"]):
                settled = (await adrive(self._flow(request, ctx), self.gate))[call_id]
                return answer_settled(settled, call, flight.messages.get(call_id), _raise)
            outcome: Outcome = await self.gate.acall(call["name"], call["args"], ctx)
        return tool_message(outcome, call, ran=flight.messages.get(call_id))
