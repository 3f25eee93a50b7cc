"""A gated node gives the model what a plain ToolNode gives it: the same ToolMessage content (non-ASCII
kept, content blocks and typed outputs as langchain formats them), the same `handle_tool_errors`
and tool `handle_tool_error` behaviour, the same callbacks, and the caller's `wrap_tool_call`.

Each scenario runs the same langchain tools and script on a plain ToolNode and on `gated_node`,
on SQLite and PostgreSQL stores; effects are counted at the receiver."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import BaseModel

from effectgate import Approver, EffectGate, Grant, Row, money, read, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import ARTIFACT_KEY, GatedToolNode, approve, gated_middleware, gated_node
from effectgate_langgraph.testing import ScriptedChatModel

from ._fidelity import CONTEXT, Talk, ask, run, seen

FIONA = Approver("fiona", "finance")


class Note(BaseModel):
    title: str
    tags: list[str]


def tools_for(receiver: EffectRecorder) -> list[BaseTool]:
    @tool
    def greet(city: str) -> dict[str, Any]:
        """A read with a non-ASCII, typed result."""
        receiver.record("greet", city=city)
        return {"city": city, "greeting": "Grüße aus Zürich ✓"}

    @tool
    def blocks(order_id: str) -> list[dict[str, Any]]:
        """A read that returns content blocks."""
        receiver.record("blocks", order_id=order_id)
        return [{"type": "text", "text": f"Bestellung {order_id}: geliefert ✓"}]

    @tool
    def save_note(note: Note) -> str:
        """A write with a pydantic-typed argument."""
        receiver.record("save", model=type(note).__name__, title=note.title)
        return f"gespeichert: {note.title}"

    @tool
    def refund(order_id: str, amount: int) -> dict[str, Any]:
        """A money call."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return {"order_id": order_id, "status": "Rückerstattung ✓", "amount": amount}

    @tool
    def receipt(order_id: str) -> Receipt:
        """A read that returns a pydantic model."""
        receiver.record("receipt", order_id=order_id)
        return Receipt(order_id=order_id, note="Grüße", total=1200)

    return [greet, blocks, save_note, refund, receipt]


class Receipt(BaseModel):
    order_id: str
    note: str
    total: int


EFFECTS: dict[str, Row] = {
    "greet": read(),
    "blocks": read(),
    "save_note": write(),
    "refund": money("finance", subject="order_id"),
    "receipt": read(),
}


@pytest.fixture
def db(keyed_db: str) -> str:
    return keyed_db


def gated(tools: list[BaseTool], db: str, gates: list[EffectGate], **options: Any) -> GatedToolNode:
    node = gated_node(tools, {t.name: EFFECTS.get(t.name, read()) for t in tools}, db=db, **options)
    gates.append(node.gate)
    return node


def reads_and_writes() -> Script:
    return Script(
        [
            call("greet", city="Zürich"),
            call("blocks", order_id="1042"),
            call("receipt", order_id="1042"),
            call("save_note", note={"title": "Café", "tags": ["ü"]}),
            call("save_note", note={"title": "Café", "tags": ["ü"]}),  # the same write again: a replay
            say("Fertig."),
        ]
    )


def test_reads_and_writes_reach_the_model_as_a_plain_tool_node_gives_them(
    db: str, gates: list[EffectGate]
) -> None:
    """Non-ASCII text, content blocks and typed results are the ToolNode's ToolMessages, also for a
    write replayed from the store; a pydantic-typed argument reaches the tool as its model."""
    plain_receiver, receiver = EffectRecorder(), EffectRecorder()
    plain = run(ToolNode(tools_for(plain_receiver)), reads_and_writes())
    out = run(gated(tools_for(receiver), db, gates), reads_and_writes())

    assert seen(out) == seen(plain)
    assert seen(out)[0][1] == '{"city": "Zürich", "greeting": "Grüße aus Zürich ✓"}'
    assert seen(out)[1][1] == [{"type": "text", "text": "Bestellung 1042: geliefert ✓"}]
    assert seen(out)[2][1] == "order_id='1042' note='Grüße' total=1200"
    assert receiver.count("save", model="Note", title="Café") == 1  # the second is a replay
    assert plain_receiver.count("save", model="Note", title="Café") == 2
    assert receiver.count("greet") == 1
    assert receiver.count("blocks") == 1


def grant_token(gate: EffectGate, out: Any) -> tuple[str, str]:
    [pause] = out.interrupts
    [request] = pause.value["requests"]
    grant = gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    return request["approval_id"], grant.token


def refund_script() -> Script:
    return Script([call("refund", order_id="1042", amount=500), say("Erstattet.")])


def test_an_executed_gated_call_reaches_the_model_as_a_plain_tool_node_gives_it(
    db: str, gates: list[EffectGate]
) -> None:
    """The approved refund runs once, and its ToolMessage is the plain ToolNode's, with the gate's
    record in its artifact."""
    plain = run(ToolNode(tools_for(EffectRecorder())), refund_script())
    receiver = EffectRecorder()
    node = gated(tools_for(receiver), db, gates)
    talk = Talk(node, refund_script())
    out = talk.invoke()
    assert receiver.count("refund") == 0
    approval_id, token = grant_token(node.gate, out)
    done = talk.invoke(Command(resume={approval_id: approve(token)}))
    assert receiver.count("refund", order_id="1042", amount=500) == 1
    assert seen(done) == seen(plain)
    [message] = [m for m in done.value["messages"] if isinstance(m, ToolMessage)]
    assert message.artifact[ARTIFACT_KEY]["outcome"] == "executed"
    talk.model.assert_complete()


def test_create_agent_gives_the_model_what_a_plain_agent_gives_it(db: str, gates: list[EffectGate]) -> None:
    """With `gated_middleware`, create_agent's ToolMessages are those of the same agent without
    the gate: non-ASCII kept, content blocks and typed results as langchain formats them."""
    plain_agent = create_agent(
        ScriptedChatModel(script=reads_and_writes()),
        tools=tools_for(EffectRecorder()),
        checkpointer=InMemorySaver(),
    )
    receiver = EffectRecorder()
    tools = tools_for(receiver)
    middleware = gated_middleware(tools, {t.name: EFFECTS[t.name] for t in tools}, db=db)
    gates.append(middleware.gate)
    agent = create_agent(
        ScriptedChatModel(script=reads_and_writes()), middleware=[middleware], checkpointer=InMemorySaver()
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    plain = plain_agent.invoke(ask(), cfg, context=CONTEXT, version="v2")
    out = agent.invoke(ask(), cfg, context=CONTEXT, version="v2")
    assert seen(out) == seen(plain)
    assert receiver.count("save", model="Note", title="Café") == 1
