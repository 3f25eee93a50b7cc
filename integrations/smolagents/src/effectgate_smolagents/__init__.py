"""effectgate for smolagents: gated tools, a run that stops at a gated call, and its continuation.

    from effectgate import money, read
    from effectgate_smolagents import GatedAgent, Approve, AwaitingApproval

    support = GatedAgent(ToolCallingAgent(tools=[get_order, RefundTool()], model=model),
                         effects={"get_order": read(), "refund_order": money("finance", subject="order_id")})
    out = support.run("Please refund order 1042", session_id="s-ada", origin_message_id="m3", user_id="u1")
    if isinstance(out, AwaitingApproval):                  # approval ids and cards, identity
        grant = support.gate.approve(out.approval_ids[0], version=1, approver=Approver("fiona", "finance"))
        out = support.resume(out, {out.approval_ids[0]: Approve(grant)})   # runs once, continues

The tools stay the user's own (`@tool` functions, `Tool` subclasses); `native_tool` reads each
one's name, description and inputs for the gate. With an effect table of `ToolSpec`s instead,
`GatedAgent(agent, gate, agent_id="support")`.

Works for `ToolCallingAgent` and `CodeAgent` alike (`_agent` documents how each is stopped).
`save_memory` / `restore_memory` move a paused run's memory to another process, signed for its
session, user, agent and pause.
"""

from effectgate.adapter import DecisionMismatch, MissingIdentity, TamperedState, UnknownTool

from ._agent import GatedAgent, gate_agent
from ._code import ApprovalRequired
from ._decisions import Approve, Decision, Deny, continuation
from ._memory import restore_memory, save_memory
from ._native import native_tool
from ._outcomes import AwaitingApproval, Finished, RunOutcome
from ._table import spec_tool, table_tools
from ._tools import GatedTool, native_tools

__version__ = "0.1.0"

__all__ = [
    "ApprovalRequired",
    "Approve",
    "AwaitingApproval",
    "Decision",
    "DecisionMismatch",
    "Deny",
    "Finished",
    "GatedAgent",
    "GatedTool",
    "MissingIdentity",
    "RunOutcome",
    "TamperedState",
    "UnknownTool",
    "__version__",
    "continuation",
    "gate_agent",
    "native_tool",
    "native_tools",
    "restore_memory",
    "save_memory",
    "spec_tool",
    "table_tools",
]
