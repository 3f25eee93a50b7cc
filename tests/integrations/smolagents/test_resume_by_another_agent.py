"""A signed `AwaitingApproval` is resumed only by the gated agent it paused in.

The record signs the agent id with the run's identity, and `restore_memory` refuses a blob for
another agent; `resume` must refuse the record on another `GatedAgent` of the same gate too:
it would apply the decisions and continue that other agent's run (its memory, its table rows)
as the paused run's session, message and user, telling it what the first agent's call returned.
"""

from __future__ import annotations

import pytest
from smolagents import ToolCallingAgent
from smolagents.monitoring import LogLevel

from effectgate.adapter import DecisionMismatch
from effectgate.examples.shop import SUMMARY_AGENT
from effectgate.testing import Script, call, say
from effectgate_smolagents import Approve, AwaitingApproval, GatedAgent, table_tools
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._harness import SESSION, USER, support_agent


def test_an_awaiting_record_is_refused_by_another_gated_agent(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    support = support_agent(gate, ScriptedModel(Script([call("refund_order", **REFUND), say("Refunded.")])))
    paused = support.run("Refund order 1042", session_id=SESSION, origin_message_id="m3", user_id=USER)
    assert isinstance(paused, AwaitingApproval)
    [pending] = paused.pending
    token = grant(gate, pending)  # type: ignore[arg-type]

    other_script = Script([say("Summarised.")])
    other_model = ScriptedModel(other_script)
    base = ToolCallingAgent(
        tools=list(table_tools(gate, agent_id=SUMMARY_AGENT)),
        model=other_model,
        verbosity_level=LogLevel.OFF,
        max_steps=2,
    )
    other = GatedAgent(base, gate, agent_id=SUMMARY_AGENT)
    restored = AwaitingApproval.from_dict(paused.to_dict(), gate)
    with pytest.raises(DecisionMismatch):
        other.resume(restored, {pending.approval_id: Approve(token)})
    assert shop_gate.shop.receiver.count("refund") == 0
    assert other_script.remaining == 1  # the other agent's model was never asked
    # the agent it paused in still resumes it: the refund runs once
    done = support.resume(restored, {pending.approval_id: Approve(token)})
    assert [type(o).__name__ for _, o in done.decided] == ["Executed"]
    assert shop_gate.shop.receiver.count("refund") == 1
