"""Review round 5: a grant token read back from an edited run state is used only for the approval
(and version) of the paused call it is attached to.

The run context is serialized with the `RunState`; anyone holding two stored snapshots can move
the grant of one approval under another approval's id. Real `Runner` runs on the scripted model,
on SQLite and PostgreSQL (`store_url`); effects are counted at the receiver.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool

from effectgate import Approver, EffectGate, Keyring, money
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)


class Refunds:
    """One gated refund tool on `store_url`, shared by every session of the test."""

    def __init__(self, store_url: str) -> None:
        self.receiver = EffectRecorder()
        self.model = ScriptedModel(Script([REFUND, REFUND, say("Done."), say("Done.")]))

        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        base = Agent(name="support", model=self.model, tools=[refund_order])
        effects = {"refund_order": money("finance")}
        self.agent = gate_agent(base, effects=effects, db=store_url, keyring=Keyring.generate())
        self.gate: EffectGate = gate_of(self.agent)

    def approved(self, message_id: str) -> tuple[dict[str, Any], str]:
        """A run's refund, paused and approved through the gate: its stored state and approval id."""
        paused = Runner.run_sync(self.agent, "Refund order 1042", context=context(message_id))
        state = asyncio.run(RunState.from_string(self.agent, paused.to_state().to_string()))
        [item] = pending_approvals(state)
        approve_as(self.gate, state, item, FINANCE)
        return json.loads(state.to_string()), str(item.approval_id)


@pytest.fixture
def refunds(store_url: str) -> Iterator[Refunds]:
    made = Refunds(store_url)
    yield made
    made.gate.close()


def _grants(stored: dict[str, Any]) -> dict[str, Any]:
    grants: dict[str, Any] = stored["context"]["context"]["effectgate"]["grants"]
    return grants


def test_a_grant_moved_under_another_approval_runs_nothing(refunds: Refunds) -> None:
    """Two runs of one session (messages m1 and m2) paused on the same refund (same tool and
    arguments; another session's is refused as subject_busy), each approved. Run A's stored state
    is edited so that its call's grant is run B's token. Resuming A must not run B's approval
    (spending B's grant, telling A's model B's result as its own call's while A's approval stays
    unrun): the token names another approval, so it is refused and nothing runs; both approvals
    stay approved, and B's own resume runs B's refund once."""
    stored_a, approval_a = refunds.approved("m1")
    stored_b, approval_b = refunds.approved("m2")
    assert approval_a != approval_b
    _grants(stored_a)[approval_a] = _grants(stored_b)[approval_b]  # B's grant under A's approval

    state = asyncio.run(RunState.from_string(refunds.agent, json.dumps(stored_a)))
    result = Runner.run_sync(refunds.agent, state)

    assert refunds.receiver.count("refund") == 0
    for approval_id in (approval_a, approval_b):
        row = refunds.gate.store.get_approval(approval_id)
        assert row is not None
        assert row.status == "approved"
        assert refunds.gate.result(approval_id) is None
    assert not any("refunded" in str(o.content) for o in tool_results(result))

    # B's own resume still runs B's refund, once
    restored_b = asyncio.run(RunState.from_string(refunds.agent, json.dumps(stored_b)))
    again = Runner.run_sync(refunds.agent, restored_b)
    assert [o.content for o in tool_results(again)] == ["refunded 500 on 1042"]
    assert refunds.receiver.count("refund") == 1
    row_b = refunds.gate.store.get_approval(approval_b)
    assert row_b is not None
    assert row_b.status == "executed"
