"""A gated tool fires the hooks and spans a plain tool fires: the run's `RunHooks`, the agent's
`AgentHooks` (effectgate installs its own and chains the agent's) and the SDK's function spans,
for a read, a write and an approved money call, compared with the same run on plain tools whose
refund uses the SDK's own `needs_approval` (so both runs pause, are approved and resume)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    AgentHooks,
    FunctionTool,
    RunContextWrapper,
    RunHooks,
    Runner,
    Tool,
    function_tool,
    set_tracing_disabled,
)
from agents.tracing import Span, Trace, TracingProcessor, set_trace_processors
from agents.tracing.processors import default_processor
from agents.tracing.span_data import FunctionSpanData

from effectgate import Grant, money, read, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import FINANCE, context


class Seen(RunHooks[Any]):
    """What the run's hooks saw, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Tool) -> None:
        self.events.append(("start", tool.name))

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Any, tool: Tool, result: str) -> None:
        self.events.append(("end", tool.name))


class AgentSeen(AgentHooks[Any]):
    """What the agent's own hooks saw (effectgate's hooks wrap them)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Tool) -> None:
        self.events.append(("start", tool.name))

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Any, tool: Tool, result: str) -> None:
        self.events.append(("end", tool.name))


class Spans(TracingProcessor):
    """The function spans the SDK ended: (tool name, output or error)."""

    def __init__(self) -> None:
        self.functions: list[tuple[str, str | None, bool]] = []

    def on_trace_start(self, trace: Trace) -> None: ...
    def on_trace_end(self, trace: Trace) -> None: ...
    def on_span_start(self, span: Span[Any]) -> None: ...

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, FunctionSpanData):
            self.functions.append(
                (data.name, str(data.output) if data.output is not None else None, span.error is not None)
            )

    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spans]:
    """Tracing on, with only this processor (no exporter reaching anything); off again after,
    as the suite's conftest keeps it."""
    seen = Spans()
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    set_trace_processors([seen])
    set_tracing_disabled(False)
    try:
        yield seen
    finally:
        set_tracing_disabled(True)
        set_trace_processors([default_processor()])


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def shop_tools(receiver: EffectRecorder, *, needs_approval: bool) -> list[FunctionTool]:
    @function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        receiver.record("get_order", order_id=order_id)
        return f"order {order_id}: delivered"

    @function_tool
    def save_note(order_id: str, note: str) -> str:
        """Note something on an order."""
        receiver.record("save_note", order_id=order_id)
        return "noted"

    @function_tool(needs_approval=needs_approval)
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund_order", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    return [get_order, save_note, refund_order]


SCRIPT = [
    call("get_order", id="c1", order_id="1042"),
    call("save_note", id="c2", order_id="1042", note="asked for a refund"),
    call("refund_order", id="c3", order_id="1042", amount=500),
    say("Done."),
]
EFFECTS = {"get_order": read(), "save_note": write(), "refund_order": money("finance", subject="order_id")}


@dataclass
class Observed:
    hooks: list[tuple[str, str]]
    agent_hooks: list[tuple[str, str]]
    spans: list[tuple[str, str | None, bool]]
    effects: list[str]


def observed(receiver: EffectRecorder, hooks: Seen, own: AgentSeen, spans: Spans) -> Observed:
    return Observed(hooks.events, own.events, list(spans.functions), [e.kind for e in receiver.effects])


def plain_run(spans: Spans) -> Observed:
    receiver, hooks, own = EffectRecorder(), Seen(), AgentSeen()
    tools = shop_tools(receiver, needs_approval=True)
    agent = Agent(name="support", model=ScriptedModel(Script(SCRIPT)), tools=tools, hooks=own)
    result = Runner.run_sync(agent, "Refund order 1042", hooks=hooks)
    state = result.to_state()
    state.approve(state.get_interruptions()[0])
    Runner.run_sync(agent, state, hooks=hooks)
    return observed(receiver, hooks, own, spans)


def gated_run(db: str, spans: Spans) -> Observed:
    receiver, hooks, own = EffectRecorder(), Seen(), AgentSeen()
    tools = shop_tools(receiver, needs_approval=False)
    base = Agent(name="support", model=ScriptedModel(Script(SCRIPT)), tools=tools, hooks=own)
    agent = gate_agent(base, effects=EFFECTS, db=db)
    with gate_of(agent) as gate:
        result = Runner.run_sync(agent, "Refund order 1042", context=context("m1"), hooks=hooks)
        assert receiver.count("refund_order") == 0
        state = result.to_state()
        [paused] = pending_approvals(state)
        assert isinstance(approve_as(gate, state, paused, FINANCE), Grant)
        Runner.run_sync(agent, state, hooks=hooks)
    return observed(receiver, hooks, own, spans)


def test_a_gated_run_fires_the_hooks_and_spans_a_plain_run_fires(db: str, spans: Spans) -> None:
    """Each call that ran fired start and end once, on the run's and the agent's hooks, and the
    function spans (with their outputs, and the paused call's span) are the plain run's."""
    plain = plain_run(spans)
    spans.functions.clear()
    gated = gated_run(db, spans)
    expected = [
        (kind, name) for name in ("get_order", "save_note", "refund_order") for kind in ("start", "end")
    ]
    assert plain.hooks == plain.agent_hooks == expected  # the baseline is what this test believes
    assert plain.effects == ["get_order", "save_note", "refund_order"]
    assert gated == plain
