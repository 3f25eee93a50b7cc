"""Round 6 review of observability: what a span or a log record carries when a tool raises with
text that quotes its arguments (or model-written text that tries to forge a log line)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import sqlalchemy as sa
from agents import Runner, RunState
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from effectgate import Approver, Effect, EffectTable, Grant, Keyring, Pending, ToolSpec, flow, write
from effectgate.errors import NeedsReconciliation, OutcomeUnknown, TamperedRecord
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import gated_node
from effectgate_langgraph.testing import ScriptedChatModel

from ..integrations.openai_agents._harness import context as agent_context
from ..integrations.openai_agents.test_native_approvals import FINANCE as NATIVE
from ..integrations.openai_agents.test_native_approvals import REFUND, Shop
from ..integrations.openai_agents.test_native_snapshots import EDITS, _edited
from .conftest import MakeGate, ShopGate

SECRET = "4111-1111-1111-1111"
FORGED = "\nCRITICAL root: forged line\r\x1b[2J\u2028\u0085"
FINANCE = Approver("fiona", "finance")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


class Charges:
    """A card tool whose errors quote its arguments (as many real client libraries do)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.calls = 0

    def charge(self, card: str, note: str) -> None:
        """Charge a card."""
        self.calls += 1
        raise self.error(f"card {card} declined: {note}")


def table_of(charges: Charges, effect: Effect) -> EffectTable:
    spec = ToolSpec(name="charge", effect=effect, fn=charges.charge, approver_role="finance")
    table = EffectTable([spec])
    table.allow("agent", ["charge"])
    return table


def everything(span: ReadableSpan) -> str:
    """All a span exports: attributes, status, events and their attributes."""
    return str(span.to_json())


def test_a_tools_error_text_never_reaches_a_span(
    make_gate: MakeGate, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A write's tool raises with text that quotes its arguments: the call's span ends in error,
    naming the exception's type, and no argument value is exported with it."""
    charges = Charges(ValueError)
    gate = make_gate(table_of(charges, Effect.WRITE), tracer_provider=provider)
    with pytest.raises(ValueError, match="declined"):
        gate.call("charge", {"card": SECRET, "note": "n"}, context("m1", agent_id="agent"))
    assert charges.calls == 1
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "ValueError"
    assert [e.name for e in span.events] == ["exception"]
    assert SECRET not in everything(span)


def test_an_unknown_outcomes_reason_never_reaches_a_span(
    make_gate: MakeGate, provider: TracerProvider, exporter: InMemorySpanExporter, store: SQLStore
) -> None:
    """An approved call whose tool raises OutcomeUnknown quoting its arguments: the execute span
    is an error (NeedsReconciliation) without the argument value; the record keeps the reason."""
    charges = Charges(OutcomeUnknown)
    gate = make_gate(table_of(charges, Effect.MONEY), tracer_provider=provider)
    pending = gate.call("charge", {"card": SECRET, "note": "n"}, context("m1", agent_id="agent"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert charges.calls == 1
    record = store.get(f"eg_{pending.approval_id}_v1")
    assert record is not None
    assert record.status == "needs_reconciliation"
    [span] = [s for s in exporter.get_finished_spans() if s.name == "effectgate.execute"]
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "NeedsReconciliation"
    assert SECRET not in everything(span)


@pytest.mark.parametrize("error", [ValueError, OutcomeUnknown])
def test_a_tools_error_text_cannot_forge_a_log_line(
    make_gate: MakeGate, caplog: pytest.LogCaptureFixture, error: type[Exception]
) -> None:
    """The reason logged for a failed or unknown write quotes the tool's error text, which quotes
    model-written arguments: it is logged escaped, one record, one line."""
    charges = Charges(error)
    gate = make_gate(table_of(charges, Effect.WRITE))
    with caplog.at_level(logging.INFO, logger="effectgate"), pytest.raises(Exception, match="declined"):
        gate.call("charge", {"card": "c", "note": FORGED}, context("m1", agent_id="agent"))
    assert charges.calls == 1
    [record] = [r for r in caplog.records if r.name == "effectgate._execution"]
    message = record.getMessage()
    assert "declined" in message
    for char in ("\n", "\r", "\x1b", "\u2028", "\u0085"):
        assert char not in message


# -- the adapters' log records: a handler that raises changes no outcome


class RaisingHandler(logging.Handler):
    """A handler whose `emit` raises (a careless network handler): Python passes that to the caller."""

    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("log shipper is down")


@pytest.fixture
def broken_adapter_log() -> Iterator[None]:
    """Every record of the adapters' loggers reaches a handler that raises."""
    loggers = [logging.getLogger(name) for name in ("effectgate_langgraph", "effectgate_openai_agents")]
    handler = RaisingHandler(level=logging.DEBUG)
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_a_raising_log_handler_does_not_fail_a_langgraph_write_that_ran(
    store_url: str, broken_adapter_log: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A langgraph write whose tool returns a Command (not declared as one) ran: the adapter's
    warning about the dropped update goes to a handler that raises, and the write is still
    recorded succeeded, once (a failed record would let the same call run again)."""

    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    receiver = EffectRecorder()

    @tool
    def tag(name: str, tool_call_id: Annotated[str, InjectedToolCallId]):  # type: ignore[no-untyped-def]
        """Tag the customer."""
        receiver.record("tag", name=name)
        return Command(update={"messages": [ToolMessage("tagged", tool_call_id=tool_call_id)]})

    model = ScriptedChatModel(script=Script([call("tag", name="bob"), say("Done.")]))
    node = gated_node([tag], {"tag": write()}, db=store_url)
    try:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        builder.add_node("tools", node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        graph: Any = builder.compile(checkpointer=InMemorySaver())
        config: Any = {"configurable": {"thread_id": "t1"}}
        graph.invoke({"messages": [HumanMessage("tag bob", id="m1")]}, config, context={"user_id": "u1"})
        assert receiver.count("tag") == 1
        assert [x.status for x in node.gate.store.executions(tool="tag")] == ["succeeded"]
    finally:
        node.gate.close()


def test_a_raising_log_handler_does_not_break_an_openai_agents_resume(
    store_url: str, broken_adapter_log: None
) -> None:
    """A snapshot carrying an SDK approval edited in is resumed: the adapter's warning that it
    dropped that approval goes to a handler that raises, and the run still ends paused with
    nothing run and the approval pending."""

    s = Shop(store_url, [REFUND], native_approver=NATIVE)
    try:
        result = Runner.run_sync(s.agent, "Refund order 1042", context=agent_context("m1"))
        row = s.row(result)
        snapshot = _edited(result.to_state().to_string(), EDITS["approved-call"])
        resumed = s.resume(asyncio.run(RunState.from_string(s.agent, snapshot)))
        assert [i.call_id for i in resumed.interruptions] == ["c1"]
        assert s.receiver.effects == []
        pending = s.gate.store.get_approval(row.id)
        assert pending is not None
        assert pending.status == "pending"
    finally:
        s.gate.close()


def test_an_edited_tool_name_cannot_forge_a_log_line(
    shop_gate: ShopGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose tool column was edited in the database (one with write access to it) to hold a
    line break: the call that finds it is refused as tampered, and the WARNING quotes the edited
    name escaped, one line."""
    _, gate = shop_gate
    refund = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
    pending = gate.call("refund_order", refund, context("m3"))
    assert isinstance(pending, Pending)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET tool = :t WHERE id = :i"),
            {"t": "refund_order" + FORGED, "i": pending.approval_id},
        )
    with caplog.at_level(logging.INFO, logger="effectgate"), pytest.raises(TamperedRecord):
        gate.call("refund_order", refund, context("m3"))
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert pending.approval_id in message
    for char in ("\n", "\r", "\x1b", "\u2028", "\u0085"):
        assert char not in message


class Counting(SpanProcessor):
    """Counts the spans started and ended (an unended span is never exported: a leak)."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


def test_a_span_whose_attributes_cannot_be_built_is_still_ended(make_gate: MakeGate) -> None:
    """A tool name the table cannot look up (a model's list where a name belongs): whatever the
    call returns or raises, every span it started is ended."""
    counting = Counting()
    provider = TracerProvider()
    provider.add_span_processor(counting)
    charges = Charges(ValueError)
    gate = make_gate(table_of(charges, Effect.WRITE), tracer_provider=provider)
    for name in (["charge"], {"charge": 1}):
        with contextlib.suppress(TypeError):
            gate.call(name, {"card": "c", "note": "n"}, context("m1", agent_id="agent"))  # type: ignore[arg-type]
        flow_ = gate.flows.call(name, {"card": "c", "note": "n"}, context("m2", agent_id="agent"))  # type: ignore[arg-type]
        with contextlib.suppress(TypeError):
            flow.drive(flow_)
    assert charges.calls == 0
    assert counting.started >= 1
    assert counting.ended == counting.started
