"""Round 18 review of `_grants` (a GatedToolNode grant spent where its wrapped call runs),
reproduced first.

1. With a `wrap_tool_call`, a HITL approve through the native approver (`gate.approve`) was
   settled as an unspent `Granted`. Its token exists only in that run's memory (the HITL answer
   carries none, and a replayed HITL answer is skipped): when the same step paused again before
   ToolNode dispatched (its sibling still waiting), the re-run found the approval approved with
   a live grant it could not present, paused on it again, and a new approve was refused
   (`already approved`) until the grant lapsed. Without a wrapper the grant is spent at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Approver
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, Turn, grant

from ._graph import LangGraphHarness
from .conftest import MakeLangGraphHarness

BILL = Approver("bill", "billing")


def _passing(request: Any, execute: Any) -> Any:
    return execute(request)


def test_a_native_hitl_approve_with_a_wrapper_survives_a_sibling_pause(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """HITL approve of both calls as fiona (finance): the refund is granted, the cancel refused
    (billing's); the step pauses on the cancel. Once bill approves it, both run once: the refund
    granted by the first answer is not asked for again."""
    node = GatedToolNode(
        shop_gate.gate, agent_id=SUPPORT_AGENT, wrap_tool_call=_passing, native_approver=FINANCE
    )
    both = step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1"))
    h = lg_harness(Script([both, say("Both done.")]), node=node)
    _, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    first = h.invoke(Command(resume={"decisions": [{"type": "approve"}] * 2}))
    assert [p.approval_id for p in first.paused] == [cancel.approval_id]
    assert shop_gate.shop.receiver.count("refund") == 0  # round 19: runs in its wrapper, once settled
    done = h.approve(cancel, grant(shop_gate.gate, cancel, BILL))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}


def test_the_same_on_the_async_path(shop_gate: ShopGate) -> None:
    async def passing(request: Any, execute: Any) -> Any:
        return await execute(request)

    node = GatedToolNode(
        shop_gate.gate, agent_id=SUPPORT_AGENT, awrap_tool_call=passing, native_approver=FINANCE
    )
    both = step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1"))
    h = LangGraphHarness(
        shop_gate.gate, ScriptedChatModel(script=Script([both, say("ok")])), InMemorySaver(), node=node
    )

    async def run() -> Turn:
        first = await h.ainvoke({"messages": [HumanMessage("Refund and cancel", id="m3")]})
        _, cancel = first.paused
        second = await h.ainvoke(Command(resume={"decisions": [{"type": "approve"}] * 2}))
        assert [p.approval_id for p in second.paused] == [cancel.approval_id]
        assert h.last is not None
        answer = resume({cancel.approval_id: approve(grant(shop_gate.gate, cancel, BILL))}, h.last.interrupts)
        return await h.ainvoke(answer)

    assert asyncio.run(run()).paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
