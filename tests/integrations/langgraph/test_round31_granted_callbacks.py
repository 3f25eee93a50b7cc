"""Review round 31, LangGraph adapter: tool callbacks for a gated call a table row's function runs.

GatedToolNode fires `on_tool_start` / `on_tool_end` itself for a read or write a table row's
function answers (it is not a langchain tool, so nothing else would), but a gated call that ran
after its approval fired none: a LangSmith trace or a handler counting tool runs never saw the
refund that moved money. It now fires the pair once, on the run where the call runs (nothing for
the pause: the tool did not run then), and `on_tool_error` for a run that raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate.testing import Script, call, say
from effectgate_langgraph import approve
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._fidelity import ToolEvents
from ._graph import LangGraphHarness
from .conftest import MakeLangGraphHarness


def _with(events: ToolEvents, config: RunnableConfig) -> RunnableConfig:
    return {**config, "callbacks": [events]}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_approved_refund_fires_its_start_and_end_where_it_runs(shop_gate: ShopGate, mode: str) -> None:
    events = ToolEvents()
    script = Script([call("refund_order", **REFUND), say("Refunded.")])
    h = LangGraphHarness(shop_gate.gate, ScriptedChatModel(script=script), InMemorySaver())  # async too
    h.config = _with(events, h.config)
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    assert events.events == []  # paused: nothing ran
    resume = Command(resume={paused.approval_id: approve(grant(shop_gate.gate, paused))})
    turn = h.invoke(resume) if mode == "sync" else asyncio.run(h.ainvoke(resume))
    assert turn.paused == ()
    [result] = turn.results
    assert events.events == [("start", "refund_order", dict(REFUND)), ("end", result.content, None)]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [e.status for e in shop_gate.gate.store.executions()] == ["succeeded"]


def test_an_approved_call_that_raises_ends_in_on_tool_error(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = ToolEvents()
    h = lg_harness(Script([call("refund_order", **REFUND), say("It failed.")]))
    h.config = _with(events, h.config)
    [paused] = h.send("Please refund order 1042", message_id="m3").paused

    def declined(**_: Any) -> dict[str, Any]:
        raise ValueError("card declined")

    monkeypatch.setattr(shop_gate.shop.provider, "refund", declined)
    h.invoke(Command(resume={paused.approval_id: approve(grant(shop_gate.gate, paused))}))
    assert [e[0] for e in events.events] == ["start", "error"]
    assert "card declined" in events.events[1][1]
    assert shop_gate.shop.receiver.count("refund") == 0
