"""The model-written tool-call id is never what routes an answer (GatedToolNode and
EffectGateMiddleware).

Every answer of a step is matched to its call by the tool-call id, which the model writes. Two
calls of one step under the same id used to take each other's answer: the second gated call's
slot replaced the first's, so one approval was registered that no reviewer was shown (pending,
holding its subject), the first call's ToolMessage carried what the other call did, and a read
sharing a gated call's id never ran but was answered with the gated call's outcome. Now the
calls under an id that a gated call shares within the step are refused unregistered, and
nothing runs for them.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from effectgate import Approver
from effectgate.testing import Script, call, say, step
from tests.conformance.adapters import REFUND, ShopGate, grant

from .conftest import MakeLangGraphHarness

CANCEL = {"subscription_id": "sub_u1"}
BILLING = Approver("bill", "billing")


def _tool_messages(h: object) -> list[ToolMessage]:
    return [m for m in h.messages() if isinstance(m, ToolMessage)]  # type: ignore[attr-defined]


def test_two_gated_calls_sharing_one_tool_call_id_register_nothing_and_run_nothing(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """refund_order and cancel_subscription, both under id "dup": no approval is registered
    (none the reviewer would never be shown), nothing pauses or runs, and each call is told
    its id was reused."""
    h = node_or_agent(
        Script(
            [
                step(
                    call("refund_order", id="dup", **REFUND),
                    call("cancel_subscription", id="dup", **CANCEL),
                ),
                say("I will call them again with distinct ids."),
            ]
        )
    )
    turn = h.send("Refund 1042 and cancel my subscription", message_id="m3")
    assert turn.paused == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.receiver.count("cancel") == 0
    messages = _tool_messages(h)
    assert sorted(str(m.name) for m in messages) == ["cancel_subscription", "refund_order"]
    assert all(m.status == "error" and "'dup'" in str(m.content) for m in messages)
    h.script.assert_complete()


def test_a_read_sharing_a_gated_calls_id_is_not_answered_with_the_gated_outcome(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """get_order and cancel_subscription under one id: the cancellation is not registered, and
    the read is not answered with another call's outcome (both are refused, nothing runs)."""
    h = node_or_agent(
        Script(
            [
                step(
                    call("get_order", id="dup", order_id="1042"),
                    call("cancel_subscription", id="dup", **CANCEL),
                ),
                say("Again with distinct ids."),
            ]
        )
    )
    turn = h.send("Look up 1042 and cancel my subscription", message_id="m3")
    assert turn.paused == ()
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.count("cancel") == 0
    read = [m for m in _tool_messages(h) if m.name == "get_order"]
    assert [m.status for m in read] == ["error"]
    assert "sub_u1" not in str(read[0].content)


def test_distinct_ids_in_the_same_step_still_pause_and_run_once(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The refusal is only for reused ids: the same step with distinct ids pauses on the
    cancellation, and approved, it runs once and the read runs once."""
    h = node_or_agent(
        Script(
            [
                step(
                    call("get_order", id="r1", order_id="1042"),
                    call("cancel_subscription", id="g1", **CANCEL),
                ),
                say("Done."),
            ]
        )
    )
    [cancel] = h.send("Look up 1042 and cancel my subscription", message_id="m3").paused
    h.approve(cancel, grant(shop_gate.gate, cancel, BILLING))
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert shop_gate.shop.reads["get_order"] == 1


@pytest.mark.parametrize("checkpointer", ["memory"], indirect=True)  # SqliteSaver has no async API
def test_reused_ids_are_refused_on_the_async_path_too(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The same step through `ainvoke` (the node's `_awrap`, the middleware's `awrap_tool_call`)."""
    h = node_or_agent(
        Script(
            [
                step(
                    call("refund_order", id="dup", **REFUND),
                    call("cancel_subscription", id="dup", **CANCEL),
                ),
                say("Again with distinct ids."),
            ]
        )
    )
    turn = asyncio.run(h.ainvoke({"messages": [HumanMessage("Refund and cancel", id="m3")]}))
    assert turn.paused == ()
    assert shop_gate.store.approvals() == []
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("cancel_subscription", False)]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.receiver.count("cancel") == 0


def test_two_reads_sharing_an_id_still_run_as_toolnode_runs_them(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The refusal is for ids a gated call shares: two reads under one id each run and answer."""
    h = node_or_agent(
        Script(
            [
                step(
                    call("get_order", id="dup", order_id="1042"),
                    call("search_tickets", id="dup", query="refund"),
                ),
                say("Done."),
            ]
        )
    )
    turn = h.send("Look up 1042 and my tickets", message_id="m3")
    assert turn.paused == ()
    assert shop_gate.shop.reads["get_order"] == 1
    assert [r.tool for r in turn.results if r.ok] == ["get_order", "search_tickets"]
