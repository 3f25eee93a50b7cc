"""Review round 22 of the OpenAI Agents adapter: today's deferred-mode guardrail waits
(`_guarding`). No defect was found there; this pins the order round 21's tests left out. Scripted
models drive the SDK's real Runner, on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

from agents import Runner

from effectgate.testing import call, say, step
from effectgate_openai_agents import deferred_operations

from ._harness import context
from .test_round10_openai import EMAIL, Shop, refunds_up_to_1000
from .test_round21_openai import REFUND, _waiting_refund_untouched


def test_a_refused_call_after_an_email_in_a_deferred_turn_leaves_a_waiting_refund_alone(
    store_url: str,
) -> None:
    """The email comes first in the answer, so its task starts first and registers the turn: it
    still waits for the refund's guardrail (which refuses it) and registers alone."""
    big = call("refund_order", id="c1", order_id="1042", amount=99999)
    script = [REFUND, step(EMAIL, big), say("Queued.")]
    shop = Shop(store_url, script, mode="deferred", refund_guardrails=[refunds_up_to_1000])
    try:
        ctx = context("m1")
        Runner.run_sync(shop.agent, "Refund 1042", context=ctx)
        again = Runner.run_sync(shop.agent, "Email Ada and refund 1042", context=ctx)

        [email] = deferred_operations(again)
        assert email["tool"] == "send_email"
        _waiting_refund_untouched(shop)
    finally:
        shop.gate.close()
