"""EffectGateMiddleware on `create_agent`: the contract, and the per-call tasks create_agent runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Approver
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, EffectGateMiddleware, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, AdapterContract, MakeHarness, ShopGate, grant

from ._graph import LangGraphHarness
from .conftest import MakeLangGraphHarness

CANCEL = {"subscription_id": "sub_u1"}
BILLING = Approver("bill", "billing")


@pytest.fixture
def agent_harness(lg_harness: MakeLangGraphHarness) -> MakeLangGraphHarness:
    def make(script: Script, **options: Any) -> LangGraphHarness:
        return lg_harness(script, agent=True, **options)

    return make


class TestCreateAgentMiddleware(AdapterContract):
    @pytest.fixture
    def make_harness(self, agent_harness: MakeLangGraphHarness) -> MakeHarness:
        return agent_harness


def test_gated_calls_of_one_step_pause_together_and_the_read_runs_once(
    agent_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A read and two gated calls: the read runs at once and once; each gated call pauses with its own id."""
    h = agent_harness(
        Script(
            [
                step(
                    call("get_order", order_id="1042"),
                    call("refund_order", **REFUND),
                    call("cancel_subscription", **CANCEL),
                ),
                say("Done."),
            ]
        )
    )
    turn = h.send("Check 1042, refund it and cancel my subscription", message_id="m3")
    assert h.last is not None
    assert len(h.last.interrupts) == 2
    refund, cancel = sorted(turn.paused, key=lambda p: p.tool != "refund_order")
    assert (refund.tool, cancel.tool) == ("refund_order", "cancel_subscription")
    assert shop_gate.shop.reads["get_order"] == 1
    done = h.decide(
        {
            refund.approval_id: approve(grant(shop_gate.gate, refund)),
            cancel.approval_id: approve(grant(shop_gate.gate, cancel, BILLING)),
        }
    )
    assert done.paused == ()
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert len(shop_gate.store.approvals()) == 2
    h.script.assert_complete()


def test_crossed_decisions_across_tasks_are_refused(
    agent_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Each call's grant under the other's approval id: both refused, both still waiting, nothing runs."""
    h = agent_harness(
        Script([step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL)), say("Done.")])
    )
    refund, cancel = sorted(
        h.send("Refund 1042 and cancel", message_id="m3").paused, key=lambda p: p.tool != "refund_order"
    )
    refund_token = grant(shop_gate.gate, refund)
    cancel_token = grant(shop_gate.gate, cancel, BILLING)
    crossed = h.decide({refund.approval_id: approve(cancel_token), cancel.approval_id: approve(refund_token)})
    assert {p.approval_id for p in crossed.paused} == {refund.approval_id, cancel.approval_id}
    assert shop_gate.shop.receiver.effects == []
    done = h.decide({refund.approval_id: approve(refund_token), cancel.approval_id: approve(cancel_token)})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    h.script.assert_complete()


def test_parallel_refunds_register_neither_across_tasks(
    agent_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two refunds in one step, run as two tasks, are both refused parallel_calls with no card."""
    h = agent_harness(
        Script(
            [
                step(
                    call("refund_order", order_id="1042", amount=6000, currency="GBP"),
                    call("refund_order", order_id="1043", amount=3500, currency="GBP"),
                ),
                say("One at a time, then."),
            ]
        )
    )
    turn = h.send("Refund both", message_id="m7")
    assert turn.paused == ()
    codes = [m.artifact[ARTIFACT_KEY]["code"] for m in h.messages() if isinstance(m, ToolMessage)]
    assert codes == ["parallel_calls", "parallel_calls"]
    assert shop_gate.store.approvals() == []
    h.script.assert_complete()


class JumpToTools(AgentMiddleware):  # type: ignore[type-arg]
    """An after_model hook that routes straight to tools: it skipped batched HITL (lg07)."""

    @hook_config(can_jump_to=["tools"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return {"jump_to": "tools"} if state["messages"][-1].tool_calls else None


def test_a_jump_to_tools_hook_cannot_route_around_the_gate(shop_gate: ShopGate) -> None:
    """With a middleware that jumps to tools after the model, the refund still pauses and runs nothing."""
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND)]))
    agent = create_agent(
        model,
        middleware=[EffectGateMiddleware(shop_gate.gate, agent_id="support"), JumpToTools()],
        checkpointer=InMemorySaver(),
    )
    out = agent.invoke(
        {"messages": [HumanMessage("Refund 1042", id="m3")]},
        {"configurable": {"thread_id": "s-ada"}},
        context={"user_id": "u1"},
        version="v2",
    )
    [pause] = out.interrupts
    assert pause.value["requests"][0]["tool"] == "refund_order"
    assert shop_gate.shop.receiver.count("refund") == 0
    [row] = shop_gate.store.approvals()
    assert row.status == "pending"


def test_plain_mapping_resume_answers_every_pending_task(
    agent_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """One `Command(resume={approval_id: decision, ...})` answers both tasks' interrupts; each runs once."""
    h = agent_harness(
        Script([step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL)), say("Done.")])
    )
    paused = h.send("Refund 1042 and cancel", message_id="m3").paused
    approver = {"refund_order": Approver("fiona", "finance"), "cancel_subscription": BILLING}
    decisions = {p.approval_id: approve(grant(shop_gate.gate, p, approver[p.tool])) for p in paused}
    done = h.invoke(Command(resume=decisions))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    h.script.assert_complete()


@pytest.mark.parametrize("checkpointer", ["memory"], indirect=True)  # SqliteSaver has no async methods
def test_ainvoke_through_the_middleware(agent_harness: MakeLangGraphHarness, shop_gate: ShopGate) -> None:
    """Under ainvoke the middleware pauses the refund and runs it once after the approval."""
    h = agent_harness(
        Script([step(call("get_order", order_id="1042"), call("refund_order", **REFUND)), say("Ok.")])
    )

    async def conversation() -> None:
        [paused] = (await h.ainvoke({"messages": [HumanMessage("Refund 1042", id="m3")]})).paused
        token = await asyncio.to_thread(grant, shop_gate.gate, paused)
        assert (await h.ainvoke(resume({paused.approval_id: approve(token)}, h.interrupt))).paused == ()

    asyncio.run(conversation())
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()
