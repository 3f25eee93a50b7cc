"""Round 20 review of the LangGraph adapter, reproduced first.

1. A `wrap_tool_call` that calls `execute` again (a retry wrapper) around an approved gated call:
   the refund ran once, then the second `execute` presented the spent grant again and the model
   was told "Refused (mismatch) ... Nothing ran" for a refund that had run (a write's retry gets
   its stored result). Fixed (`_grants._spent`): a grant the core refuses as used answers the
   call as the core does now: its stored result, or its unknown outcome.
2. With a `wrap_tool_call` (the grant is spent where the wrapper calls `execute`), an approve
   sent in the documented plain form `Command(resume={approval_id: approve(token)})` while a
   sibling gated call still waited was lost at the step's next pause: LangGraph keeps that
   answer (read from its resume map) in no checkpoint, so the next run listed the refund as
   waiting again, approved with a live grant nobody held: `gate.approve` and a HITL approve
   were refused (`AlreadyDecided`) and no reason was given. Fixed (`_step`, `_regrant`): such a
   grant is given back at the pause (`gate.release`), nothing ran, and the call is asked again
   with the reason (`UNKEPT`); approving it again works, and runs it once.
3. A `wrap_tool_call` that swaps an approved refund call for another tool's call under the same
   id (`request.override(tool_call=...)`: a preview, a fallback) ran the refund anyway: the node
   found the approved grant by the call id alone and spent it under the read's name, and the
   read the wrapper asked for never ran. Fixed (`_grants.settled_for`): a settled call answers,
   or spends its grant, only for a call of the same tool; the swapped-in call is decided on its
   own (a read runs now, a gated one is refused unregistered), the refund's grant stays unspent.
4. The same for a wrapper that changes an approved call's arguments (caps the refund at 5000):
   the approved 12000 ran, silently, in place of what the wrapper asked for (issue 14: a call
   that no longer matches its approval is refused, not swapped for the stored arguments).
   Fixed with 3: the changed call is refused unregistered, nothing runs, the grant stays
   unspent; a reviewer's edit (the model's call unchanged) still runs the edited arguments.
5. EffectGateMiddleware under an outer middleware that changes a call's arguments (the same cap):
   the step is settled from the state's call with that id, so the reviewer is shown, and the
   gate runs, the model's 12000; the cap is silently dropped. Fixed in round 21: each task
   registers its own call as its outer middleware changed it (test_round21_langgraph.py has the
   case with a gated sibling, whose task used to amend the refund back from the state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import Approver
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, EffectGateMiddleware, GatedToolNode, approve, edit, resume
from effectgate_langgraph._regrant import UNKEPT
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import LangGraphHarness, paused_of

BILL = Approver("bill", "billing")
CONTEXT = {"user_id": "u1"}
BOTH = step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1"))


def _twice(request: Any, execute: Callable[[Any], Any]) -> Any:
    execute(request)
    return execute(request)


async def _atwice(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
    await execute(request)
    return await execute(request)


def _passing(request: Any, execute: Callable[[Any], Any]) -> Any:
    return execute(request)


def _harness(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], script: Script, **node: Any
) -> LangGraphHarness:
    gated = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, **node)
    return LangGraphHarness(shop_gate.gate, ScriptedChatModel(script=script), checkpointer, node=gated)


def _tool_messages(h: LangGraphHarness) -> list[ToolMessage]:
    return [m for m in h.messages() if isinstance(m, ToolMessage)]


def test_a_retrying_wrapper_around_an_approved_call_is_told_it_ran(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    h = _harness(
        shop_gate, checkpointer, Script([call("refund_order", **REFUND), say("ok")]), wrap_tool_call=_twice
    )
    [paused] = h.send("Refund 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    assert shop_gate.shop.receiver.count("refund") == 1
    [message] = _tool_messages(h)
    assert message.status == "success"
    assert message.artifact[ARTIFACT_KEY]["outcome"] == "executed"
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}


def test_the_same_under_ainvoke(shop_gate: ShopGate) -> None:
    h = _harness(
        shop_gate,
        InMemorySaver(),
        Script([call("refund_order", **REFUND), say("ok")]),
        awrap_tool_call=_atwice,
    )

    async def run() -> None:
        [paused] = (await h.ainvoke({"messages": [HumanMessage("Refund 1042", id="m3")]})).paused
        assert h.last is not None
        await h.ainvoke(
            resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, h.last.interrupts)
        )

    asyncio.run(run())
    assert shop_gate.shop.receiver.count("refund") == 1
    [message] = _tool_messages(h)
    assert message.artifact[ARTIFACT_KEY]["outcome"] == "executed"


def test_a_plain_resume_grant_given_back_at_a_sibling_pause_is_asked_again_with_the_reason(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    gate = shop_gate.gate
    h = _harness(shop_gate, checkpointer, Script([BOTH, say("Both done.")]), wrap_tool_call=_passing)
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    second = h.invoke(Command(resume={refund.approval_id: approve(grant(gate, refund))}))
    # asked again with the reason; nothing ran, and the grant is void (given back)
    assert [p.tool for p in second.paused] == ["refund_order", "cancel_subscription"]
    assert {"approval_id": refund.approval_id, "reason": UNKEPT} in h.interrupt.value["refused"]
    assert shop_gate.shop.receiver.count("refund") == 0
    kinds = [e.kind for e in shop_gate.store.events(approval_id=refund.approval_id)]
    assert kinds.count("grant_released") == 1
    # approving it again works (it was stuck: AlreadyDecided), and each call runs once
    assert h.last is not None
    decisions = {
        refund.approval_id: approve(grant(gate, refund)),
        cancel.approval_id: approve(grant(gate, cancel, BILL)),
    }
    done = h.invoke(resume(decisions, h.last.interrupts))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}
    assert gate.audit().clean


def test_without_a_wrapper_a_plain_resume_grant_runs_at_once(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    gate = shop_gate.gate
    h = _harness(shop_gate, checkpointer, Script([BOTH, say("Both done.")]))
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    second = h.invoke(Command(resume={refund.approval_id: approve(grant(gate, refund))}))
    assert [p.tool for p in second.paused] == ["cancel_subscription"]
    done = h.invoke(Command(resume={cancel.approval_id: approve(grant(gate, cancel, BILL))}))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1


def _swap_for_a_read(request: Any, execute: Callable[[Any], Any]) -> Any:
    if request.tool_call["name"] != "refund_order":
        return execute(request)
    swapped = {**request.tool_call, "name": "get_order", "args": {"order_id": "1042"}}
    return execute(request.override(tool_call=swapped))


async def _aswap_for_a_read(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
    if request.tool_call["name"] != "refund_order":
        return await execute(request)
    swapped = {**request.tool_call, "name": "get_order", "args": {"order_id": "1042"}}
    return await execute(request.override(tool_call=swapped))


def _swapped(shop_gate: ShopGate, h: LangGraphHarness) -> None:
    assert shop_gate.shop.receiver.count("refund") == 0, "the approved refund ran for the swapped-in read"
    assert shop_gate.shop.reads["get_order"] == 1
    [message] = _tool_messages(h)
    assert (message.name, message.status) == ("get_order", "success")
    [refund] = shop_gate.store.approvals()
    assert (refund.status, refund.token_used_at) == ("approved", None)
    assert shop_gate.gate.audit().clean


def test_a_wrapper_that_swaps_an_approved_call_for_a_read_runs_the_read_only(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    script = Script([call("refund_order", **REFUND), say("ok")])
    h = _harness(shop_gate, checkpointer, script, wrap_tool_call=_swap_for_a_read)
    [paused] = h.send("Refund 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    _swapped(shop_gate, h)


def test_the_swap_under_ainvoke(shop_gate: ShopGate) -> None:
    script = Script([call("refund_order", **REFUND), say("ok")])
    h = _harness(shop_gate, InMemorySaver(), script, awrap_tool_call=_aswap_for_a_read)

    async def run() -> None:
        [paused] = (await h.ainvoke({"messages": [HumanMessage("Refund 1042", id="m3")]})).paused
        assert h.last is not None
        await h.ainvoke(
            resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, h.last.interrupts)
        )

    asyncio.run(run())
    _swapped(shop_gate, h)


def _cap(request: Any, execute: Callable[[Any], Any]) -> Any:
    if request.tool_call["name"] != "refund_order":
        return execute(request)
    capped = {**request.tool_call, "args": {**request.tool_call["args"], "amount": 5000}}
    return execute(request.override(tool_call=capped))


def test_a_wrapper_that_changes_an_approved_calls_arguments_runs_nothing(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    script = Script([call("refund_order", **REFUND), say("ok")])
    h = _harness(shop_gate, checkpointer, script, wrap_tool_call=_cap)
    [paused] = h.send("Refund 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    assert shop_gate.shop.receiver.count("refund") == 0, "the approved 12000 ran in place of the capped call"
    [message] = _tool_messages(h)
    assert message.status == "error"
    assert message.artifact[ARTIFACT_KEY]["code"] == "not_allowed"
    [refund] = shop_gate.store.approvals()
    assert (refund.status, refund.token_used_at) == ("approved", None)
    assert shop_gate.gate.audit().clean


def test_with_a_passing_wrapper_a_reviewers_edit_still_runs(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    script = Script([call("refund_order", **REFUND), say("ok")])
    h = _harness(shop_gate, checkpointer, script, wrap_tool_call=_passing)
    [paused] = h.send("Refund 1042", message_id="m3").paused
    [edited] = h.decide({paused.approval_id: edit({**REFUND, "amount": 5000})}).paused
    assert edited.version == 2
    h.approve(edited, grant(shop_gate.gate, edited))
    assert [e.payload["amount"] for e in shop_gate.shop.receiver.effects] == [5000]
    [message] = _tool_messages(h)
    assert message.status == "success"


class _Capping(AgentMiddleware):  # type: ignore[type-arg]
    """An application's own middleware, outside the gate: no refund above 5000."""

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return _cap(request, handler)


def test_the_middleware_gates_the_call_an_outer_middleware_changed(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("ok")]))
    gated = EffectGateMiddleware(shop_gate.gate, agent_id=SUPPORT_AGENT)
    agent = create_agent(model, middleware=[_Capping(), gated], checkpointer=checkpointer)
    config: Any = {"configurable": {"thread_id": "s-ada"}}
    out = agent.invoke(
        {"messages": [HumanMessage("Refund 1042", id="m3")]}, config, context=CONTEXT, version="v2"
    )
    [paused] = paused_of(out)
    [request] = out.interrupts[0].value["requests"]
    assert request["card"]["args"]["amount"] == 5000  # the reviewer sees what would run
    answer = resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, out.interrupts)
    done = agent.invoke(answer, config, context=CONTEXT, version="v2")
    assert done.interrupts == ()
    assert [e.payload["amount"] for e in shop_gate.shop.receiver.effects] == [5000]
    assert shop_gate.gate.audit().clean
