"""Review round 24: the OpenAI Agents adapter. A run of a message whose approval was already
approved (its grant held by the paused first run) asking for other arguments on the same subject:
the gate answers with that approval (the intent key, never a second one), and the adapter paused
the call on an approval of other arguments, which nothing could decide (every decision, even a
rejection, refused it as an edited state); and `reject` of a paused call whose approval a retried
request amended since (a stale version), or that expired, raising, so the run could never go on.
Scripted models drive the SDK's real Runner, effects are counted at the receiver, and every test
runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
import json

from agents import Runner, RunState

from effectgate.testing import call, say
from effectgate_openai_agents import approve_as, pending_approvals, reject

from ._harness import context
from .test_native_approvals import FINANCE, REFUND, Shop
from .test_round6_openai import Shop as ClockedShop
from .test_round20_openai import _output


def test_a_rerun_asking_other_arguments_of_an_approved_refund_does_not_pause_on_it(store_url: str) -> None:
    """The first run of message m1 pauses on a refund of 500 on order 1042, which finance
    approves on its restored state. Before that state is resumed, the application runs m1 again
    (a retried request) and the model now asks for 900 on the same order: the gate answers with
    m1's approved approval of 500. Before the fix the second run paused on that approval: listed
    as "the run state was edited", and approving or rejecting it raised `TamperedState`, so the
    run could never go on. It does not pause: the model is told the call has not run (the
    approval is for other arguments), and the first run's approved refund runs once."""
    other = call("refund_order", id="c2", order_id="1042", amount=900)
    shop = Shop(store_url, [REFUND, other, say("I could not."), say("Refunded.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        state = asyncio.run(RunState.from_string(shop.agent, first.to_state().to_string()))
        [paused] = pending_approvals(state)
        approve_as(shop.gate, state, paused, FINANCE)

        again = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        assert again.interruptions == []
        told = _output(again, "c2")
        assert "has not run" in told
        assert str(paused.approval_id) in told
        done = Runner.run_sync(shop.agent, state)

        assert _output(done, "c1") == "refunded 500 on 1042"
        [row] = shop.gate.store.approvals()
        assert (row.status, json.loads(row.args_json)) == ("executed", {"order_id": "1042", "amount": 500})
        assert shop.receiver.count("refund", order_id="1042", amount=500) == 1
        assert shop.receiver.count("refund") == 1
    finally:
        shop.gate.close()


def test_reject_of_a_paused_call_whose_approval_moved_on_lets_the_run_go_on(store_url: str) -> None:
    """The first run of message m1 pauses on a refund of 500 on order 1042 (version 1); a retried
    run of m1 asks for 900 on that order, which amends the approval to version 2 and pauses. The
    reviewer rejects the first run's call with `reject`. Before the fix it raised `StaleApproval`
    and left the call paused: every resume of the first run paused on it again. Now the SDK call
    is rejected (the model is told it has not run, the approval moved on) and version 2, which no
    one decided, stays pending: approved, it runs once, the first run's 500 never."""
    other = call("refund_order", id="c2", order_id="1042", amount=900)
    shop = Shop(store_url, [REFUND, other, say("Not refunded."), say("Refunded 900.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        state = asyncio.run(RunState.from_string(shop.agent, first.to_state().to_string()))
        again = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        [stale] = pending_approvals(state)

        assert reject(shop.gate, state, stale, approver=FINANCE, reason="not this one") is None
        ended = Runner.run_sync(shop.agent, state)
        assert ended.interruptions == []
        assert "has not run" in _output(ended, "c1")
        [row] = shop.gate.store.approvals()
        assert (row.status, row.version) == ("pending", 2)

        later = again.to_state()
        [current] = pending_approvals(later)
        approve_as(shop.gate, later, current, FINANCE)
        Runner.run_sync(shop.agent, later)
        assert shop.receiver.count("refund", order_id="1042", amount=900) == 1
        assert shop.receiver.count("refund") == 1
    finally:
        shop.gate.close()


def test_reject_of_a_paused_call_whose_approval_expired_lets_the_run_go_on(store_url: str) -> None:
    """The run pauses on a refund and no one decides it before its approval expires (the clock
    moves ten days). Rejecting it then with `reject` raised `ApprovalExpired` and left the call
    paused (each resume paused on it again). The SDK call is rejected: the run ends, the model is
    told it has not run, and the refund never runs."""
    shop = ClockedShop(store_url, [REFUND, say("Not refunded.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        state = asyncio.run(RunState.from_string(shop.agent, first.to_state().to_string()))
        [paused] = pending_approvals(state)
        shop.clock.advance(10 * 24 * 3600)

        assert reject(shop.gate, state, paused, approver=FINANCE, reason="too late") is None
        ended = Runner.run_sync(shop.agent, state)

        assert ended.interruptions == []
        assert _output(ended, "c1").startswith("Refused (expired)")
        [row] = shop.gate.store.approvals()
        assert row.status == "expired"
        assert shop.receiver.count("refund") == 0
    finally:
        shop.gate.close()
