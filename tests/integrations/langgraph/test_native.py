"""Native langchain tools in: gate `@tool` functions, a `BaseTool` subclass and a `StructuredTool`
as they are, by naming each one's effect (`gated_node`, `gated_middleware`)."""

from __future__ import annotations

import asyncio
import enum
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, GraphOutput
from pydantic import BaseModel, ConfigDict, Field, field_validator

from effectgate import Approver, EffectGate, Grant, Row, money, read, write
from effectgate.errors import TableError
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import (
    ARTIFACT_KEY,
    GatedToolNode,
    InvalidToolArguments,
    approve,
    gated_middleware,
    gated_node,
    native_tool,
    resume,
)
from effectgate_langgraph.testing import ScriptedChatModel
from tests.integrations.langgraph._graph import shop_graph

FIONA = Approver("fiona", "finance")
CONTEXT = {"user_id": "u1"}
CFG: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
EFFECTS: dict[str, Row] = {
    "get_order": read(),
    "refund_order": money("finance", subject="order_id"),
    "add_note": write(),
}


class Currency(enum.Enum):
    GBP = "GBP"
    EUR = "EUR"


class RefundArgs(BaseModel):
    order_id: str = Field(description="The order to refund.")
    amount: int = Field(gt=0, description="Amount in minor units.")
    currency: Currency = Currency.GBP

    @field_validator("order_id")
    @classmethod
    def known(cls, value: str) -> str:
        if value == "9999":  # a check the JSON schema cannot express
            raise ValueError("no such order")
        return value


class RefundOrder(BaseTool):
    """A class-based tool with a typed pydantic schema; its effect lands at `receiver`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = "refund_order"
    description: str = "Refund part or all of an order."
    args_schema: type[BaseModel] = RefundArgs
    receiver: EffectRecorder

    def _run(self, order_id: str, amount: int, currency: Currency) -> dict[str, Any]:
        self.receiver.record("refund", order_id=order_id, amount=amount, currency=currency)
        return {"refunded": amount, "currency": currency.value}


def shop_tools(receiver: EffectRecorder) -> list[BaseTool]:
    """A `@tool` function, a `BaseTool` subclass and a `StructuredTool.from_function`."""

    @tool
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order's status and total."""
        receiver.record("get_order", order_id=order_id)
        return {"order_id": order_id, "status": "delivered", "total": 12000}

    def note(order_id: str, text: str) -> str:
        receiver.record("note", order_id=order_id, text=text)
        return "noted"

    add_note = StructuredTool.from_function(note, name="add_note", description="Add a note to an order.")
    return [get_order, RefundOrder(receiver=receiver), add_note]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def graph_of(
    tools: GatedToolNode, model: ScriptedChatModel, checkpointer: BaseCheckpointSaver[Any]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The classic loop, with the gated node where a ToolNode would go."""
    return shop_graph(tools.gate, model, checkpointer=checkpointer, node=tools)


def refund_script() -> Script:
    return Script(
        [
            call("get_order", order_id="1042"),
            call("refund_order", order_id="1042", amount=1200, currency="EUR"),
            call("add_note", order_id="1042", text="refunded 12.00 EUR"),
            say("Refunded."),
        ]
    )


def grant_for(gate: EffectGate, out: GraphOutput[Any]) -> tuple[str, str]:
    """Approve the one waiting request as finance; its approval id and grant token."""
    [pause] = out.interrupts
    [request] = pause.value["requests"]
    grant = gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    return request["approval_id"], grant.token


def invoke(graph: Any, value: Any) -> GraphOutput[Any]:
    """One run of the conversation (thread s-ada, user u1)."""
    out: GraphOutput[Any] = graph.invoke(value, CFG, context=CONTEXT, version="v2")
    return out


def ask(text: str) -> dict[str, list[HumanMessage]]:
    return {"messages": [HumanMessage(text, id="m3")]}


def tool_messages(out: GraphOutput[Any]) -> dict[str, ToolMessage]:
    return {str(m.name): m for m in out.value["messages"] if isinstance(m, ToolMessage)}


def test_three_lines_gate_existing_tools_in_a_state_graph(
    db: str, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """With the tools as they are and one row each, the read runs, the refund pauses, and once
    approved and resumed it runs exactly once with the arguments its pydantic schema parses."""
    receiver = EffectRecorder()
    get_order, refund_order, add_note = shop_tools(receiver)
    tools = gated_node(
        [get_order, refund_order, add_note],
        {"get_order": read(), "refund_order": money("finance", subject="order_id"), "add_note": write()},
        db=db,
    )
    gates.append(tools.gate)
    model = ScriptedChatModel(script=refund_script())
    graph = graph_of(tools, model, checkpointer)
    out = invoke(graph, ask("refund 1042"))
    assert receiver.count("get_order") == 1
    assert receiver.count("refund") == 0
    approval_id, token = grant_for(tools.gate, out)

    done = invoke(graph, Command(resume={approval_id: approve(token)}))
    assert done.interrupts == ()
    assert receiver.count("refund") == 1
    assert receiver.count("refund", order_id="1042", amount=1200, currency=Currency.EUR) == 1
    assert receiver.count("note") == 1
    assert receiver.count("get_order") == 1
    results = tool_messages(done)
    assert results["refund_order"].artifact[ARTIFACT_KEY]["outcome"] == "executed"
    assert results["refund_order"].content == '{"refunded": 1200, "currency": "EUR"}'
    model.assert_complete()


def test_gated_middleware_gates_existing_tools_in_create_agent(
    db: str, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """On create_agent the middleware registers the tools and gates them: the refund pauses and
    runs once after approval; the read and the write run once."""
    receiver = EffectRecorder()
    middleware = gated_middleware(shop_tools(receiver), EFFECTS, db=db)
    gates.append(middleware.gate)
    model = ScriptedChatModel(script=refund_script())
    agent = create_agent(model, middleware=[middleware], checkpointer=checkpointer)
    out = invoke(agent, ask("refund 1042"))
    approval_id, token = grant_for(middleware.gate, out)
    assert receiver.count("refund") == 0
    done = invoke(agent, resume({approval_id: approve(token)}, out.interrupts))
    assert done.interrupts == ()
    assert receiver.count("refund", currency=Currency.EUR) == 1
    assert receiver.count("get_order") == 1
    assert receiver.count("note") == 1
    model.assert_complete()


def test_the_schema_the_model_is_shown_is_the_tools_own(db: str, gates: list[EffectGate]) -> None:
    """The node and the middleware offer the very tool objects given, and the gate validates with
    the JSON schema langchain shows the model for each (no `self`, the enum kept)."""
    tools = shop_tools(EffectRecorder())
    node = gated_node(tools, EFFECTS, db=db)
    middleware = gated_middleware(tools, EFFECTS, db=db)
    gates += [node.gate, middleware.gate]
    assert middleware.tools == tools
    for t in tools:
        shown = convert_to_openai_tool(t)["function"]["parameters"]
        assert node.tools_by_name[t.name] is t
        assert dict(node.gate.table[t.name].schema or {}) == shown
        assert dict(middleware.gate.table[t.name].schema or {}) == shown
        assert node.gate.table[t.name].description == t.description
    refund = node.gate.table["refund_order"].schema or {}
    assert "self" not in refund["properties"]
    assert refund["properties"]["currency"]["enum"] == ["GBP", "EUR"]


def test_a_tool_without_a_row_is_refused_at_build_time(db: str) -> None:
    """A tool given without an effect row is a TableError when the node or middleware is built."""
    tools = shop_tools(EffectRecorder())
    rows = {k: v for k, v in EFFECTS.items() if k != "refund_order"}
    with pytest.raises(TableError, match="no effect row for 'refund_order'"):
        gated_node(tools, rows, db=db)
    with pytest.raises(TableError, match="no effect row for 'refund_order'"):
        gated_middleware(tools, rows, db=db)


def test_a_row_without_a_tool_is_refused_at_build_time(db: str) -> None:
    """An effect row naming no tool given (a typo, a forgotten tool) is a TableError at build time."""
    tools = shop_tools(EffectRecorder())
    rows = {**EFFECTS, "refund_ordr": money("finance")}
    with pytest.raises(TableError, match="names no tool"):
        gated_node(tools, rows, db=db)
    with pytest.raises(TableError, match="names no tool"):
        gated_middleware(tools, rows, db=db)


def test_the_default_store_is_the_sqlite_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gates: list[EffectGate]
) -> None:
    """Without `db=` the gate opens (and sets up) `effectgate.db` in the working directory, its key
    file beside it."""
    monkeypatch.chdir(tmp_path)
    node = gated_node(shop_tools(EffectRecorder()), EFFECTS)
    gates.append(node.gate)
    assert (tmp_path / "effectgate.db").is_file()
    assert (tmp_path / "effectgate.db.keys").is_file()


def test_a_bad_argument_is_rejected_by_the_tools_own_schema_before_approval(
    db: str, gates: list[EffectGate]
) -> None:
    """An amount the tool's schema forbids (gt=0) is refused before any approval, and nothing runs."""
    receiver = EffectRecorder()
    tools = gated_node(shop_tools(receiver), EFFECTS, db=db)
    gates.append(tools.gate)
    model = ScriptedChatModel(
        script=Script([call("refund_order", order_id="1042", amount=0, currency="GBP"), say("Sorry.")])
    )
    graph = graph_of(tools, model, InMemorySaver())
    out = invoke(graph, ask("refund 0"))
    assert out.interrupts == ()
    assert tool_messages(out)["refund_order"].artifact[ARTIFACT_KEY]["outcome"] == "invalid"
    assert tools.gate.store.approvals() == []
    assert receiver.effects == []
    model.assert_complete()


def test_arguments_the_tools_model_refuses_are_a_definite_failure(db: str, gates: list[EffectGate]) -> None:
    """A validator the JSON schema cannot express refuses the approved call before the tool runs:
    recorded as a failure (nothing ran), not an unknown outcome, and the model is told."""
    receiver = EffectRecorder()
    tools = gated_node(shop_tools(receiver), EFFECTS, db=db, handle_tool_errors=True)
    gates.append(tools.gate)
    model = ScriptedChatModel(
        script=Script([call("refund_order", order_id="9999", amount=100, currency="GBP"), say("Sorry.")])
    )
    graph = graph_of(tools, model, InMemorySaver())
    out = invoke(graph, ask("refund 9999"))
    approval_id, token = grant_for(tools.gate, out)
    done = invoke(graph, Command(resume={approval_id: approve(token)}))
    assert receiver.effects == []
    message = tool_messages(done)["refund_order"]
    assert message.status == "error"
    assert "no such order" in str(message.content)
    assert tools.gate.store.idempotency_records(status="needs_reconciliation") == []
    assert [e.status for e in tools.gate.store.executions(tool="refund_order")] == ["failed"]
    assert InvalidToolArguments in tools.gate.table["refund_order"].definite_failures


def test_an_async_only_tool_is_awaited_under_ainvoke(db: str, gates: list[EffectGate]) -> None:
    """A StructuredTool with only a coroutine pauses, and once approved runs once, on an async graph."""
    receiver = EffectRecorder()

    async def send_refund(order_id: str, amount: int) -> str:
        await asyncio.sleep(0)
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    refund = StructuredTool.from_function(
        coroutine=send_refund, name="refund_order", description="Refund an order."
    )
    tools = gated_node([refund], {"refund_order": money("finance", subject="order_id")}, db=db)
    gates.append(tools.gate)
    model = ScriptedChatModel(
        script=Script([call("refund_order", order_id="1042", amount=500), say("Refunded.")])
    )
    graph = graph_of(tools, model, InMemorySaver())

    async def run() -> GraphOutput[Any]:
        out = await graph.ainvoke(ask("refund 1042"), CFG, context=CONTEXT, version="v2")
        approval_id, token = grant_for(tools.gate, out)
        assert receiver.effects == []
        answer: Command[Any] = Command(resume={approval_id: approve(token)})
        done: GraphOutput[Any] = await graph.ainvoke(answer, CFG, context=CONTEXT, version="v2")
        return done

    done = asyncio.run(run())
    assert receiver.count("refund", order_id="1042", amount=500) == 1
    assert tool_messages(done)["refund_order"].content == "refunded 500"
    model.assert_complete()


def test_a_tool_declared_to_return_a_command_is_refused_unless_a_read(
    db: str, gates: list[EffectGate]
) -> None:
    """A state update is not a result the gate can store and replay: refused for a write or a
    gated row when the node is built; a read's Command goes to the graph (test_injection.py)."""

    @tool
    def jump(order_id: str) -> Command[Any]:
        """Moves the graph."""
        return Command(goto="agent")

    with pytest.raises(TableError, match="returns a Command and its row is a write"):
        gated_node([jump], {"jump": write()}, db=db)
    node = gated_node([jump], {"jump": read()}, db=db)
    gates.append(node.gate)
    assert native_tool(jump).name == "jump"


def test_content_and_artifact_gives_the_content() -> None:
    """A content-and-artifact tool's result is its content; the artifact never reached the model."""

    @tool(response_format="content_and_artifact")
    def lookup(order_id: str) -> tuple[str, dict[str, Any]]:
        """Look up an order."""
        return f"Order {order_id} ships today.", {"raw": [1, 2, 3]}

    assert native_tool(lookup).fn(order_id="1042") == "Order 1042 ships today."


def test_a_given_gate_must_hold_the_same_rows(db: str, gates: list[EffectGate]) -> None:
    """`gate=` reuses a gate built from the same tools and rows; a row that differs is a TableError."""
    tools = shop_tools(EffectRecorder())
    first = gated_node(tools, EFFECTS, db=db)
    gates.append(first.gate)
    again = gated_middleware(tools, EFFECTS, gate=first.gate)
    assert again.gate is first.gate
    with pytest.raises(TableError, match="differs"):
        gated_node(tools, {**EFFECTS, "refund_order": money("support", subject="order_id")}, gate=first.gate)


def test_a_plain_function_is_made_a_tool_as_toolnode_would(db: str, gates: list[EffectGate]) -> None:
    """A plain function among the tools becomes a langchain tool, its schema what `tool(fn)` shows,
    and the row's fingerprint names the function itself, not the adapter's runner."""

    def track_parcel(order_id: str) -> str:
        """Where the parcel is."""
        return f"{order_id}: out for delivery"

    node = gated_node([track_parcel], {"track_parcel": read()}, db=db)
    gates.append(node.gate)
    shown = convert_to_openai_tool(tool(track_parcel))["function"]["parameters"]
    spec = node.gate.table["track_parcel"]
    assert dict(spec.schema or {}) == shown
    assert spec.canonical()["fn"].endswith(
        "test_a_plain_function_is_made_a_tool_as_toolnode_would.<locals>.track_parcel"
    )
    assert spec.fn(order_id="1042") == "1042: out for delivery"
