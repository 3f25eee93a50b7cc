"""Review round 14 of the smolagents adapter. Each test reproduced a defect before its fix; effects
are counted at the receiver (the shop's recorder, or a list the tool appends to)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from smolagents import CodeAgent, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from effectgate import Approver, write
from effectgate.testing import FakeClock, Script, call, say, step
from effectgate_smolagents import Approve, AwaitingApproval, Deny, Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, ShopGate, grant, open_shop_gate

from ._harness import support_agent


@pytest.fixture
def shop_on_both(store_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    """The shop's gate on SQLite and on PostgreSQL."""
    with open_shop_gate(store_url, clock) as parts:
        yield parts


def _paused_on_refund_and_email(shop: ShopGate) -> tuple[GatedAgent, AwaitingApproval, ScriptedModel]:
    script = Script(
        [step(call("refund_order", id="c1", **REFUND), call("send_email", id="c2", **EMAIL)), say("Done.")]
    )
    model = ScriptedModel(script)
    gated = support_agent(shop.gate, model)
    out = gated.run("Refund 1042 and tell me", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, AwaitingApproval)
    assert [p.card.tool for p in out.pending] == ["refund_order", "send_email"]
    return gated, out, model


@pytest.mark.parametrize("edited", ["not json at all", "[1, 2]"])
def test_a_resume_goes_on_when_a_still_waiting_calls_record_was_edited(
    shop_on_both: ShopGate, edited: str
) -> None:
    """A run paused on a refund and an email; the record is kept (`to_dict`) and read back
    (`from_dict`, which re-reads each card from the store). The email's stored arguments were
    edited into something that is not a JSON object. Finance approves the refund: it ran, then
    `resume` crashed with a raw ValueError/TypeError writing the model's continuation, so the run
    never went on and the model was never told the refund ran. The edited record must take down
    nothing but itself: the refund runs once, the run continues, the email never runs, and the
    model is not shown the edited text as the call's arguments."""
    shop = shop_on_both
    gated, out, model = _paused_on_refund_and_email(shop)
    refund, email = out.pending
    with shop.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :v WHERE id = :i"),
            {"v": edited, "i": email.approval_id},
        )
    back = AwaitingApproval.from_dict(out.to_dict(), shop.gate)
    done = gated.resume(back, {refund.approval_id: Approve(grant(shop.gate, out.paused[0]))})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1
    assert shop.shop.receiver.count("email") == 0
    assert {a.id: a.status for a in shop.store.approvals()}[email.approval_id] == "pending"
    model.script.assert_complete()  # the model was asked again, with the continuation
    told = str(gated.agent.memory.steps[-2].task)  # the continuation, the resumed run's task
    assert "refund_order" in told
    assert "send_email" in told
    assert edited not in told


@tool
def tag_ticket(ticket_id: str) -> str:
    """Tag a ticket at the helpdesk provider.

    Args:
        ticket_id: the ticket to tag.
    """
    TAGGED.append(ticket_id)
    raise TimeoutError("the helpdesk did not answer")


TAGGED: list[str] = []


@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_a_write_whose_outcome_is_unknown_is_not_told_to_the_model_as_refused(
    store_url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that times out may have happened: the gate records it `needs_reconciliation` and
    raises `NeedsReconciliation`. The adapter told the model "Refused: key ... needs
    reconciliation" (a refusal: nothing happened, so try again, maybe with other arguments),
    where the LangGraph and OpenAI adapters say the outcome is unknown, it may have happened, and
    not to call it again. The model must be told that, and a second call runs nothing."""
    TAGGED.clear()
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + secrets.token_hex(32))
    agent: Any
    if kind == "code":
        code = ['tag_ticket(ticket_id="t-17")', 'tag_ticket(ticket_id="t-17")', 'final_answer("done")']
        agent = CodeAgent(tools=[tag_ticket], model=ScriptedCodeModel(code), verbosity_level=LogLevel.OFF)
    else:
        script = Script(
            [call("tag_ticket", ticket_id="t-17"), call("tag_ticket", ticket_id="t-17"), say("ok")]
        )
        agent = ToolCallingAgent(
            tools=[tag_ticket], model=ScriptedModel(script), verbosity_level=LogLevel.OFF
        )
    with GatedAgent(agent, effects={"tag_ticket": write()}, db=store_url) as gated:
        out = gated.run("Tag t-17", session_id="s", origin_message_id="m1", user_id="u1")
        assert isinstance(out, Finished)
        assert TAGGED == ["t-17"]  # ran once; the second call ran nothing
        [record] = gated.gate.store.idempotency_records()
        assert record.status == "needs_reconciliation"
        shown = [str(s.observations or "") + str(s.error or "") for s in agent.memory.steps[1:3]]
    for text in shown:
        assert "Refused" not in text
        assert "may have happened" in text
        assert "Do not call it again" in text


@pytest.mark.parametrize(
    ("approver", "reason", "what"),
    [("sam", "not this address", "Approver"), (Approver("sam", "support_lead"), 7, "reason")],
)
def test_a_deny_with_a_bad_approver_or_reason_is_a_clear_error_and_runs_nothing(
    shop_on_both: ShopGate, approver: Any, reason: Any, what: str
) -> None:
    """`Deny(approver, reason)` is a dataclass the application fills in. One with an approver that
    is not an `Approver` (a user id) or a reason that is not text raised a raw AttributeError
    from inside the adapter; `gate.deny` itself says TypeError naming what is wrong. The resume
    must say so too, before anything is decided or run (the refund approved beside it included)."""
    shop = shop_on_both
    gated, out, _ = _paused_on_refund_and_email(shop)
    refund, email = out.pending
    token = grant(shop.gate, out.paused[0])
    with pytest.raises(TypeError, match=what):
        gated.resume(out, {refund.approval_id: Approve(token), email.approval_id: Deny(approver, reason)})
    assert shop.shop.receiver.count("refund") == 0
    assert shop.shop.receiver.count("email") == 0
    assert {a.id: a.status for a in shop.store.approvals()} == {
        refund.approval_id: "approved",
        email.approval_id: "pending",
    }
    assert shop.store.executions() == []
    assert FINANCE.role == "finance"


@pytest.mark.parametrize(
    "snippet",
    [
        'update_ticket_tags(ticket_id="t-17", tags="urgent")\nfinal_answer("Tagged as urgent")',
        'try:\n    update_ticket_tags(ticket_id="t-17")\nexcept Exception:\n    pass\nfinal_answer("Tagged")',
    ],
)
def test_code_cannot_answer_a_call_with_a_bad_argument_done_unread(
    shop_on_both: ShopGate, snippet: str
) -> None:
    """A CodeAgent's code calls a write with a bad argument (a string for a list, or one missing),
    then answers in the same block. The gate refused the call (`Invalid`, nothing ran), but the
    adapter handed its text back as the call's value, so the code went on and the run finished
    with "Tagged as urgent": the model never read the error, and nothing was tagged. A refusal is
    raised in code for that reason (round 10); a bad argument must be too: the run does not end
    on that answer, and the model is asked again after reading the error."""
    shop = shop_on_both
    model = ScriptedCodeModel([snippet, 'final_answer("I could not tag it")'])
    gated = support_agent(shop.gate, model, kind="code")
    out = gated.run("Tag t-17 as urgent", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, Finished)
    assert out.output == "I could not tag it"
    assert shop.shop.receiver.count("ticket_tags") == 0
    assert shop.store.executions() == []
