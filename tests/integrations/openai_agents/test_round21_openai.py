"""Review round 21: the OpenAI Agents adapter. An outcome decided in one run answering a call of
another run that reused its call id; a call its input guardrail refused in deferred mode touching
another call's waiting approval (alone, in a turn, or answered after the turn began to register).
Strict xfails (design decisions): the same with a sequential turn or with pre-approval guardrails
in approval mode, and a second run on the same context dict replacing a paused run's record. Each
test reproduced a defect before its fix; scripted models drive the SDK's real Runner, effects are
counted at the receiver, and every test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import (
    RunConfig,
    RunHooks,
    Runner,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    tool_input_guardrail,
)
from agents.run_config import ToolExecutionConfig

from effectgate import CallContext, Pending
from effectgate.testing import call, say, step
from effectgate_openai_agents import approve_as, deferred_operations, pending_approvals

from ._harness import context
from .test_native_approvals import FINANCE
from .test_native_approvals import Shop as NativeShop
from .test_round10_openai import EMAIL, Shop, refunds_up_to_1000
from .test_round20_openai import _output

BOB = CallContext(session_id="s-bob", origin_message_id="b1", user_id="u2", agent_id="support")
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)


def _orders_under_review(frozen: set[str]) -> Any:
    """The application's own policy: no refund of an order under review (a set it changes)."""

    @tool_input_guardrail
    def not_under_review(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        if json.loads(data.context.tool_arguments).get("order_id") in frozen:
            return ToolGuardrailFunctionOutput.reject_content("That order is under review.")
        return ToolGuardrailFunctionOutput.allow()

    return not_under_review


def _rows(shop: Shop) -> dict[tuple[str, int], Any]:
    return {
        (json.loads(r.args_json)["order_id"], json.loads(r.args_json)["amount"]): r
        for r in shop.gate.store.approvals()
        if r.tool == "refund_order"
    }


def test_an_always_approved_call_is_not_answered_from_another_runs_outcome(store_url: str) -> None:
    """The application runs the same message again with the same context dict. In the first run
    the refund of order 1042 (call "c1") is refused (Bob's refund of it waits: the order is
    busy), and the application's guardrail refuses the call too (the order is under review), so
    the SDK never invokes it. Bob's refund is then denied and the review ends. In the second run
    the reviewer approves a refund of order 2000 with `always_approve=True`, and the model then
    refunds order 1042 as call "c1" again: the SDK runs it without asking `needs_approval`.
    Before the fix the first run's refusal, cached for (session, message, call id, arguments),
    answered it: the approved refund was refused. Each run's calls are answered from that run's
    own decisions: it runs once, as the configured approver."""
    frozen = {"1042"}
    script = [
        REFUND,
        say("I cannot refund that now."),
        call("refund_order", id="c2", order_id="2000", amount=900),
        REFUND,
        say("Done."),
    ]
    shop = Shop(store_url, script, native_approver=FINANCE, refund_guardrails=[_orders_under_review(frozen)])
    try:
        bobs = shop.gate.call("refund_order", {"order_id": "1042", "amount": 100}, BOB)
        assert isinstance(bobs, Pending)
        ctx = context("m1")
        first = Runner.run_sync(shop.agent, "Refund 1042 and 2000", context=ctx)
        assert first.interruptions == []
        shop.gate.deny(bobs.approval_id, approver=FINANCE, reason="duplicate", version=bobs.version)
        frozen.clear()

        state = Runner.run_sync(shop.agent, "Refund 1042 and 2000", context=ctx).to_state()
        [item] = state.get_interruptions()
        state.approve(item, always_approve=True)
        resumed = Runner.run_sync(shop.agent, state)

        assert _output(resumed, "c1") == "refunded 500 on 1042"
        rows = _rows(shop)
        assert rows[("1042", 500)].status == "executed"
        assert shop.receiver.count("refund", order_id="1042", amount=500) == 1
        assert shop.receiver.count("refund") == 2
    finally:
        shop.gate.close()


def _waiting_refund_untouched(shop: Shop) -> None:
    [row] = [r for r in shop.gate.store.approvals() if r.tool == "refund_order"]
    assert (json.loads(row.args_json), row.status, row.version) == (
        {"order_id": "1042", "amount": 500},
        "pending",
        1,
    )
    with shop.gate.store.transaction() as conn:
        assert shop.gate.store.decisions(conn, row.id) == []
    assert shop.receiver.count("refund") == 0


def test_a_deferred_call_its_guardrail_refuses_leaves_a_waiting_refund_alone(store_url: str) -> None:
    """Deferred mode. The first run defers a refund of 500 on order 1042 (it waits for
    finance); the application runs the message again with the same context dict, and the model
    now asks to refund 99999 on the same order, which the refund's guardrail refuses. Before the
    fix the refused call was registered only to be denied: the registration amended the waiting
    refund to 99999 (version 2) and the guardrail's denial closed it, so the refund of 500 was
    lost. A refused call that registered nothing registers nothing: the waiting refund stays
    as it was, undecided."""
    big = call("refund_order", id="c1", order_id="1042", amount=99999)
    shop = Shop(
        store_url, [REFUND, big, say("I cannot.")], mode="deferred", refund_guardrails=[refunds_up_to_1000]
    )
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        again = Runner.run_sync(shop.agent, "Refund 1042", context=ctx)

        assert again.final_output == "I cannot."
        _waiting_refund_untouched(shop)
    finally:
        shop.gate.close()


def test_a_refused_call_of_a_deferred_turn_leaves_a_waiting_refund_alone(store_url: str) -> None:
    """As above, with the refused refund in one model answer with an email: the gate registers
    a turn's gated calls together, and the refused refund was registered with the email (it
    amended the waiting refund, which its guardrail's denial then closed). The turn registers
    the email alone: it is deferred, and the waiting refund stays as it was."""
    big = call("refund_order", id="c1", order_id="1042", amount=99999)
    script = [REFUND, step(big, EMAIL), say("Queued.")]
    shop = Shop(store_url, script, mode="deferred", refund_guardrails=[refunds_up_to_1000])
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        again = Runner.run_sync(shop.agent, "Refund 1042 and email Ada", context=ctx)

        [email] = deferred_operations(again)
        assert email["tool"] == "send_email"
        _waiting_refund_untouched(shop)
        assert shop.receiver.count("email") == 0
    finally:
        shop.gate.close()


class _EmailStarts(RunHooks[Any]):
    """Run hooks that tell when the SDK is about to invoke the email (its guardrails passed)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        if tool.name == "send_email":
            self.started.set()


def test_a_slow_guardrail_refusing_a_deferred_turns_call_leaves_a_waiting_refund_alone(
    store_url: str,
) -> None:
    """As above, with a guardrail that awaits a service: it answers only after the SDK started
    invoking the email, whose call registers the turn. Before the fix the email's registration
    took the refund with it (the waiting refund amended to 99999) while the guardrail was still
    running. A registration waits for the guardrails running for its turn's calls: the refused
    refund is left out, the email is deferred, and the waiting refund stays as it was."""
    hooks = _EmailStarts()

    @tool_input_guardrail
    async def slow_refund_check(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        out: ToolGuardrailFunctionOutput = refunds_up_to_1000.guardrail_function(data)  # type: ignore[assignment]
        if out.behavior["type"] != "allow":  # the service answers once the email is under way
            await asyncio.wait_for(hooks.started.wait(), 10)
            for _ in range(20):  # the email's invoke reaches its registration meanwhile
                await asyncio.sleep(0)
        return out

    big = call("refund_order", id="c1", order_id="1042", amount=99999)
    script = [REFUND, step(big, EMAIL), say("Queued.")]
    shop = Shop(store_url, script, mode="deferred", refund_guardrails=[slow_refund_check])
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        again = Runner.run_sync(shop.agent, "Refund 1042 and email Ada", context=ctx, hooks=hooks)

        assert hooks.started.is_set()
        [email] = deferred_operations(again)
        assert email["tool"] == "send_email"
        _waiting_refund_untouched(shop)
    finally:
        shop.gate.close()


@pytest.mark.xfail(
    strict=True,
    reason="design decision: with max_function_tool_concurrency the SDK starts a response's later "
    "calls only after earlier ones end, so the email's call registers the turn (GatedTools._register "
    "-> gate.call_step) before the refund's guardrail has started: the refund is registered with it "
    "and amends the waiting approval on its subject, and its guardrail's refusal then leaves it "
    "alone. The fix goes in _tools._register: leave out of a turn's registration each gated call "
    "whose tool has input guardrails that have not answered yet (it registers alone once invoked), "
    "which changes how a turn's calls register together (two calls of one tool register neither)",
)
def test_a_guardrail_refusing_a_later_call_of_a_sequential_turn_leaves_a_waiting_refund_alone(
    store_url: str,
) -> None:
    """As above, with the SDK running one call at a time and the email first in the answer."""
    big = call("refund_order", id="c1", order_id="1042", amount=99999)
    script = [REFUND, step(EMAIL, big), say("Queued.")]
    shop = Shop(store_url, script, mode="deferred", refund_guardrails=[refunds_up_to_1000])
    one_at_a_time = RunConfig(tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1))
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        Runner.run_sync(shop.agent, "Email Ada and refund 1042", context=ctx, run_config=one_at_a_time)

        _waiting_refund_untouched(shop)
    finally:
        shop.gate.close()


PRE_APPROVAL = RunConfig(tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True))


@pytest.mark.xfail(
    strict=True,
    reason="design decision: with pre_approval_tool_input_guardrails the SDK asks needs_approval "
    "(which registers the call: the core amends the waiting approval of the same message in place) "
    "before it runs the guardrails, and a refusal then finds an approval it cannot give back its "
    "earlier arguments. The fix goes in GatedTools.needs_approval (_tools): run a gated tool's own "
    "input guardrails before registering when the run asks for them before approval (the SDK gives "
    "needs_approval no RunConfig, so this needs the run's config recorded by gate_agent's hooks), "
    "and register nothing for a call they refuse",
)
def test_a_call_its_pre_approval_guardrail_refuses_leaves_a_paused_refund_alone(store_url: str) -> None:
    """Approval mode with the SDK's pre-approval tool input guardrails. The first run pauses on a
    refund of 500 on order 1042; the application runs the same message again with the same
    context dict and the model asks for 99999 on that order, which the guardrail refuses. The
    paused refund must stay as it was (version 1, 500, undecided); it was amended to 99999 and
    then denied as the guardrail's refusal."""
    big = call("refund_order", id="c7", order_id="1042", amount=99999)
    shop = Shop(store_url, [REFUND, big, say("I cannot.")], refund_guardrails=[refunds_up_to_1000])
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx, run_config=PRE_APPROVAL)
        again = Runner.run_sync(shop.agent, "Refund 1042", context=ctx, run_config=PRE_APPROVAL)

        assert again.interruptions == []
        _waiting_refund_untouched(shop)
    finally:
        shop.gate.close()


@pytest.mark.xfail(
    strict=True,
    reason="design decision: effectgate's records of paused calls are keyed by call id in the run "
    "context's one 'effectgate' entry, and two runs on the same context dict (the same identity) "
    "share it, so the second run's record of call 'c1' replaces the paused run's (copying the "
    "entry, as _context._check_identity does for another identity, cannot help: the dict itself "
    "is shared). The fix goes in _context/_records: key each paused call's record by its run too "
    "(a run id sealed into the record and kept with the SDK's run state), a snapshot format change",
)
def test_a_rerun_on_the_same_context_leaves_the_paused_first_run_decidable(store_url: str) -> None:
    """The first run pauses on a refund of 500 on order 1042 (call "c1"), kept in memory; the
    application runs the same message again with the same context dict and the model, numbering
    its calls again, pauses on a refund of order 2000 as "c1". The first run's refund must still
    be listed verified and run once when approved; its record was replaced by the second run's,
    so it was listed as edited ("the run state was edited") and could not be approved."""
    again = call("refund_order", id="c1", order_id="2000", amount=900)
    shop = NativeShop(store_url, [REFUND, again, say("Refunded.")])
    try:
        ctx = context("m1")
        first = Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)

        state = first.to_state()
        [listed] = pending_approvals(state)
        assert (listed.verified, listed.problem) == (True, None)
        approve_as(shop.gate, state, listed, FINANCE)
        resumed = Runner.run_sync(shop.agent, state)

        assert _output(resumed, "c1") == "refunded 500 on 1042"
        assert shop.receiver.count("refund", order_id="1042", amount=500) == 1
    finally:
        shop.gate.close()
