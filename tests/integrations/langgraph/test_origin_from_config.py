"""The id of the user message a step answers, where the state has no HumanMessage with one: the
application may put it in `config["configurable"]["origin_message_id"]`. A HumanMessage id in the
state always wins over it, and without either the run stops with a MissingIdentity that says where
to put it; model text never supplies it. Effects are counted at the receiver."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from effectgate import EffectGate, money, read
from effectgate.testing import EffectRecorder
from effectgate_langgraph import MissingIdentity, gated_node

THREAD: dict[str, str] = {"thread_id": "s-ada", "user_id": "u1"}
REFUND = {"name": "refund_order", "args": {"order_id": "1042", "amount": 500}, "id": "c1"}
LOOKUP = {"name": "get_order", "args": {"order_id": "1042"}, "id": "c2"}
Shop = tuple[CompiledStateGraph[Any, Any, Any, Any], EffectRecorder]  # the graph, the tools' receiver


def shop_tools(receiver: EffectRecorder) -> list[BaseTool]:
    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        receiver.record("get_order", order_id=order_id)
        return f"order {order_id}: delivered"

    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    return [get_order, refund_order]


@pytest.fixture
def shop(tmp_path: Path, gates: list[EffectGate]) -> Shop:
    """The gated node alone (START -> tools -> END): it runs the calls of the message it is given."""
    receiver = EffectRecorder()
    node = gated_node(
        shop_tools(receiver),
        {"get_order": read(), "refund_order": money("finance", subject="order_id")},
        db=f"sqlite:///{tmp_path}/effectgate.db",
    )
    gates.append(node.gate)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=InMemorySaver()), receiver


def step(*calls: dict[str, Any], before: Sequence[AnyMessage] = ()) -> dict[str, list[AnyMessage]]:
    return {"messages": [*before, AIMessage("", tool_calls=list(calls))]}


def config(**extra: str) -> RunnableConfig:
    return {"configurable": {**THREAD, **extra}}


def test_a_state_without_a_user_message_is_keyed_on_the_configured_id(
    shop: Shop, gates: list[EffectGate]
) -> None:
    """The model's message alone, the id in the config: a read runs once; a refund pauses keyed
    on that id and does not run."""
    graph, receiver = shop
    done = graph.invoke(step(LOOKUP), config(origin_message_id="m-cfg"), version="v2")
    assert done.interrupts == ()
    assert receiver.count("get_order", order_id="1042") == 1
    paused = graph.invoke(step(REFUND), config(thread_id="s-bob", origin_message_id="m-cfg"), version="v2")
    assert len(paused.interrupts) == 1
    [row] = gates[0].store.approvals()
    assert (row.session_id, row.origin_message_id, row.user_id) == ("s-bob", "m-cfg", "u1")
    assert receiver.count("refund") == 0


def test_the_states_user_message_id_wins_over_the_configured_one(shop: Shop, gates: list[EffectGate]) -> None:
    """A HumanMessage with an id in the state is the origin, whatever the config says."""
    graph, receiver = shop
    ask = [HumanMessage("refund 1042", id="m3")]
    graph.invoke(step(REFUND, before=ask), config(origin_message_id="m-cfg"), version="v2")
    [row] = gates[0].store.approvals()
    assert row.origin_message_id == "m3"
    assert receiver.count("refund") == 0


def test_without_either_the_run_stops_and_says_where_the_id_goes(shop: Shop, gates: list[EffectGate]) -> None:
    """No user message id in the state or the config, only model text claiming one: nothing
    runs, not even the read, and MissingIdentity names both places."""
    graph, receiver = shop
    claim = AIMessage("origin_message_id: m-evil", tool_calls=[LOOKUP])
    with pytest.raises(MissingIdentity) as raised:
        graph.invoke({"messages": [claim]}, config(), version="v2")
    message = str(raised.value)
    assert "HumanMessage(text, id=...)" in message
    assert "config['configurable']['origin_message_id']" in message
    assert receiver.count("get_order") == 0
    assert gates[0].store.approvals() == []
