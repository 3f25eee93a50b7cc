"""Review round 20: the OpenAI Agents adapter. The SDK's own decisions on a tool in a
`tool_namespace`; a follow-up run on a copy of a paused run's context (its signature, an
always-approve decision, a reused call id); a guardrail's refusal of a call that registered
nothing. Each test reproduced a defect before its fix; scripted models drive the SDK's real
Runner, effects are counted at the receiver, and every test runs on SQLite and PostgreSQL
(`store_url`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    Runner,
    RunResult,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    function_tool,
    tool_input_guardrail,
)
from agents.items import ToolCallOutputItem
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool import tool_namespace

from effectgate import EffectGate, Keyring, money
from effectgate.testing import EffectRecorder, call, say
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals

from ._harness import context
from .test_native_approvals import FINANCE, REFUND, Shop
from .test_round10_openai import Shop as GuardedShop


class Billing:
    """A support agent whose refund tool sits in the SDK's `tool_namespace("billing")` (the SDK
    then keys its decisions by the qualified name `billing.refund_order`); the model calls the
    refund in that namespace, then answers twice."""

    def __init__(self, store_url: str, **options: Any) -> None:
        self.receiver = EffectRecorder()

        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        refund = function_call(
            "refund_order", {"order_id": "1042", "amount": 500}, call_id="c1", namespace="billing"
        )
        model = ScriptedModel(
            [ModelStep(output=[refund]), *(ModelStep(output=[assistant_message(t)]) for t in "ab")]
        )
        tools = tool_namespace(name="billing", description="Billing tools.", tools=[refund_order])
        self.agent = gate_agent(
            Agent(name="support", model=model, tools=tools),
            effects={"refund_order": money("finance", subject="order_id")},
            db=store_url,
            keyring=Keyring.generate(),
            **options,
        )
        self.gate: EffectGate = gate_of(self.agent)

    def decisions(self, approval_id: str) -> list[tuple[str, str, str]]:
        with self.gate.store.transaction() as conn:
            rows = self.gate.store.decisions(conn, approval_id)
        return [(d.approver_id, d.role, d.decision) for d in rows]


@pytest.fixture
def billing(store_url: str) -> Iterator[Callable[..., Billing]]:
    made: list[Billing] = []

    def make(**options: Any) -> Billing:
        made.append(Billing(store_url, **options))
        return made[-1]

    yield make
    for b in made:
        b.gate.close()


def _output(result: RunResult, call_id: str) -> str:
    [out] = [
        str(i.output)
        for i in result.new_items
        if isinstance(i, ToolCallOutputItem)
        and getattr(i.raw_item, "get", lambda _: None)("call_id") == call_id
    ]
    return out


def test_a_native_approve_of_a_namespaced_tool_runs_once_as_the_native_approver(
    billing: Callable[..., Billing],
) -> None:
    """The SDK keys the decision on a namespaced tool's call by its qualified name; effectgate
    asked for it by the bare name, found none, and told the model the approve needed a
    `native_approver` (which was configured): the approved refund never ran. It runs once, as
    the configured approver."""
    b = billing(native_approver=FINANCE)
    paused = Runner.run_sync(b.agent, "Refund order 1042", context=context("m1"))
    state = paused.to_state()
    [listed] = pending_approvals(state)
    assert listed.verified

    state.approve(listed.item)
    resumed = Runner.run_sync(b.agent, state)

    assert _output(resumed, "c1") == "refunded 500 on 1042"
    [row] = b.gate.store.approvals()
    assert row.status == "executed"
    assert b.decisions(row.id) == [("fiona", "finance", "approve")]
    assert b.receiver.count("refund") == 1


def test_a_native_reject_of_a_namespaced_tool_closes_its_approval(billing: Callable[..., Billing]) -> None:
    """A native `state.reject(item)` always closes the approval; on a namespaced tool the
    approval stayed pending (its subject busy for every other session) because the SDK's
    decision was looked up under the bare name. It is denied with the SDK's message as the
    reason, and nothing runs."""
    b = billing()
    paused = Runner.run_sync(b.agent, "Refund order 1042", context=context("m1"))
    state = paused.to_state()
    [listed] = pending_approvals(state)

    state.reject(listed.item, rejection_message="not this one")
    resumed = Runner.run_sync(b.agent, state)

    assert _output(resumed, "c1") == "not this one"
    [row] = b.gate.store.approvals()
    assert (row.status, row.reason) == ("denied", "not this one")
    assert b.decisions(row.id) == [("sdk-reject", "finance", "deny")]
    assert b.receiver.count("refund") == 0


def test_an_always_approve_in_a_follow_up_run_leaves_an_earlier_messages_paused_call_alone(
    store_url: str,
) -> None:
    """The application answers a follow-up message with a copy of the run context (effectgate's
    entry included, as a new run may carry it): message m1's refund of order 1042 is still
    paused in it. In m2 the model asks to refund order 2000 and the reviewer approves it with
    `always_approve=True`. Before the fix the sticky decision was settled against every record
    the context carried, m1's too, whose seal is for m1's run: the resumed m2 run ended with
    `TamperedState` ("the run state was edited") and the approved refund never ran. Now only
    this run's records are settled by a sticky decision: the 2000 refund runs once, as the
    configured approver, and m1's approval is left pending, undecided."""
    later = call("refund_order", id="c2", order_id="2000", amount=900)
    shop = Shop(store_url, [REFUND, later, say("Done.")], native_approver=FINANCE)
    try:
        first = Runner.run_sync(shop.agent, "Refund order 1042", context=context("m1"))
        follow = {**first.context_wrapper.context, "origin_message_id": "m2"}
        paused = Runner.run_sync(shop.agent, "And refund order 2000", context=follow)
        state = paused.to_state()
        [listed] = pending_approvals(state)
        assert listed.verified

        state.approve(listed.item, always_approve=True)
        resumed = Runner.run_sync(shop.agent, state)

        assert _output(resumed, "c2") == "refunded 900 on 2000"
        rows = {json.loads(r.args_json)["order_id"]: r for r in shop.gate.store.approvals()}
        assert (rows["2000"].status, rows["1042"].status) == ("executed", "pending")
        assert shop.decisions(rows["1042"].id) == []
        assert [d[:3] for d in shop.decisions(rows["2000"].id)] == [("fiona", "finance", "approve")]
        assert shop.receiver.count("refund") == 1
        assert shop.receiver.count("refund", order_id="2000", amount=900) == 1
    finally:
        shop.gate.close()


def test_an_always_approved_call_reusing_an_earlier_messages_call_id_runs_once(store_url: str) -> None:
    """As above, and the model numbers its call ids per run (as some Chat Completions providers
    do): after the always-approved refund of order 2000, its next answer refunds order 3000 as
    call "c1", the id of m1's paused refund in the context the follow-up copied. The SDK runs it
    without pausing (the sticky approval); effectgate settles it there, but kept m1's record of
    "c1" instead of this call's, so the refund was refused with "needs native_approver" although
    it was approved. It runs once as the configured approver; m1's refund stays pending."""
    later = [
        call("refund_order", id="c2", order_id="2000", amount=900),
        call("refund_order", id="c1", order_id="3000", amount=100),
        say("Done."),
    ]
    shop = Shop(store_url, [REFUND, *later], native_approver=FINANCE)
    try:
        first = Runner.run_sync(shop.agent, "Refund order 1042", context=context("m1"))
        follow = {**first.context_wrapper.context, "origin_message_id": "m2"}
        state = Runner.run_sync(shop.agent, "Refund orders 2000 and 3000", context=follow).to_state()
        [listed] = pending_approvals(state)

        state.approve(listed.item, always_approve=True)
        resumed = Runner.run_sync(shop.agent, state)

        assert _output(resumed, "c1") == "refunded 100 on 3000"
        rows = {json.loads(r.args_json)["order_id"]: r for r in shop.gate.store.approvals()}
        assert {k: r.status for k, r in rows.items()} == {
            "1042": "pending",
            "2000": "executed",
            "3000": "executed",
        }
        assert [d[:3] for d in shop.decisions(rows["3000"].id)] == [("fiona", "finance", "approve")]
        assert shop.receiver.count("refund") == 2
        assert shop.receiver.count("refund", order_id="1042") == 0
    finally:
        shop.gate.close()


def test_a_follow_up_run_on_a_copy_of_a_paused_context_leaves_the_paused_run_decidable(
    store_url: str,
) -> None:
    """A new run whose context copies a paused run's with a new message id is a new run (as
    `test_tampering` has it), but `{**context, ...}` copies effectgate's entry by reference:
    the follow-up signed its own identity into the paused run's entry, so the paused run (its
    result kept in memory) no longer verified. Its refund was listed unverified ("not the
    identity effectgate signed") and could not be approved at all. The follow-up's signature
    goes into an entry of its own: the paused refund is approved and runs once."""
    look = call("get_order", id="c9", order_id="1042")
    shop = Shop(store_url, [REFUND, look, say("Shipped."), say("Refunded.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund order 1042", context=context("m1"))
        follow = {**first.context_wrapper.context, "origin_message_id": "m2"}
        Runner.run_sync(shop.agent, "Where is order 1042?", context=follow)

        state = first.to_state()
        [listed] = pending_approvals(state)
        assert (listed.verified, listed.problem) == (True, None)
        approve_as(shop.gate, state, listed, FINANCE)
        resumed = Runner.run_sync(shop.agent, state)

        assert _output(resumed, "c1") == "refunded 500 on 1042"
        assert shop.receiver.count("get_order") == 1
        assert shop.receiver.count("refund", order_id="1042", amount=500) == 1
    finally:
        shop.gate.close()


@tool_input_guardrail
def whole_refunds_up_to_1000(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    """The application's own policy: a refund is a whole number of pence, at most 1000."""
    amount = json.loads(data.context.tool_arguments).get("amount")
    if not isinstance(amount, int) or amount > 1000:
        return ToolGuardrailFunctionOutput.reject_content("Refunds over 1000 are not allowed.")
    return ToolGuardrailFunctionOutput.allow()


def test_a_guardrail_refusing_a_call_that_did_not_pause_closes_no_earlier_approval(
    store_url: str,
) -> None:
    """The application runs the same message again with the same context dict (as
    `test_round15_openai` has it): m1's refund of 500 (call "c1") is waiting for finance. The
    model of the second run numbers its call ids again, and its call "c1" refunds order 2000
    with an amount that is not a number: the gate refuses it (Invalid, no approval, no pause)
    and the refund's input guardrail refuses it too. Before the fix the guardrail's refusal
    was applied to the record the context held for "c1", the first run's: the waiting 500
    refund of order 1042 was denied ("Refunds over 1000 are not allowed."). A guardrail's
    refusal closes only the approval the refused call itself registered: nothing is denied."""
    bad = call("refund_order", id="c1", order_id="2000", amount="99999")
    shop = GuardedShop(
        store_url, [REFUND, bad, say("I cannot do that.")], refund_guardrails=[whole_refunds_up_to_1000]
    )
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        again = Runner.run_sync(shop.agent, "Refund 1042", context=ctx)

        assert again.interruptions == []
        [row] = shop.gate.store.approvals()
        assert (json.loads(row.args_json), row.status) == ({"order_id": "1042", "amount": 500}, "pending")
        assert shop.receiver.count("refund") == 0
    finally:
        shop.gate.close()
