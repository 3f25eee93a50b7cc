"""What the application must give the graph, said exactly: a run without a user fails with a
MissingIdentity naming the value and where it goes; langchain's HITL approve of an effectgate pause,
with no native approver configured, is refused with how to answer; a value for a framework-supplied
parameter never comes from the model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Effect, EffectGate, EffectTable, Keyring, ToolContext, ToolSpec, open_store
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import GatedToolNode, MissingIdentity
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import ShopGate, grant

from ._graph import paused_of, shop_graph
from .conftest import MakeLangGraphHarness


@dataclass
class Tenant:  # a runtime context that carries no user
    tenant_id: str


def read_script() -> Script:
    return Script([call("get_order", order_id="1042"), say("Shipped.")])


def test_a_run_without_a_user_names_the_value_and_where_it_goes(shop_gate: ShopGate) -> None:
    """No context, or a context without user_id: MissingIdentity names user_id, says what was
    given, and shows the call that supplies it. Nothing ran."""
    graph = shop_graph(shop_gate.gate, ScriptedChatModel(script=read_script()), checkpointer=InMemorySaver())
    cfg: RunnableConfig = {"configurable": {"thread_id": "s1"}}
    with pytest.raises(MissingIdentity) as raised:
        graph.invoke({"messages": [HumanMessage("where?", id="m1")]}, cfg)
    message = str(raised.value)
    assert message.startswith("the run has no user_id (no runtime context was passed): ")
    assert "pass context=YourContext(user_id=...) to graph.invoke" in message
    assert "config['configurable']['user_id']" in message

    graph = shop_graph(shop_gate.gate, ScriptedChatModel(script=read_script()), checkpointer=InMemorySaver())
    with pytest.raises(
        MissingIdentity, match=r"the runtime context \(Tenant\) has no non-empty string user_id"
    ):
        graph.invoke({"messages": [HumanMessage("where?", id="m1")]}, cfg, context=Tenant("acme"))
    assert shop_gate.shop.reads["get_order"] == 0


def test_the_one_line_identity_in_the_config_works(shop_gate: ShopGate) -> None:
    """The README's one line: thread and user in `config["configurable"]`, no context needed."""
    model = ScriptedChatModel(script=read_script())
    graph = shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver())
    out = graph.invoke(
        {"messages": [HumanMessage("where?", id="m1")]},
        {"configurable": {"thread_id": "s1", "user_id": "u1"}},
        version="v2",
    )
    assert out.value["messages"][-1].content == "Shipped."
    assert shop_gate.shop.reads["get_order"] == 1
    model.assert_complete()


def test_a_langchain_hitl_approve_without_a_native_approver_is_refused_with_how_to_answer(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """`{"decisions": [{"type": "approve"}]}` (HumanInTheLoopMiddleware's answer) with no
    `native_approver` runs nothing: the pause comes back, its `refused` names the setting and the
    effectgate answer, and the effectgate answer then works (test_hitl_decisions.py: the rest)."""
    h = node_or_agent(
        Script([call("refund_order", order_id="1042", amount=12000, currency="GBP"), say("ok")])
    )
    [paused] = h.send("refund 1042", message_id="m1").paused
    turn = h.invoke(Command(resume={"decisions": [{"type": "approve"}]}))
    assert turn.paused == (paused,)
    assert shop_gate.shop.receiver.effects == []
    assert h.last is not None
    [refused] = h.last.interrupts[0].value["refused"]
    assert refused["approval_id"] == paused.approval_id
    assert "HumanInTheLoopMiddleware" in refused["reason"]
    assert "native_approver=Approver(id, role)" in refused["reason"]
    assert "effectgate_langgraph.resume({approval_id: decision}, out.interrupts)" in refused["reason"]
    assert "approve(grant.token)" in refused["reason"]

    h.approve(paused, grant(shop_gate.gate, paused))
    assert shop_gate.shop.receiver.count("refund") == 1
    assert paused_of(h.last) == ()


@pytest.fixture
def tagging(sqlite_url: str) -> Iterator[tuple[EffectGate, EffectRecorder]]:
    """A table row whose function takes a ToolContext (supplied by the gate, not the model)."""
    receiver = EffectRecorder()

    def tag_ticket(ticket_id: str, tag: str, ctx: ToolContext) -> str:
        """Tag a ticket."""
        receiver.record("tag", ticket_id=ticket_id, ctx=type(ctx).__name__, key=ctx.idempotency_key)
        return "tagged"

    store = open_store(sqlite_url)
    store.setup()
    gate = EffectGate(
        EffectTable(
            [ToolSpec(name="tag_ticket", effect=Effect.WRITE, fn=tag_ticket)], allow={"agent": ["tag_ticket"]}
        ),
        store,
        keyring=Keyring.generate(),
    )
    yield gate, receiver
    gate.close()


def test_a_framework_supplied_parameter_never_comes_from_the_model(
    tagging: tuple[EffectGate, EffectRecorder],
) -> None:
    """The model sending a value for the row's ToolContext parameter is an invalid call (the
    parameter is not in the schema it was shown): nothing runs. Without it, the tool gets the
    gate's ToolContext, which is not part of the hashed arguments."""
    gate, receiver = tagging
    forged = call("tag_ticket", ticket_id="t-1", tag="vip", ctx={"idempotency_key": "forged"})
    script = Script([forged, call("tag_ticket", ticket_id="t-1", tag="vip"), say("ok")])
    assert "ctx" not in dict(gate.table["tag_ticket"].schema or {}).get("properties", {})
    node = GatedToolNode(gate, agent_id="agent")
    graph = shop_graph(gate, ScriptedChatModel(script=script), checkpointer=InMemorySaver(), node=node)
    out = graph.invoke(
        {"messages": [HumanMessage("tag it", id="m1")]},
        {"configurable": {"thread_id": "s1", "user_id": "u1"}},
        version="v2",
    )
    first, second = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert first.status == "error"
    assert "Invalid arguments" in str(first.content)
    assert second.status == "success"
    assert len(receiver.effects) == 1
    assert receiver.count("tag", ticket_id="t-1", ctx="ToolContext") == 1
    assert receiver.count("tag", key="forged") == 0
