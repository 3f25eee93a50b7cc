"""effectgate for LangGraph: a gated tool node (and a create_agent middleware) with interrupt/resume.

Gate the langchain tools you already have by naming each one's effect (`gated_node` where a
ToolNode would go, `gated_middleware` in `create_agent`):

    from effectgate import money, read
    from effectgate_langgraph import gated_node
    tools = gated_node([get_order, refund_order],
                       {"get_order": read(), "refund_order": money("finance", subject="order_id")})

The full effect table is the advanced path:

    from effectgate_langgraph import GatedToolNode, EffectGateMiddleware, resume, approve
    builder.add_node("tools", GatedToolNode(gate, agent_id="support"))
    builder.add_conditional_edges("agent", tools_condition)
    graph = builder.compile(checkpointer=InMemorySaver())

    out = graph.invoke({"messages": [HumanMessage("refund 1042", id="m3")]}, cfg,
                       context={"user_id": "u1"}, version="v2")
    [pause] = out.interrupts                      # pause.value: the payload described below
    grant = gate.approve(approval_id, version=1, approver=Approver("fiona", "finance"))
    graph.invoke(resume({approval_id: approve(grant.token)}, pause), cfg, context=..., version="v2")

A model step with gated calls raises ONE interrupt listing every gated call still waiting
(`effectgate_langgraph._decisions` documents the payload: approval id, version, args hash, the
stored card, allowed decisions, and the same requests in langchain's HITL `action_requests` /
`review_configs` shape). Answer it with a mapping from approval id to decision:
`approve(token)`, `deny(reason)` or `edit(args)`. `resume(decisions, interrupt)` builds
`Command(resume={interrupt.id: decisions})`, the form that works whatever the approval ids look
like; `Command(resume=decisions)` works as well. `resume(..., gate=gate, user_id=...)` answers
only the interrupts whose payload carries the gate's signature, never a tool's own look-alike.
langchain's HumanInTheLoopMiddleware answer, `Command(resume={"decisions": [...]})`, is bridged by
position: a reject closes the approval, an approve goes through `gate.approve` as the
application's `native_approver=` (set on the node or middleware; without it the approve is
refused, naming that setting).

For `langchain.agents.create_agent`, put `EffectGateMiddleware(gate, agent_id=...)` where
`HumanInTheLoopMiddleware` would go; it gates each call at `wrap_tool_call`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.types import Command, Interrupt

from effectgate import EffectGate
from effectgate.adapter import DecisionMismatch, MissingIdentity, TamperedState

from ._decisions import PAYLOAD_TYPE, ApprovalPayload, ApprovalRequest, RefusedDecision, is_signed_payload
from ._messages import ARTIFACT_KEY
from ._middleware import EffectGateMiddleware
from ._native import InvalidToolArguments, gated_middleware, gated_node, native_tool
from ._node import GatedToolNode, gated_tool_node
from ._tools import spec_tool, table_tools

__version__ = "0.1.0"

__all__ = [
    "ARTIFACT_KEY",
    "ApprovalPayload",
    "ApprovalRequest",
    "DecisionMismatch",
    "EffectGateMiddleware",
    "GatedToolNode",
    "InvalidToolArguments",
    "MissingIdentity",
    "RefusedDecision",
    "TamperedState",
    "__version__",
    "approve",
    "deny",
    "edit",
    "gated_middleware",
    "gated_node",
    "gated_tool_node",
    "native_tool",
    "resume",
    "spec_tool",
    "table_tools",
]


def approve(token: str) -> dict[str, Any]:
    """An approve decision: the grant token from `gate.approve` or `effectgate approve`."""
    return {"type": "approve", "token": token}


def deny(reason: str) -> dict[str, Any]:
    """A deny decision; the model is told `reason`. It is recorded as the application's approver
    (`native_approver`, else the node's `resume_identity`), never as one the resume value names."""
    return {"type": "deny", "reason": reason}


def edit(args: Mapping[str, Any]) -> dict[str, Any]:
    """An edit decision: new arguments, proposed again through the table for their own approval."""
    return {"type": "edit", "args": dict(args)}


def resume(
    decisions: Mapping[str, Mapping[str, Any]],
    interrupts: Interrupt | Sequence[Interrupt] | None = None,
    *,
    gate: EffectGate | None = None,
    user_id: str | None = None,
) -> Command[Any]:
    """The Command answering gated calls with decisions keyed by approval id.

    With the pending interrupt(s) given, each of the gate's interrupts is addressed by its id and
    gets the decisions for the approvals its payload lists (a decision naming none of them goes to
    every one, to be refused there in the open); any other interrupt is left unanswered. Without,
    `Command(resume=decisions)`.

    Which interrupts are the gate's: with `gate=` and `user_id=` (the user the run resumes for,
    as its runtime context names them), those whose payload carries the gate's signature over
    the run and its waiting calls; a tool's own interrupt that copies the payload's `type` is
    left unanswered (it never sees the decisions or their tokens). Without them, any interrupt
    whose payload says `type: effectgate.approval`."""
    if (gate is None) != (user_id is None):
        raise TypeError("resume(): pass gate= and user_id= together (both verify the payloads), or neither")
    if user_id is not None and (not isinstance(user_id, str) or not user_id):
        raise TypeError("resume(): user_id must be the run's user id, a non-empty string")
    value = {key: dict(d) for key, d in decisions.items()}
    if interrupts is None:
        return Command(resume=value)
    given = [interrupts] if isinstance(interrupts, Interrupt) else list(interrupts)
    if gate is not None and user_id is not None:
        pending = [i for i in given if is_signed_payload(gate, i.value, user_id)]
    else:
        pending = [i for i in given if isinstance(i.value, Mapping) and i.value.get("type") == PAYLOAD_TYPE]
    listed = {i.id: _approval_ids(i) for i in pending}
    known = set().union(*listed.values())
    return Command(
        resume={
            i.id: {k: d for k, d in value.items() if k in listed[i.id] or k not in known} for i in pending
        }
    )


def _approval_ids(pending: Interrupt) -> set[str]:
    value = pending.value
    requests = value.get("requests") if isinstance(value, Mapping) else None
    if not isinstance(requests, list):  # a tool's own interrupt that copies the payload's `type`
        return set()
    return {str(r.get("approval_id")) for r in requests if isinstance(r, Mapping)}
