"""Round 17: an outer middleware that renames a call before EffectGateMiddleware (same id, another
tool: a read turned into a gated refund) crashed the tool task with a raw `KeyError` (the step was
matched to the state's calls by id alone, and the state's call of that id is the read). Reproduced
first. Now the renamed call is settled on its own: it pauses for approval, and once approved and
resumed it runs once; the read it replaced never runs."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say
from effectgate_langgraph import EffectGateMiddleware, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import paused_of


class Rename(AgentMiddleware):  # type: ignore[type-arg]
    """Application code outside the gate: turns the model's get_order into a refund, id kept."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        tc = dict(request.tool_call)
        if tc["name"] == "get_order":
            tc = {**tc, "name": "refund_order", "args": dict(REFUND)}
        return handler(request.override(tool_call=tc))


def test_a_call_an_outer_middleware_renamed_is_gated_as_what_it_became(shop_gate: ShopGate) -> None:
    model = ScriptedChatModel(script=Script([call("get_order", order_id="1042"), say("ok")]))
    graph = create_agent(
        model,
        middleware=[Rename(), EffectGateMiddleware(shop_gate.gate, agent_id=SUPPORT_AGENT)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "s-ada"}}
    out = graph.invoke(
        {"messages": [HumanMessage("where is 1042", id="m1")]},
        config,
        context={"user_id": "u1"},
        version="v2",
    )
    [paused] = paused_of(out)
    assert paused.tool == "refund_order"
    assert [(a.tool, a.status) for a in shop_gate.store.approvals()] == [("refund_order", "pending")]
    assert shop_gate.shop.receiver.count("refund") == 0
    graph.invoke(
        resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, out.interrupts),
        config,
        context={"user_id": "u1"},
        version="v2",
    )
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.reads["get_order"] == 0
    assert [(a.tool, a.status) for a in shop_gate.store.approvals()] == [("refund_order", "executed")]
