"""GatedToolNode fed one call per task with `Send` (what create_agent does): the step still counts."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from effectgate import Approver
from effectgate.stores.base import from_json
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import paused_of

CONFIG: Any = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}


def send_graph(shop_gate: ShopGate, script: Script) -> CompiledStateGraph[Any, Any, Any, Any]:
    tools = GatedToolNode(shop_gate.gate, agent_id="support")
    model = ScriptedChatModel(script=script).bind_tools(list(tools.tools_by_name.values()))

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> Any:
        last = state["messages"][-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return END
        return [
            Send("tools", {"__type": "tool_call_with_context", "tool_call": c, "state": state})
            for c in last.tool_calls
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def test_one_task_per_call_pauses_each_gated_call_and_runs_each_once(shop_gate: ShopGate) -> None:
    """Two gated calls sent as two tasks pause together; one resume runs each once, the read once."""
    script = Script(
        [
            step(
                call("get_order", order_id="1042"),
                call("refund_order", **REFUND),
                call("cancel_subscription", subscription_id="sub_u1"),
            ),
            say("Done."),
        ]
    )
    graph = send_graph(shop_gate, script)
    out = graph.invoke(
        {"messages": [HumanMessage("all three", id="m3")]}, CONFIG, context=CONTEXT, version="v2"
    )
    paused = paused_of(out)
    assert sorted(p.tool for p in paused) == ["cancel_subscription", "refund_order"]
    assert shop_gate.shop.reads["get_order"] == 1
    role = {"refund_order": Approver("fiona", "finance"), "cancel_subscription": Approver("bill", "billing")}
    decisions = {p.approval_id: approve(grant(shop_gate.gate, p, role[p.tool])) for p in paused}
    done = graph.invoke(resume(decisions, out.interrupts), CONFIG, context=CONTEXT, version="v2")
    assert done.interrupts == ()
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    script.assert_complete()


def test_parallel_refunds_sent_as_two_tasks_register_neither(shop_gate: ShopGate) -> None:
    """Each task sees the whole step, so two refunds in it are both refused and none is registered."""
    script = Script(
        [
            step(
                call("refund_order", order_id="1042", amount=6000, currency="GBP"),
                call("refund_order", order_id="1043", amount=3500, currency="GBP"),
            ),
            say("One at a time."),
        ]
    )
    graph = send_graph(shop_gate, script)
    out = graph.invoke({"messages": [HumanMessage("both", id="m7")]}, CONFIG, context=CONTEXT, version="v2")
    assert out.interrupts == ()
    assert shop_gate.store.approvals() == []
    messages = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert [m.artifact[ARTIFACT_KEY]["code"] for m in messages] == ["parallel_calls", "parallel_calls"]
    assert {from_json(e.detail_json)["code"] for e in shop_gate.store.events(kind="refused")} == {
        "parallel_calls"
    }
    script.assert_complete()
