"""effectgate for the OpenAI Agents SDK: gated tools, approvals bound to arguments, exactly once.

    from effectgate import money, read
    from effectgate_openai_agents import gate_agent, gate_of, pending_approvals, approve_as, reject

    agent = gate_agent(
        Agent(name="support", tools=[get_order, refund_order]),     # your own @function_tools
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
    )
    gate = gate_of(agent)                     # on ./effectgate.db, its key file beside it
    context = {"session_id": "s-ada", "origin_message_id": "m3", "user_id": "u1"}
    result = await Runner.run(agent, "Please refund order 1042", context=context)
    state = result.to_state()                 # to_string() / from_string() across processes
    [paused] = pending_approvals(state)       # verified approval id, version, args hash, SDK item
    approve_as(gate, state, paused, Approver("fiona", "finance"))
    result = await Runner.run(agent, state)   # the refund runs once, through the gate

- `gate_agent(agent, effects={...})`: one effect row per tool you already have; the gate is built
  from the tools themselves (`native_tool`) and reachable as `gate_of(agent)` (`_agent`, `_native`).
- `gate_tools(tools, gate, agent_id=...)` / `gate_agent(agent, gate)`: a full effect table decides
  `needs_approval`, and every call runs through the gate (`_tools` documents how).
- `pending_approvals`, `approval_of`, `approve`, `approve_as`, `reject`: the approval flow (`_approvals`).
- The SDK's own `state.reject(item)` closes the approval; `state.approve(item)` approves through
  the gate as `gate_agent(..., native_approver=Approver(...))`, and runs nothing without it. Only
  a decision made in this process counts: an approval a restored snapshot carries is dropped
  (`_restored`).
- `mode="deferred"`, `deferred_operations`, `execute_deferred`, `with_outcome`: deferred results
  (only the gate's own answers to this run's gated calls; `_deferred`).
- Nothing else on the agent runs ungated: MCP servers only behind effectgate's proxy
  (`mcp_proxies=`), handoffs and agents as tools only to agents gated on the same gate (`_reach`).
- The run context is a dict with `session_id`, `origin_message_id`, `user_id` (`EffectGateContext`).
"""

from effectgate.adapter import DecisionMismatch, UnknownTool

from ._agent import StepHooks, gate_agent, gate_of
from ._approvals import PendingApproval, approval_of, approve, approve_as, pending_approvals, reject
from ._context import STATE_KEY, EffectGateContext, MissingIdentity, TamperedState, call_context
from ._deferred import aexecute_deferred, deferred_operations, execute_deferred, outcome_message, with_outcome
from ._native import native_tool
from ._tools import deferred_payload, gate_tools, is_deferred, spec_tool, table_tools

__version__ = "0.1.0"

__all__ = [
    "STATE_KEY",
    "DecisionMismatch",
    "EffectGateContext",
    "MissingIdentity",
    "PendingApproval",
    "StepHooks",
    "TamperedState",
    "UnknownTool",
    "__version__",
    "aexecute_deferred",
    "approval_of",
    "approve",
    "approve_as",
    "call_context",
    "deferred_operations",
    "deferred_payload",
    "execute_deferred",
    "gate_agent",
    "gate_of",
    "gate_tools",
    "is_deferred",
    "native_tool",
    "outcome_message",
    "pending_approvals",
    "reject",
    "spec_tool",
    "table_tools",
    "with_outcome",
]
