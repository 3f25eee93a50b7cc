"""Injected arguments through the gated node and the middleware, as under a plain ToolNode:
`InjectedState` (whole and a field), `InjectedStore`, `ToolRuntime` and `InjectedToolCallId` are
supplied by the framework when the call runs, a value the model sends for one never reaches the
tool, and none of them is validated, hashed, approved or stored. A read's `Command` goes to the
graph; a write or gated row's is refused when the node is built.

Effects are counted at the receiver (what the tool received), on SQLite and PostgreSQL stores."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, cast

import pytest
from langchain.agents import AgentState, create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, InjectedStore, ToolNode, ToolRuntime, tools_condition
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command, GraphOutput

from effectgate import Approver, EffectGate, Grant, Row, money, read, write
from effectgate.canonical import args_hash
from effectgate.errors import TableError
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import (
    GatedToolNode,
    InvalidToolArguments,
    approve,
    gated_middleware,
    gated_node,
    native_tool,
    resume,
)
from effectgate_langgraph.testing import ScriptedChatModel

# langchain's own parsing of a ToolRuntime argument warns so under a plain ToolNode too.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

FIONA = Approver("fiona", "finance")
CONTEXT = {"user_id": "u1"}
CFG: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
ROWS: dict[str, Callable[[], Row]] = {
    "read": read,
    "write": write,
    "money": lambda: money("finance", subject="order_id"),
}
#: What a model might send for every injected key: none of it may reach the tool or the gate.
FORGED: dict[str, Any] = {
    "state": {"customer": "mallory", "forged": True},
    "customer": "mallory",
    "store": "forged",
    "runtime": "forged",
    "tool_call_id": "forged-id",
}
MODEL_ARGS = {"order_id": "1042"}


class ShopState(MessagesState):
    customer: str


class ShopAgentState(AgentState[Any]):
    customer: str


def inspect_order(receiver: EffectRecorder, *, is_async: bool = False) -> BaseTool:
    """A tool taking every kind of injected argument; it records what it received."""

    def body(
        order_id: str,
        state: Annotated[dict[str, Any], InjectedState],
        customer: Annotated[str, InjectedState("customer")],
        store: Annotated[BaseStore, InjectedStore()],
        runtime: ToolRuntime,
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        item = store.get(("orders",), order_id)
        receiver.record(
            "inspect",
            order_id=order_id,
            state_customer=state.get("customer"),
            forged_state="forged" in state,
            customer=customer,
            note=item.value["note"] if item is not None else None,
            runtime_call_id=runtime.tool_call_id,
            runtime_user=cast("dict[str, str]", runtime.context)["user_id"],
            runtime_messages=len(runtime.state["messages"]),
            tool_call_id=tool_call_id,
        )
        return f"inspected {order_id} for {customer}"

    async def abody(
        order_id: str,
        state: Annotated[dict[str, Any], InjectedState],
        customer: Annotated[str, InjectedState("customer")],
        store: Annotated[BaseStore, InjectedStore()],
        runtime: ToolRuntime,
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        await asyncio.sleep(0)
        return body(order_id, state, customer, store, runtime, tool_call_id)

    if is_async:
        return StructuredTool.from_function(
            coroutine=abody, name="inspect_order", description="Inspect an order."
        )
    return StructuredTool.from_function(body, name="inspect_order", description="Inspect an order.")


def shop_store() -> InMemoryStore:
    store = InMemoryStore()
    store.put(("orders",), "1042", {"note": "fragile"})
    return store


def state_graph(node: GatedToolNode, model: ScriptedChatModel) -> Any:
    """The classic loop on a state with a `customer` field, compiled with a store."""

    def agent(state: ShopState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: ShopState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(ShopState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver(), store=shop_store())


Surface = Literal["node", "agent"]


def build(
    surface: Surface, tools: list[BaseTool], rows: dict[str, Row], model: ScriptedChatModel, db: str
) -> tuple[Any, EffectGate]:
    """The hand-built graph with `gated_node`, or `create_agent` with `gated_middleware`."""
    if surface == "node":
        node = gated_node(tools, rows, db=db)
        return state_graph(node, model), node.gate
    middleware = gated_middleware(tools, rows, db=db)
    agent = create_agent(
        model,
        middleware=[middleware],
        state_schema=ShopAgentState,
        checkpointer=InMemorySaver(),
        store=shop_store(),
    )
    return agent, middleware.gate


def ask() -> dict[str, Any]:
    return {"messages": [HumanMessage("inspect 1042", id="m1")], "customer": "ada"}


def drive(graph: Any, value: Any, *, is_async: bool) -> GraphOutput[Any]:
    out: GraphOutput[Any] = (
        asyncio.run(graph.ainvoke(value, CFG, context=CONTEXT, version="v2"))
        if is_async
        else graph.invoke(value, CFG, context=CONTEXT, version="v2")
    )
    return out


def received(receiver: EffectRecorder) -> dict[str, Any]:
    [effect] = receiver.effects
    return dict(effect.payload)


def expected(call_id: str) -> dict[str, Any]:
    """What the tool must receive: the framework's values, none of the model's."""
    return {
        "order_id": "1042",
        "state_customer": "ada",
        "forged_state": False,
        "customer": "ada",
        "note": "fragile",
        "runtime_call_id": call_id,
        "runtime_user": "u1",
        "runtime_messages": 2,  # the user's message and the model's call: the state at the run
        "tool_call_id": call_id,
    }


def messages(out: GraphOutput[Any]) -> dict[str, ToolMessage]:
    return {str(m.name): m for m in out.value["messages"] if isinstance(m, ToolMessage)}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("surface", ["node", "agent"])
@pytest.mark.parametrize("effect", ["read", "write", "money"])
def test_injected_values_come_from_the_framework_and_are_never_the_approved_args(
    effect: str, surface: Surface, is_async: bool, keyed_db: str, gates: list[EffectGate]
) -> None:
    """A model that sends values for every injected key: the tool receives the graph's state, a
    state field, the graph's store, its ToolRuntime and its tool call id, once; a write's record
    and a money call's approval, card and execution hold and hash only the model's arguments."""
    receiver = EffectRecorder()
    script = Script([call("inspect_order", id="c-1", **MODEL_ARGS, **FORGED), say("Done.")])
    model = ScriptedChatModel(script=script)
    graph, gate = build(
        surface,
        [inspect_order(receiver, is_async=is_async)],
        {"inspect_order": ROWS[effect]()},
        model,
        keyed_db,
    )
    gates.append(gate)
    out = drive(graph, ask(), is_async=is_async)
    if effect == "money":
        assert receiver.effects == []
        [pause] = out.interrupts
        [request] = pause.value["requests"]
        assert request["card"]["args"] == MODEL_ARGS
        assert request["args_hash"] == args_hash("inspect_order", MODEL_ARGS)
        [approval] = gate.store.approvals()
        assert json.loads(approval.args_json) == MODEL_ARGS
        assert approval.args_hash == args_hash("inspect_order", MODEL_ARGS)
        grant = gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
        assert isinstance(grant, Grant)
        out = drive(
            graph, resume({request["approval_id"]: approve(grant.token)}, out.interrupts), is_async=is_async
        )
    assert out.interrupts == ()
    assert received(receiver) == expected("c-1")
    assert messages(out)["inspect_order"].content == "inspected 1042 for ada"
    executions = gate.store.executions(tool="inspect_order")
    if effect == "read":
        assert executions == []
    else:
        [execution] = executions
        assert json.loads(execution.args_json) == MODEL_ARGS
        assert execution.args_hash == args_hash("inspect_order", MODEL_ARGS)
    model.assert_complete()


def test_the_tool_receives_what_a_plain_toolnode_gives_it(tmp_path: Any, gates: list[EffectGate]) -> None:
    """The same script on a plain ToolNode and on `gated_node`: the tool receives the same values."""
    plain = EffectRecorder()

    def script() -> Script:
        return Script([call("inspect_order", id="c-1", **MODEL_ARGS, **FORGED), say("Done.")])

    builder = StateGraph(ShopState)
    first = ScriptedChatModel(script=script())
    builder.add_node("agent", lambda s: {"messages": [first.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode([inspect_order(plain)]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    drive(builder.compile(checkpointer=InMemorySaver(), store=shop_store()), ask(), is_async=False)
    gated = EffectRecorder()
    second = ScriptedChatModel(script=script())
    node = gated_node([inspect_order(gated)], {"inspect_order": read()}, db=f"sqlite:///{tmp_path}/e.db")
    gates.append(node.gate)
    drive(state_graph(node, second), ask(), is_async=False)
    assert received(gated) == received(plain) == expected("c-1")


INJECTED_KINDS: dict[str, tuple[str, Callable[[EffectRecorder], BaseTool]]] = {}


def _kind(name: str, key: str) -> Callable[[Callable[[EffectRecorder], BaseTool]], Any]:
    def register(make: Callable[[EffectRecorder], BaseTool]) -> Any:
        INJECTED_KINDS[name] = (key, make)
        return make

    return register


@_kind("whole state", "state")
def _whole_state(receiver: EffectRecorder) -> BaseTool:
    @tool
    def lookup(order_id: str, state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Look up an order."""
        receiver.record("lookup", got=sorted(state))
        return "ok"

    return lookup


@_kind("state field", "customer")
def _state_field(receiver: EffectRecorder) -> BaseTool:
    @tool
    def lookup(order_id: str, customer: Annotated[str, InjectedState("customer")]) -> str:
        """Look up an order."""
        receiver.record("lookup", got=customer)
        return "ok"

    return lookup


@_kind("store", "store")
def _store(receiver: EffectRecorder) -> BaseTool:
    @tool
    def lookup(order_id: str, store: Annotated[BaseStore, InjectedStore()]) -> str:
        """Look up an order."""
        item = store.get(("orders",), order_id)
        receiver.record("lookup", got=item.value if item is not None else None)
        return "ok"

    return lookup


@_kind("runtime", "runtime")
def _runtime(receiver: EffectRecorder) -> BaseTool:
    @tool
    def lookup(order_id: str, runtime: ToolRuntime) -> str:
        """Look up an order."""
        receiver.record("lookup", got=(runtime.tool_call_id, runtime.state["customer"]))
        return "ok"

    return lookup


@_kind("tool call id", "tool_call_id")
def _tool_call_id(receiver: EffectRecorder) -> BaseTool:
    @tool
    def lookup(order_id: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Look up an order."""
        receiver.record("lookup", got=tool_call_id)
        return "ok"

    return lookup


KIND_VALUES: dict[str, Any] = {
    "whole state": ["customer", "messages"],
    "state field": "ada",
    "store": {"note": "fragile"},
    "runtime": ("c-7", "ada"),
    "tool call id": "c-7",
}


@pytest.mark.parametrize("kind", list(INJECTED_KINDS))
def test_each_injection_kind_alone_is_hidden_from_the_model_and_supplied_by_the_graph(
    kind: str, tmp_path: Any, gates: list[EffectGate]
) -> None:
    """Each kind on its own: the gate's schema is the one the model is shown (without the key),
    and a write receives the graph's value, not the one the model sent."""
    key, make = INJECTED_KINDS[kind]
    receiver = EffectRecorder()
    lookup = make(receiver)
    model = ScriptedChatModel(
        script=Script([call("lookup", id="c-7", order_id="1042", **{key: FORGED[key]}), say("Done.")])
    )
    node = gated_node([lookup], {"lookup": write()}, db=f"sqlite:///{tmp_path}/e.db")
    gates.append(node.gate)
    schema = dict(node.gate.table["lookup"].schema or {})
    assert key not in schema["properties"]
    assert schema == convert_to_openai_tool(lookup)["function"]["parameters"]
    out = drive(state_graph(node, model), ask(), is_async=False)
    assert out.interrupts == ()
    assert receiver.count("lookup", got=KIND_VALUES[kind]) == 1
    assert receiver.count() == 1
    [execution] = node.gate.store.executions(tool="lookup")
    assert json.loads(execution.args_json) == MODEL_ARGS


def test_injected_values_are_read_when_the_call_runs_not_when_it_was_approved(
    tmp_path: Any, gates: list[EffectGate]
) -> None:
    """The state changes while a money call waits: on resume the tool receives the state of that
    re-run (as ToolNode's re-run would give it), and the approval is the model's arguments."""
    receiver = EffectRecorder()
    model = ScriptedChatModel(script=Script([call("inspect_order", id="c-1", order_id="1042"), say("Done.")]))
    node = gated_node(
        [inspect_order(receiver)], {"inspect_order": ROWS["money"]()}, db=f"sqlite:///{tmp_path}/e.db"
    )
    gates.append(node.gate)
    graph = state_graph(node, model)
    out = drive(graph, ask(), is_async=False)
    [request] = out.interrupts[0].value["requests"]
    graph.update_state(CFG, {"customer": "bob"})
    grant = node.gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    out = drive(graph, Command(resume={request["approval_id"]: approve(grant.token)}), is_async=False)
    assert out.interrupts == ()
    assert received(receiver) == {**expected("c-1"), "customer": "bob", "state_customer": "bob"}
    [approval] = node.gate.store.approvals()
    assert json.loads(approval.args_json) == MODEL_ARGS
    model.assert_complete()


def test_an_edit_cannot_set_an_injected_value(tmp_path: Any, gates: list[EffectGate]) -> None:
    """A reviewer's edit that names an injected key: the key is dropped from the new version, and
    the tool still receives the graph's value."""
    receiver = EffectRecorder()
    model = ScriptedChatModel(script=Script([call("inspect_order", id="c-1", order_id="1042"), say("Done.")]))
    node = gated_node(
        [inspect_order(receiver)], {"inspect_order": ROWS["money"]()}, db=f"sqlite:///{tmp_path}/e.db"
    )
    gates.append(node.gate)
    graph = state_graph(node, model)
    out = drive(graph, ask(), is_async=False)
    [request] = out.interrupts[0].value["requests"]
    edited = {"type": "edit", "args": {**MODEL_ARGS, "customer": "mallory"}}
    out = drive(graph, resume({request["approval_id"]: edited}, out.interrupts), is_async=False)
    [request] = out.interrupts[0].value["requests"]
    assert request["card"]["args"] == MODEL_ARGS
    grant = node.gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    out = drive(graph, resume({request["approval_id"]: approve(grant.token)}, out.interrupts), is_async=False)
    assert receiver.count("inspect", customer="ada") == 1
    assert receiver.count() == 1


def test_a_tool_with_injected_arguments_does_not_run_outside_the_graph() -> None:
    """Called with no graph around it (a script, `effectgate approve --execute`), a tool that
    needs injected values is refused before it runs: a definite failure, never a guess."""
    receiver = EffectRecorder()
    run = native_tool(inspect_order(receiver)).fn
    with pytest.raises(InvalidToolArguments, match="runs only inside the gated node or middleware"):
        run(order_id="1042", state={"customer": "mallory"})
    assert receiver.effects == []


@pytest.mark.parametrize("surface", ["node", "agent"])
@pytest.mark.parametrize("effect", ["read", "write"])
def test_a_missing_graph_store_raises_as_under_toolnode(
    effect: str, surface: Surface, tmp_path: Any, gates: list[EffectGate]
) -> None:
    """A graph compiled without a store cannot inject one: ToolNode's own ValueError, raised
    before the tool runs (as ToolNode raises it, whatever `handle_tool_errors` says); a write is
    recorded as a failure (nothing ran), never as an unknown outcome."""
    receiver = EffectRecorder()
    model = ScriptedChatModel(script=Script([call("lookup", order_id="1042"), say("Done.")]))
    db = f"sqlite:///{tmp_path}/e.db"
    graph: Any
    if surface == "node":
        node = gated_node([_store(receiver)], {"lookup": ROWS[effect]()}, db=db, handle_tool_errors=True)
        gate = node.gate
        builder = StateGraph(ShopState)
        builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        builder.add_node("tools", node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        graph = builder.compile(checkpointer=InMemorySaver())
    else:
        middleware = gated_middleware([_store(receiver)], {"lookup": ROWS[effect]()}, db=db)
        gate = middleware.gate
        graph = create_agent(
            model, middleware=[middleware], state_schema=ShopAgentState, checkpointer=InMemorySaver()
        )
    gates.append(gate)
    with pytest.raises(ValueError, match="compile your graph with a store"):
        drive(graph, ask(), is_async=False)
    assert receiver.effects == []
    failed = ["failed"] if effect == "write" else []
    assert [e.status for e in gate.store.executions(tool="lookup")] == failed
    assert gate.store.idempotency_records(status="needs_reconciliation") == []


# -- Command results


def set_customer(receiver: EffectRecorder) -> BaseTool:
    @tool
    def switch_customer(name: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand the conversation to another customer record (a state update)."""
        receiver.record("switch", name=name)
        done = ToolMessage(f"now serving {name}", tool_call_id=tool_call_id)
        return Command(update={"customer": name, "messages": [done]})

    return switch_customer


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("surface", ["node", "agent"])
def test_a_reads_command_goes_to_the_graph_as_under_toolnode(
    surface: Surface, is_async: bool, tmp_path: Any, gates: list[EffectGate]
) -> None:
    """A read whose tool returns a Command (a state update, as handoff tools do) updates the graph
    as ToolNode would: the state field changes and its own ToolMessage answers the call."""
    receiver = EffectRecorder()
    model = ScriptedChatModel(script=Script([call("switch_customer", id="c-2", name="bob"), say("Hi Bob.")]))
    graph, gate = build(
        surface, [set_customer(receiver)], {"switch_customer": read()}, model, f"sqlite:///{tmp_path}/e.db"
    )
    gates.append(gate)
    out = drive(graph, ask(), is_async=is_async)
    assert out.value["customer"] == "bob"
    answer = messages(out)["switch_customer"]
    assert answer.content == "now serving bob"
    assert answer.tool_call_id == "c-2"
    assert isinstance(out.value["messages"][-1], AIMessage)
    assert receiver.count("switch", name="bob") == 1
    model.assert_complete()


def test_a_reads_command_without_its_tool_message_fails_as_under_toolnode(
    tmp_path: Any, gates: list[EffectGate]
) -> None:
    """ToolNode's own check of a Command applies: one without a ToolMessage for the call is an
    error, as it is for a plain ToolNode."""

    @tool
    def jump(name: str) -> Command[Any]:
        """Set the customer without answering the call."""
        return Command(update={"customer": name})

    model = ScriptedChatModel(script=Script([call("jump", name="bob"), say("Hi.")]))
    node = gated_node([jump], {"jump": read()}, db=f"sqlite:///{tmp_path}/e.db", handle_tool_errors=True)
    gates.append(node.gate)
    out = drive(state_graph(node, model), ask(), is_async=False)
    message = messages(out)["jump"]
    assert message.status == "error"
    assert "Expected to have a matching ToolMessage" in str(message.content)
    assert out.value["customer"] == "ada"


@pytest.mark.parametrize("effect", ["write", "money"])
def test_a_command_from_a_write_or_gated_row_is_refused_with_the_reason(effect: str, tmp_path: Any) -> None:
    """A write or gated tool declared to return a Command is refused when the node or middleware
    is built: a stored result must replay identically, and a Command is not one."""
    rows = {"switch_customer": ROWS[effect]()}
    tools = [set_customer(EffectRecorder())]
    for build_one in (gated_node, gated_middleware):
        with pytest.raises(TableError, match="must replay identically"):
            build_one(tools, rows, db=f"sqlite:///{tmp_path}/e.db")


def test_a_reads_command_can_jump_as_under_toolnode(tmp_path: Any, gates: list[EffectGate]) -> None:
    """A read's `Command(goto=...)` routes the graph, as a handoff tool does under ToolNode."""
    receiver = EffectRecorder()

    @tool
    def escalate(reason: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand the conversation to a person."""
        answer = ToolMessage("handed to a person", tool_call_id=tool_call_id)
        return Command(goto="human", update={"messages": [answer]})

    def human(state: ShopState) -> dict[str, Any]:
        receiver.record("human", last=state["messages"][-1].content)
        return {}

    model = ScriptedChatModel(script=Script([call("escalate", reason="angry")]))
    node = gated_node([escalate], {"escalate": read()}, db=f"sqlite:///{tmp_path}/e.db")
    gates.append(node.gate)
    builder = StateGraph(ShopState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", node, destinations=("human",))
    builder.add_node("human", human)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    out = drive(builder.compile(checkpointer=InMemorySaver()), ask(), is_async=False)
    assert receiver.count("human", last="handed to a person") == 1
    assert messages(out)["escalate"].content == "handed to a person"
    model.assert_complete()
