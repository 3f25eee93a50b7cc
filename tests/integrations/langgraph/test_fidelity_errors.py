"""A gated node handles tool errors, fires callbacks and runs `wrap_tool_call` as a plain ToolNode
does: `handle_tool_errors` (bool, string, types, callables), a tool's own `handle_tool_error`,
`on_tool_start` / `on_tool_end` / `on_tool_error`, and the caller's interceptors around the gate.

Each scenario runs the same tools and script on a plain ToolNode and on `gated_node`; effects are
counted at the receiver, and a write keeps the gate's unknown-outcome record whatever the flag."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import BaseModel, field_validator

from effectgate import Approver, EffectGate, Grant, Row, money, read, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import GatedToolNode, approve, gated_node
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import ShopGate

from ._fidelity import CONTEXT, Talk, ToolEvents, run, seen
from ._graph import shop_graph

FIONA = Approver("fiona", "finance")


def tools_for(receiver: EffectRecorder) -> list[BaseTool]:
    @tool
    def explode(kind: str) -> str:
        """A read that fails."""
        receiver.record("explode", what=kind)
        if kind == "value":
            raise ValueError("kaputt ü")
        raise KeyError(kind)

    @tool
    def scribble(text: str) -> str:
        """A write whose outcome is unknown (a timeout: it may have written)."""
        receiver.record("scribble", text=text)
        raise TimeoutError("keine Antwort")

    def find(order_id: str) -> str:
        receiver.record("find", order_id=order_id)
        raise ToolException(f"Bestellung {order_id} nicht gefunden")

    careful = StructuredTool.from_function(
        find, name="careful", description="A read with its own error handler.", handle_tool_error=True
    )

    @tool
    def lookup(order_id: str) -> str:
        """A read."""
        receiver.record("lookup", order_id=order_id)
        return f"Bestellung {order_id}: unterwegs"

    @tool
    def note(text: str) -> str:
        """A write."""
        receiver.record("note", text=text)
        return f"notiert: {text}"

    @tool
    def refund(order_id: str, amount: int) -> str:
        """A money call."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"erstattet {amount}"

    def check(order_id: str) -> str:
        receiver.record("check", order_id=order_id)
        return f"Bestellung {order_id} ok"

    checked = StructuredTool.from_function(
        check,
        name="check",
        description="A read whose pydantic model refuses some ids.",
        args_schema=OrderArgs,
    )
    return [explode, scribble, careful, lookup, note, refund, checked]


class OrderArgs(BaseModel):
    order_id: str

    @field_validator("order_id")
    @classmethod
    def known(cls, value: str) -> str:
        if value == "9999":  # a check the JSON schema the model is shown cannot express
            raise ValueError("keine solche Bestellung")
        return value


EFFECTS: dict[str, Row] = {
    "explode": read(),
    "scribble": write(),
    "careful": read(),
    "lookup": read(),
    "note": write(),
    "refund": money("finance", subject="order_id"),
    "check": read(),
}


@pytest.fixture
def db(keyed_db: str) -> str:
    return keyed_db


def gated(receiver: EffectRecorder, db: str, gates: list[EffectGate], **options: Any) -> GatedToolNode:
    node = gated_node(tools_for(receiver), EFFECTS, db=db, **options)
    gates.append(node.gate)
    return node


def on_value(e: ValueError) -> str:
    return f"handled: {e}"


FLAGS: dict[str, Any] = {
    "default": None,
    "true": True,
    "text": "Etwas ging schief.",
    "type": ValueError,
    "types": (ValueError, TypeError),
    "typed-callable": on_value,
    "callable": lambda e: f"any: {e!r}",
}


def _outcome(make: Callable[[], Any]) -> Any:
    """What the model saw, or the type of the exception that failed the run."""
    try:
        return seen(make())
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("kind", ["value", "key"])
@pytest.mark.parametrize("flag", list(FLAGS))
def test_handle_tool_errors_on_a_read_is_the_tool_nodes(kind: str, flag: str, tmp_path: Any) -> None:
    """For every form of `handle_tool_errors`, a failing read gives the model the same error
    ToolMessage as a plain ToolNode, or fails the run with the same exception type."""
    options = {} if FLAGS[flag] is None else {"handle_tool_errors": FLAGS[flag]}

    def script() -> Script:
        return Script([call("explode", kind=kind), say("Oje.")])

    plain = _outcome(lambda: run(ToolNode(tools_for(EffectRecorder()), **options), script()))
    node = gated_node(tools_for(EffectRecorder()), EFFECTS, db=f"sqlite:///{tmp_path}/eg.db", **options)
    try:
        assert _outcome(lambda: run(node, script())) == plain
    finally:
        node.gate.close()


def test_a_failed_write_reads_as_in_tool_node_and_stays_for_reconciliation(
    db: str, gates: list[EffectGate]
) -> None:
    """A write that raised is shown to the model as ToolNode shows it; the gate still records its
    outcome as unknown, so the same write is not run again."""

    def script() -> Script:
        return Script([call("scribble", text="x"), call("scribble", text="x"), say("Oje.")])

    plain = run(ToolNode(tools_for(EffectRecorder()), handle_tool_errors=True), script())
    receiver = EffectRecorder()
    node = gated(receiver, db, gates, handle_tool_errors=True)
    out = run(node, script())
    first, second = seen(out)
    assert first == seen(plain)[0]
    assert first[1] == "Error: TimeoutError('keine Antwort')\n Please fix your mistakes."
    assert second[2] == "error"
    assert "needs_reconciliation" in str(second[1])
    assert receiver.count("scribble") == 1
    assert len(node.gate.store.idempotency_records(status="needs_reconciliation")) == 1


def test_a_tools_own_handle_tool_error_is_kept(db: str, gates: list[EffectGate]) -> None:
    """A tool's own `handle_tool_error` turns its ToolException into the same error ToolMessage."""

    def script() -> Script:
        return Script([call("careful", order_id="1042"), say("Oje.")])

    plain = run(ToolNode(tools_for(EffectRecorder())), script())
    out = run(gated(EffectRecorder(), db, gates), script())
    assert seen(out) == seen(plain) == [("careful", "Bestellung 1042 nicht gefunden", "error")]


def test_arguments_the_tools_model_refuses_read_as_in_tool_node(db: str, gates: list[EffectGate]) -> None:
    """Arguments the tool's pydantic model refuses are ToolNode's ToolInvocationError: under the
    default flag the model is told, as by a plain ToolNode, and the tool did not run."""

    def script() -> Script:
        return Script([call("check", order_id="9999"), say("Oje.")])

    plain = run(ToolNode(tools_for(EffectRecorder())), script())
    receiver = EffectRecorder()
    out = run(gated(receiver, db, gates), script())
    assert seen(out) == seen(plain)
    [(_, content, status)] = seen(out)
    assert status == "error"
    assert "keine solche Bestellung" in str(content)
    assert receiver.effects == []


def events_script() -> Script:
    return Script(
        [
            call("lookup", order_id="1042"),
            call("note", text="Grüße"),
            call("explode", kind="value"),
            say("ok"),
        ]
    )


def test_callbacks_fire_for_reads_and_writes_as_in_tool_node(db: str, gates: list[EffectGate]) -> None:
    """on_tool_start / on_tool_end / on_tool_error reach the config's callback handlers for the
    gated node's reads and writes as they do for a plain ToolNode."""
    plain_events, events = ToolEvents(), ToolEvents()
    run(ToolNode(tools_for(EffectRecorder()), handle_tool_errors=True), events_script(), [plain_events])
    run(gated(EffectRecorder(), db, gates, handle_tool_errors=True), events_script(), [events])
    assert events.events == plain_events.events
    assert [e[0] for e in events.events] == ["start", "end", "start", "end", "start", "error"]


def test_callbacks_fire_for_an_executed_gated_call(db: str, gates: list[EffectGate]) -> None:
    """An approved call fires its tool callbacks once, when it runs; the pause fires none."""

    def script() -> Script:
        return Script([call("refund", order_id="1042", amount=500), say("ok")])

    plain_events, events = ToolEvents(), ToolEvents()
    run(ToolNode(tools_for(EffectRecorder())), script(), [plain_events])
    receiver = EffectRecorder()
    node = gated(receiver, db, gates)
    talk = Talk(node, script(), [events])
    out = talk.invoke()
    assert events.events == []
    [pause] = out.interrupts
    [request] = pause.value["requests"]
    grant = node.gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    talk.invoke(Command(resume={request["approval_id"]: approve(grant.token)}))
    assert events.events == plain_events.events
    assert receiver.count("refund") == 1


def marking(
    request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
) -> ToolMessage | Command[Any]:
    """An interceptor: short-circuits `lookup`, marks every other result."""
    if request.tool_call["name"] == "lookup":
        return ToolMessage("aus dem Cache", tool_call_id=str(request.tool_call["id"]), name="lookup")
    result = execute(request)
    assert isinstance(result, ToolMessage)
    return result.model_copy(update={"content": f"{result.content} [geprüft]"})


async def amarking(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
    if request.tool_call["name"] == "lookup":
        return ToolMessage("aus dem Cache", tool_call_id=str(request.tool_call["id"]), name="lookup")
    result = await execute(request)
    return result.model_copy(update={"content": f"{result.content} [geprüft]"})


def test_wrap_tool_call_runs_around_the_gate_as_around_the_tool(db: str, gates: list[EffectGate]) -> None:
    """The caller's `wrap_tool_call` sees each request and the gate as its `execute`: a short
    circuit runs nothing, a marked result reaches the model, as on a plain ToolNode."""

    def script() -> Script:
        return Script([call("lookup", order_id="1042"), call("note", text="hallo"), say("ok")])

    plain_receiver, receiver = EffectRecorder(), EffectRecorder()
    plain = run(ToolNode(tools_for(plain_receiver), wrap_tool_call=marking), script())
    out = run(gated(receiver, db, gates, wrap_tool_call=marking), script())
    assert seen(out) == seen(plain)
    assert seen(out)[1] == ("note", "notiert: hallo [geprüft]", "success")
    assert receiver.effects == plain_receiver.effects
    assert receiver.count("lookup") == 0


def test_awrap_tool_call_runs_around_the_gate(db: str, gates: list[EffectGate]) -> None:
    """Under ainvoke the caller's `awrap_tool_call` runs around the gate, as around the tool."""

    def script() -> Script:
        return Script([call("lookup", order_id="1042"), call("note", text="hallo"), say("ok")])

    async def both() -> tuple[Any, Any]:
        plain = Talk(ToolNode(tools_for(EffectRecorder()), awrap_tool_call=amarking), script())
        talk = Talk(gated(EffectRecorder(), db, gates, awrap_tool_call=amarking), script())
        return await plain.ainvoke(), await talk.ainvoke()

    plain, out = asyncio.run(both())
    assert seen(out) == seen(plain)
    assert seen(out)[1] == ("note", "notiert: hallo [geprüft]", "success")


def test_a_retrying_wrapper_cannot_repeat_a_write(db: str, gates: list[EffectGate]) -> None:
    """A wrapper that calls `execute` twice runs the tool twice on a plain ToolNode, once behind
    the gate: the second run of the same write is its stored result."""

    def twice(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
        execute(request)
        return execute(request)

    def script() -> Script:
        return Script([call("note", text="einmal"), say("ok")])

    plain_receiver, receiver = EffectRecorder(), EffectRecorder()
    plain = run(ToolNode(tools_for(plain_receiver), wrap_tool_call=twice), script())
    out = run(gated(receiver, db, gates, wrap_tool_call=twice), script())
    assert seen(out) == seen(plain)
    assert plain_receiver.count("note") == 2
    assert receiver.count("note") == 1


def test_callbacks_fire_for_a_table_rows_reads_and_writes(shop_gate: ShopGate) -> None:
    """A GatedToolNode over the effect table's rows (functions, not langchain tools) still fires
    on_tool_start / on_tool_end for each read and write, with the ToolMessage the model gets."""
    events = ToolEvents()
    script = Script(
        [
            call("get_order", order_id="1042"),
            call("update_ticket_tags", ticket_id="t-17", tags=["vip"]),
            say("ok"),
        ]
    )
    graph = shop_graph(shop_gate.gate, ScriptedChatModel(script=script), checkpointer=InMemorySaver())
    cfg: RunnableConfig = {"configurable": {"thread_id": "s1"}, "callbacks": [events]}
    out = graph.invoke({"messages": [HumanMessage("go", id="m1")]}, cfg, context=CONTEXT, version="v2")
    contents = [c for _, c, _ in seen(out)]
    assert events.events == [
        ("start", "get_order", {"order_id": "1042"}),
        ("end", contents[0], None),
        ("start", "update_ticket_tags", {"ticket_id": "t-17", "tags": ["vip"]}),
        ("end", contents[1], None),
    ]
    assert shop_gate.shop.reads["get_order"] == 1
