"""Review round 31, LangGraph adapter: tool callbacks for a call whose arguments the gate refuses.

A plain ToolNode given arguments its tool's schema refuses runs `tool.invoke`, which fires
`on_tool_start` and then `on_tool_error` (the validation error) before the error ToolMessage.
The gated node answered such a call (`Invalid`: the gate checks the arguments against the tool's
JSON schema first) with its error ToolMessage and fired nothing for a langchain tool given to it,
and `on_tool_start` then `on_tool_end` (not `on_tool_error`) for a table row's function, so a
LangSmith trace or a handler counting tool errors never saw the refusal.

The same invalid calls (a read, a write, a money call the gate refuses before any approval) run
on a plain ToolNode and on `gated_node`, sync and async (and on create_agent with and without
`gated_middleware`, which had the same gap), with a handler recording each callback by tool call
id. The ToolMessage the model gets is the gate's, as before; nothing runs (counted
at the receiver) and nothing is proposed or executed (the store)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode

from effectgate import EffectGate
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import gated_middleware, gated_node
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import ShopGate

from ._fidelity import CONTEXT, Talk, config, seen
from ._graph import shop_graph
from .test_fidelity_errors import EFFECTS, tools_for

#: The gate's answers to the invalid calls below: what the model gets today, unchanged.
ANSWERS = [
    (
        "lookup",
        "Invalid arguments for lookup: /order_id: 5 is not of type 'string'. Correct them and call again.",
    ),
    ("note", "Invalid arguments for note: /: 'text' is a required property. Correct them and call again."),
    (
        "refund",
        "Invalid arguments for refund: /amount: 'x' is not of type 'integer'. Correct them and call again.",
    ),
]


class Spans(BaseCallbackHandler):
    """Each tool callback as (event, tool call id), with the error passed to `on_tool_error`."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.errors: dict[str, BaseException] = {}
        self._calls: dict[UUID, str] = {}

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kw: Any) -> None:
        self._calls[run_id] = str(kw.get("tool_call_id"))
        self.events.append(("start", self._calls[run_id]))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kw: Any) -> None:
        self.events.append(("end", self._calls.get(run_id, "?")))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        self.events.append(("error", self._calls.get(run_id, "?")))
        self.errors[self._calls.get(run_id, "?")] = error


def shape(spans: Spans) -> list[tuple[str, int]]:
    """The events with each tool call id replaced by its call's place among the started ones."""
    order = list(dict.fromkeys(call_id for _, call_id in spans.events))
    return [(event, order.index(call_id)) for event, call_id in spans.events]


def invalid_calls() -> Script:
    return Script(
        [
            call("lookup", order_id=5),  # a read: a number for a string
            call("note"),  # a write: its argument missing
            call("refund", order_id="1042", amount="x"),  # money: refused before any approval
            say("ok"),
        ]
    )


@pytest.fixture
def db(keyed_db: str) -> str:
    return keyed_db


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_refused_calls_callbacks_are_tool_nodes(mode: str, db: str, gates: list[EffectGate]) -> None:
    """Each call the gate refuses fires `on_tool_start` then `on_tool_error` once, as a plain
    ToolNode fires them; the error carries the gate's message, the model's answer is the gate's,
    and nothing ran or was recorded as proposed or executed."""
    plain_spans, spans = Spans(), Spans()
    plain_receiver, receiver = EffectRecorder(), EffectRecorder()
    node = gated_node(tools_for(receiver), EFFECTS, db=db)
    gates.append(node.gate)
    plain_talk = Talk(ToolNode(tools_for(plain_receiver)), invalid_calls(), [plain_spans])
    talk = Talk(node, invalid_calls(), [spans])
    if mode == "sync":
        plain_talk.invoke()
        out = talk.invoke()
    else:
        asyncio.run(plain_talk.ainvoke())
        out = asyncio.run(talk.ainvoke())
    assert out.interrupts == ()
    assert [(name, content) for name, content, _ in seen(out)] == ANSWERS
    # each call: its start then its error, once, in the model's order (ids differ between the runs)
    assert (
        shape(spans)
        == shape(plain_spans)
        == [(e, n) for n in range(len(ANSWERS)) for e in ("start", "error")]
    )
    ids = [call_id for event, call_id in spans.events if event == "start"]
    assert [m.tool_call_id for m in out.value["messages"] if isinstance(m, ToolMessage)] == ids
    assert [str(spans.errors[i]) for i in ids] == [answer for _, answer in ANSWERS]
    assert all(isinstance(spans.errors[i], ToolException) for i in ids)
    assert receiver.effects == plain_receiver.effects == []
    assert node.gate.store.approvals() == []
    assert node.gate.store.executions() == []


def test_a_table_rows_refused_call_ends_in_on_tool_error(shop_gate: ShopGate) -> None:
    """A GatedToolNode over the table's rows (functions, not langchain tools) ends the span of a
    call the gate refuses with `on_tool_error`, not `on_tool_end`; the function never runs."""
    spans = Spans()
    script = Script([call("get_order", order_id=5), call("update_ticket_tags", ticket_id="t-17"), say("ok")])
    graph = shop_graph(shop_gate.gate, ScriptedChatModel(script=script), checkpointer=InMemorySaver())
    cfg: RunnableConfig = {"configurable": {"thread_id": "s1"}, "callbacks": [spans]}
    tags_before = shop_gate.shop.tickets["t-17"]["tags"]
    out = graph.invoke({"messages": [HumanMessage("go", id="m1")]}, cfg, context=CONTEXT, version="v2")
    answers = [content for _, content, _ in seen(out)]
    assert all(str(a).startswith("Invalid arguments for ") for a in answers)
    assert shape(spans) == [("start", 0), ("error", 0), ("start", 1), ("error", 1)]
    ids = [call_id for event, call_id in spans.events if event == "start"]
    assert [str(spans.errors[i]) for i in ids] == answers
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.tickets["t-17"]["tags"] == tags_before
    assert shop_gate.gate.store.executions() == []


def test_create_agents_refused_calls_fire_their_tool_callbacks(db: str, gates: list[EffectGate]) -> None:
    """On create_agent with `gated_middleware`, the same invalid calls fire what the plain agent's
    ToolNode fires for them, and nothing runs."""
    ask = {"messages": [HumanMessage("go", id="m1")]}
    plain_spans, spans = Spans(), Spans()
    plain_receiver, receiver = EffectRecorder(), EffectRecorder()
    plain = create_agent(
        ScriptedChatModel(script=invalid_calls()),
        tools=tools_for(plain_receiver),
        checkpointer=InMemorySaver(),
    )
    plain.invoke(ask, config(callbacks=[plain_spans]), context=CONTEXT, version="v2")
    middleware = gated_middleware(tools_for(receiver), EFFECTS, db=db)
    gates.append(middleware.gate)
    agent = create_agent(
        ScriptedChatModel(script=invalid_calls()), middleware=[middleware], checkpointer=InMemorySaver()
    )
    out = agent.invoke(ask, config(callbacks=[spans]), context=CONTEXT, version="v2")
    assert out.interrupts == ()
    assert receiver.effects == plain_receiver.effects == []
    assert middleware.gate.store.executions() == []
    assert shape(spans) == shape(plain_spans) == [(e, n) for n in range(3) for e in ("start", "error")]
