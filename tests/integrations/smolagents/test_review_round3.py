"""Review round 3 of the smolagents adapter: resuming (twice, stale, in another user's memory, while
another resume runs the call), the last allowed step, parallel steps of mixed classes, a CodeAgent's
loop across resumes, final answers beside a waiting call. Each runs in smolagents' real agent loop
with a scripted model; effects are counted at the shop's receiver."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Keyring, Refused
from effectgate.testing import Script, call, say, step
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    DecisionMismatch,
    Finished,
    GatedAgent,
    RunOutcome,
    restore_memory,
    save_memory,
)
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import EMAIL, REFUND, SUPPORT_LEAD, Paused, ShopGate, grant

from ._harness import support_agent

ADA = {"session_id": "s-ada", "user_id": "u1"}
GRACE = {"session_id": "s-grace", "user_id": "u2"}
TAGS = {"ticket_id": "t-17", "tags": ["urgent"]}
GRACE_TASK = "Grace here: where is my order 2001? I moved to 9 Elm Street"


def _ask(gated: GatedAgent, task: str, message_id: str = "m3", **options: Any) -> RunOutcome:
    return gated.run(task, origin_message_id=message_id, **ADA, **options)


def _paused(out: RunOutcome) -> list[Paused]:
    assert isinstance(out, AwaitingApproval), out
    return [Paused(p.approval_id, p.version, p.card.args_hash, p.card.tool) for p in out.pending]


def _shown(script: Script, since: int = 0) -> str:
    return "\n".join(str(m) for messages in script.seen[since:] for m in messages)


# -- the last allowed step


def test_a_pause_at_the_last_allowed_step_asks_the_model_nothing_more(shop_gate: ShopGate) -> None:
    """A ToolCallingAgent paused at its last allowed step: smolagents' max-steps handling would ask
    the model for a final answer while the refund waits (and keep it in memory). The run stops at
    the pause instead; approved, the refund runs once."""
    script = Script([call("refund_order", **REFUND), say("Refunded.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))

    out = _ask(gated, "Refund 1042", max_steps=1)

    [paused] = _paused(out)
    assert len(script.seen) == 1  # not asked for an answer while the refund waits
    assert [type(s).__name__ for s in gated.agent.memory.steps] == ["TaskStep", "ActionStep"]
    done = gated.resume(out, {paused.approval_id: Approve(grant(shop_gate.gate, paused))})
    assert isinstance(done, Finished)
    assert done.output == "Refunded."
    assert shop_gate.shop.receiver.count("refund") == 1
    script.assert_complete()


def test_a_swallowed_code_stop_at_the_last_allowed_step_asks_the_model_nothing_more(
    shop_gate: ShopGate,
) -> None:
    """A CodeAgent's code swallows the stop (a `return` in a `finally`) at its last allowed step:
    the model is not asked for a final answer while the refund waits."""
    swallow = """
        def refund_quietly():
            try:
                refund_order(order_id="1042", amount=12000, currency="GBP")
            finally:
                return "carry on"

        print(refund_quietly())
        """
    model = ScriptedCodeModel([swallow, 'final_answer("Refunded.")'])
    gated = support_agent(shop_gate.gate, model, kind="code")

    out = _ask(gated, "Refund 1042", max_steps=1)

    [paused] = _paused(out)
    assert len(model.seen) == 1
    done = gated.resume(out, {paused.approval_id: Approve(grant(shop_gate.gate, paused))})
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    model.assert_complete()


# -- resuming in the wrong memory, twice, concurrently, late


def test_resume_in_an_agent_now_holding_another_users_conversation_is_refused(shop_gate: ShopGate) -> None:
    """Ada's run paused; the same agent then served Grace (reset memory). Resuming Ada's pause there
    would show Grace's conversation to the model acting for Ada: refused before anything is
    decided (the refund does not run). With Ada's own memory restored it resumes, once."""
    keyring = Keyring.generate()
    script = Script(
        [call("refund_order", **REFUND), call("get_order", order_id="2001"), say("Delivered."), say("Done.")]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Ada here: refund order 1042")
    [paused] = _paused(out)
    blob = save_memory(gated.agent, keyring, awaiting=out, session_id="s-ada", user_id="u1")
    grace = gated.run(GRACE_TASK, origin_message_id="g1", **GRACE)
    assert isinstance(grace, Finished)
    token = grant(shop_gate.gate, paused)
    asked = len(script.seen)

    with pytest.raises(DecisionMismatch, match="another session's or user's conversation"):
        gated.resume(out, {paused.approval_id: Approve(token)})

    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["approved"]
    assert len(script.seen) == asked
    restore_memory(gated.agent, blob, keyring, awaiting=out, session_id="s-ada", user_id="u1")
    done = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert "Grace here" not in _shown(script, asked)
    script.assert_complete()


def test_the_same_pause_resumed_twice_runs_the_refund_once(shop_gate: ShopGate) -> None:
    """A retried resume (the same record and grant after the first finished) is served the stored
    result: one refund."""
    script = Script([call("refund_order", **REFUND), say("Refunded."), say("Refunded, as said.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042")
    [paused] = _paused(out)
    token = grant(shop_gate.gate, paused)
    first = gated.resume(out, {paused.approval_id: Approve(token)})
    again = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(first, Finished)
    assert isinstance(again, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [o.approval_id for _, o in again.decided] == [paused.approval_id]
    script.assert_complete()


def test_a_second_resume_while_the_first_runs_the_refund_is_not_recorded_as_denied(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers resume the same pause; the second comes while the first runs the refund. The
    refund lands once, and the second's outcome says it is in progress, not "denied" (the model
    would be told it did not run, and tell the user so)."""
    script = Script([call("refund_order", **REFUND), say("Refunded.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042")
    assert isinstance(out, AwaitingApproval)
    [paused] = _paused(out)
    token = grant(shop_gate.gate, paused)
    other_script = Script([say("Your refund is on its way.")])
    other = support_agent(shop_gate.gate, ScriptedModel(other_script))
    real = shop_gate.shop.provider.refund
    seconds: list[RunOutcome] = []

    def refund(**kwargs: Any) -> Any:  # the first resume is running the refund now
        if not seconds:
            seconds.append(other.resume(out, {paused.approval_id: Approve(token)}))
        return real(**kwargs)

    monkeypatch.setattr(shop_gate.shop.provider, "refund", refund)
    first = gated.resume(out, {paused.approval_id: Approve(token)})

    assert shop_gate.shop.receiver.count("refund") == 1
    [(_, ran)] = first.decided
    [(_, second)] = seconds[0].decided
    assert ran.approval_id == paused.approval_id
    assert isinstance(second, Refused)
    assert second.code == "in_progress"
    assert [a.status for a in shop_gate.store.approvals()] == ["executed"]


def test_an_expired_grant_is_not_recorded_as_a_denial(shop_gate: ShopGate) -> None:
    """A grant presented after it expired: nothing runs, and the outcome says expired (the
    approval was never denied)."""
    script = Script([call("refund_order", **REFUND), say("It did not go through.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042")
    [paused] = _paused(out)
    token = grant(shop_gate.gate, paused)
    shop_gate.clock.advance(shop_gate.gate.policy.token_ttl + 1)

    done = gated.resume(out, {paused.approval_id: Approve(token)})

    [(_, outcome)] = done.decided
    assert isinstance(outcome, Refused)
    assert outcome.code == "expired"
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] != ["denied"]


# -- parallel steps, final answers, CodeAgent loops


def test_a_final_answer_beside_a_waiting_call_does_not_finish_the_run(shop_gate: ShopGate) -> None:
    """One step: the refund and a final answer claiming it done. The run awaits the refund."""
    script = Script([step(call("refund_order", **REFUND), call("final_answer", answer="Refunded!"))])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042")
    assert [p.tool for p in _paused(out)] == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_parallel_step_of_every_class_runs_each_call_once_across_the_resume(shop_gate: ShopGate) -> None:
    """A read, a write, a refund and an email in one step, then the model issues the whole step
    again after the resume: the write, the refund and the email each land once."""
    calls = [
        ("get_order", {"order_id": "1042"}),
        ("update_ticket_tags", TAGS),
        ("refund_order", REFUND),
        ("send_email", EMAIL),
    ]
    script = Script(
        [step(*(call(n, **a) for n, a in calls)), step(*(call(n, **a) for n, a in calls)), say("Done.")]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042, tag and email me")
    paused = {p.tool: p for p in _paused(out)}
    assert sorted(paused) == ["refund_order", "send_email"]
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    done = gated.resume(
        out,
        {
            paused["refund_order"].approval_id: Approve(grant(shop_gate.gate, paused["refund_order"])),
            paused["send_email"].approval_id: Approve(
                grant(shop_gate.gate, paused["send_email"], SUPPORT_LEAD)
            ),
        },
    )
    assert isinstance(done, Finished)
    assert [shop_gate.shop.receiver.count(k) for k in ("ticket_tags", "refund", "email")] == [1, 1, 1]
    script.assert_complete()


LOOP = """
    for order, amount in [("1042", 12000), ("1043", 3500)]:
        update_ticket_tags(ticket_id="t-17", tags=["refund-" + order])
        refund_order(order_id=order, amount=amount, currency="GBP")
    final_answer("Both refunded.")
    """


def test_a_code_loop_of_gated_calls_pauses_at_each_and_runs_each_once(shop_gate: ShopGate) -> None:
    """A CodeAgent loop refunding two orders, regenerated after each resume: it pauses at each
    refund in turn, and every refund and write lands once."""
    model = ScriptedCodeModel([LOOP, LOOP, LOOP])
    gated = support_agent(shop_gate.gate, model, kind="code")
    out = _ask(gated, "Refund both my orders")
    [first] = _paused(out)
    out = gated.resume(out, {first.approval_id: Approve(grant(shop_gate.gate, first))})
    [second] = _paused(out)
    assert second.approval_id != first.approval_id
    done = gated.resume(out, {second.approval_id: Approve(grant(shop_gate.gate, second))})
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 2
    assert shop_gate.shop.receiver.count("ticket_tags") == 2
    model.assert_complete()


@pytest.mark.xfail(
    strict=True,
    reason="design decision: resume continues the run while an undecided call still waits (the "
    "continuation tells the model so) and returns Finished when the model answers, even when the "
    "answer claims that call done; LangGraph and OpenAI Agents stay paused on it",
)
def test_a_resume_that_leaves_a_call_waiting_does_not_finish(shop_gate: ShopGate) -> None:
    """Two gated calls paused; only the refund is decided. The model's answer claims both done:
    the run should still await the cancellation, not finish."""
    script = Script(
        [
            step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1")),
            say("All done: refunded and cancelled."),
        ]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = _ask(gated, "Refund 1042 and cancel my subscription")
    paused = {p.tool: p for p in _paused(out)}
    refund = paused["refund_order"]
    done = gated.resume(out, {refund.approval_id: Approve(grant(shop_gate.gate, refund))})
    assert shop_gate.shop.receiver.count("refund") == 1
    assert sorted(a.status for a in shop_gate.store.approvals()) == ["executed", "pending"]
    assert isinstance(done, AwaitingApproval)


def test_a_code_final_answer_after_a_refused_call_does_not_finish_unread(shop_gate: ShopGate) -> None:
    """Ada's code refunds Grace's order (out of her scope: refused, nothing runs), then answers
    that it was refunded in the same snippet. The refusal stops the snippet as a plain tool's
    failure would: the run does not finish on that answer, the model reads the refusal first."""
    claim = "Refund of order 2001 issued."
    refund = 'refund_order(order_id="2001", amount=50000, currency="GBP")'
    model = ScriptedCodeModel([f'{refund}\nfinal_answer("{claim}")', 'final_answer("It was refused.")'])
    gated = support_agent(shop_gate.gate, model, kind="code")
    out = _ask(gated, "Refund order 2001")
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["rejected"]
    assert isinstance(out, Finished)
    assert out.output != claim
    assert len(model.seen) == 2  # asked again, with the refusal as the failed snippet's error
    model.assert_complete()
