"""The gated node under `ainvoke`: the same guarantees, with the store work on the gate's async twins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from effectgate import EffectGate
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import approve, deny, resume
from tests.conformance.adapters import REFUND, ShopGate, grant

from .conftest import MakeLangGraphHarness


@pytest.fixture
def checkpointer() -> InMemorySaver:
    """SqliteSaver has no async methods (AsyncSqliteSaver would need aiosqlite): memory only here."""
    return InMemorySaver()


def spy_async(gate: EffectGate) -> dict[str, int]:
    """Count the gate flows the node composes, and every store transaction opened on the event
    loop's own thread ("on_loop"): the node must do all store work off the loop."""
    used: dict[str, int] = {}
    for name in ("call", "call_step", "execute", "deny", "edit"):
        original = getattr(gate.flows, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            used[_name] = used.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(gate.flows, name, counted)
    for name in ("transaction", "reading"):
        opened = getattr(gate.store, name)

        def watched(*args: Any, _opened: Any = opened, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                used["on_loop"] = used.get("on_loop", 0) + 1
            except RuntimeError:
                pass
            return _opened(*args, **kwargs)

        setattr(gate.store, name, watched)
    return used


def test_ainvoke_pauses_and_runs_the_approved_refund_once(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Under ainvoke a read and a refund of one step pause, then each runs once, store work off the loop."""
    h = lg_harness(
        Script([step(call("get_order", order_id="1042"), call("refund_order", **REFUND)), say("Refunded.")])
    )
    used = spy_async(shop_gate.gate)

    async def conversation() -> None:
        turn = await h.ainvoke({"messages": [HumanMessage("Refund 1042", id="m3")]})
        [paused] = turn.paused
        assert shop_gate.shop.reads["get_order"] == 0
        token = await asyncio.to_thread(grant, shop_gate.gate, paused)
        done = await h.ainvoke(resume({paused.approval_id: approve(token)}, h.interrupt))
        assert done.paused == ()

    asyncio.run(conversation())
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert "on_loop" not in used
    assert (used["call_step"], used["execute"]) == (2, 1)
    h.script.assert_complete()


def test_ainvoke_denial_reaches_the_model(lg_harness: MakeLangGraphHarness, shop_gate: ShopGate) -> None:
    """Under ainvoke a denial is recorded through the deny flow, off the loop, and the turn ends
    with no refund."""
    h = lg_harness(Script([call("refund_order", **REFUND), say("Declined.")]))
    used = spy_async(shop_gate.gate)

    async def conversation() -> None:
        [paused] = (await h.ainvoke({"messages": [HumanMessage("Refund 1042", id="m3")]})).paused
        done = await h.ainvoke(resume({paused.approval_id: deny("not eligible")}, h.interrupt))
        assert [(r.tool, r.ok) for r in done.results] == [("refund_order", False)]

    asyncio.run(conversation())
    assert used.get("deny") == 1
    assert "on_loop" not in used
    [row] = shop_gate.store.approvals()
    assert row.status == "denied"
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()
