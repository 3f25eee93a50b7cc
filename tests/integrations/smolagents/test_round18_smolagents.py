"""Review round 18 of the smolagents adapter: what a resume reads back before it decides (the
approval's status column, a spent grant's record), bad input to `resume` and the memory calls,
a model-written call id, and the scripted model. Each test reproduced a defect before its fix;
effects are counted at the receiver (the shop's recorder) and in the store's records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from effectgate import Executed, Keyring, Refused
from effectgate.errors import PolicyViolation
from effectgate.testing import FakeClock, Script, ScriptError, call, say, step
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Deny,
    Finished,
    GatedAgent,
    restore_memory,
    save_memory,
)
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, ShopGate, grant, open_shop_gate

from ._harness import support_agent

ADA = {"session_id": "s-ada", "user_id": "u1"}


@pytest.fixture
def shop_on_both(store_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    """The shop's gate on SQLite and on PostgreSQL."""
    with open_shop_gate(store_url, clock) as parts:
        yield parts


def _paused(shop: ShopGate, *turns: Any) -> tuple[GatedAgent, AwaitingApproval, ScriptedModel]:
    model = ScriptedModel(Script(list(turns)))
    gated = support_agent(shop.gate, model)
    out = gated.run("Help with order 1042", origin_message_id="m1", **ADA)
    assert isinstance(out, AwaitingApproval)
    return gated, out, model


def _edit_status(shop: ShopGate, approval_id: str, status: str, reason: str | None = None) -> None:
    """The approval's status column (no seal covers it) edited in the database."""
    with shop.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s, reason = :r WHERE id = :i"),
            {"s": status, "r": reason, "i": approval_id},
        )


@pytest.mark.parametrize("reason", ['{"$redacted": "looks erased"}', "no \ud800"])
def test_a_resume_with_a_denial_the_gate_refuses_records_no_other_denial(
    shop_on_both: ShopGate, reason: str
) -> None:
    """A run paused on a refund and an email; the resume denies both, the second with a reason
    the gate refuses (one that starts like an erasure marker, or holds a lone surrogate). The
    first denial was recorded before the second raised PolicyViolation: a resume that raised had
    half applied its decisions. `resume` checks every decision before it applies any: the raise
    changes nothing, both calls still wait, nothing ran and the model was not asked."""
    shop = shop_on_both
    gated, out, model = _paused(
        shop, step(call("refund_order", **REFUND), call("send_email", **EMAIL)), say("Done.")
    )
    first, second = out.pending
    approvers = {"refund_order": FINANCE, "send_email": SUPPORT_LEAD}
    decisions = {
        first.approval_id: Deny(approvers[first.card.tool], "Not this one."),
        second.approval_id: Deny(approvers[second.card.tool], reason),
    }
    with pytest.raises(PolicyViolation):
        gated.resume(out, decisions)
    assert sorted(a.status for a in shop.store.approvals()) == ["pending", "pending"]
    assert shop.shop.receiver.effects == []
    assert model.script.remaining == 1


def test_a_late_denial_of_a_call_that_ran_is_told_it_ran_whatever_its_status_column_says(
    shop_on_both: ShopGate,
) -> None:
    """The refund was approved and ran (the resume's run finished). Its status column, which no
    seal covers, was then edited to "denied" with a reason. A second reviewer's resume denying
    it read that column and told the model (and the application) that the refund was denied and
    did not run, while the money had moved. It must be answered with the stored result, as a
    denial that came too late always is; nothing runs again."""
    shop = shop_on_both
    gated, out, _ = _paused(shop, call("refund_order", **REFUND), say("Refunded."), say("Sorted."))
    [paused] = out.pending
    gated.resume(out, {paused.approval_id: Approve(grant(shop.gate, paused))})
    assert shop.shop.receiver.count("refund") == 1
    _edit_status(shop, paused.approval_id, "denied", "It was never refunded.")
    done = gated.resume(out, {paused.approval_id: Deny(FINANCE, "Too much.")})
    [(_, outcome)] = done.decided
    assert isinstance(outcome, Executed), outcome
    told = str(gated.agent.memory.steps[-2].task)
    assert "has run" in told
    assert "never refunded" not in told
    assert shop.shop.receiver.count("refund") == 1


def test_a_spent_grant_whose_outcome_is_unknown_is_never_told_it_did_not_run(shop_on_both: ShopGate) -> None:
    """The refund's provider took the money and timed out: its execution needs reconciliation.
    Its status column was then edited to "failed". A second resume of the same grant read that
    column and told the model "did not run" (code `failed`), though the refund happened at the
    provider. It must be told what the execution record says: the outcome is unknown (it may
    have run; do not call it again); the refund is not run again."""
    shop = shop_on_both
    gated, out, _ = _paused(shop, call("refund_order", **REFUND), say("Pending."), say("Pending."))
    [paused] = out.pending
    token = grant(shop.gate, paused)
    shop.shop.provider.timeouts_to_inject = 1
    first = gated.resume(out, {paused.approval_id: Approve(token)})
    assert [o.code for _, o in first.decided if isinstance(o, Refused)] == ["needs_reconciliation"]
    _edit_status(shop, paused.approval_id, "failed")
    again = gated.resume(out, {paused.approval_id: Approve(token)})
    [(_, outcome)] = again.decided
    assert isinstance(outcome, Refused)
    assert outcome.code == "needs_reconciliation", outcome
    told = str(gated.agent.memory.steps[-2].task)
    assert "may have run" in told
    assert "did not run" not in told
    assert shop.shop.receiver.count("refund") == 1


def test_bad_input_to_resume_and_restore_memory_is_a_clear_type_error(shop_on_both: ShopGate) -> None:
    """`resume` (or `decide`) given the record's `to_dict()` (not `AwaitingApproval.from_dict(data,
    gate)`), or decisions as a list, raised a raw AttributeError from deep inside;
    `restore_memory` given a blob as text raised "startswith first arg must be str", and
    `save_memory` / `restore_memory` given `awaiting=out` for a run that finished (or a stored
    record) an AttributeError. Each must be a TypeError saying what to pass, before anything is
    decided or restored: the refund does not run, the memory is as it was, the model is not
    asked."""
    shop = shop_on_both
    gated, out, model = _paused(shop, call("refund_order", **REFUND), say("Refunded."))
    [paused] = out.pending
    token = grant(shop.gate, paused)
    with pytest.raises(TypeError, match="from_dict"):
        gated.resume(out.to_dict(), {paused.approval_id: Approve(token)})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="from_dict"):
        gated.decide(out.to_dict(), {paused.approval_id: Approve(token)})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        gated.resume(out, [Approve(token)])  # type: ignore[arg-type]
    keyring = Keyring.generate()
    blob = save_memory(gated.agent, keyring, awaiting=out, **ADA)
    steps = gated.agent.memory.steps
    with pytest.raises(TypeError, match="bytes"):
        restore_memory(gated.agent, blob.decode("latin-1"), keyring, awaiting=out, **ADA)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AwaitingApproval"):
        save_memory(gated.agent, keyring, awaiting=out.to_dict(), **ADA)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AwaitingApproval"):
        restore_memory(gated.agent, blob, keyring, awaiting=Finished(output="x"), **ADA)  # type: ignore[arg-type]
    assert gated.agent.memory.steps is steps
    assert shop.shop.receiver.count("refund") == 0
    assert model.script.remaining == 1
    done = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(done.decided[0][1], Executed)
    assert shop.shop.receiver.count("refund") == 1


class _Answers(Model):  # type: ignore[misc]
    """A model answering each step with the next prepared message; strict: one too many raises."""

    def __init__(self, *messages: ChatMessage) -> None:
        super().__init__(model_id="prepared")
        self.messages = list(messages)

    def generate(self, messages: Any, **kwargs: Any) -> ChatMessage:
        if not self.messages:
            raise ScriptError("the model was asked once more than prepared")
        return self.messages.pop(0)


def _calls(*calls: tuple[object, str, dict[str, Any]]) -> ChatMessage:
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[
            ChatMessageToolCall(
                id=cid, type="function", function=ChatMessageToolCallFunction(name=name, arguments=args)
            )
            for cid, name, args in calls
        ],
    )


def test_a_gated_call_whose_model_written_id_is_not_text_still_pauses(shop_on_both: ShopGate) -> None:
    """The model (its API's JSON) gave a refund's tool call the id 7, a number. smolagents runs
    such a call (ids only key its step), but the gate's step registration built a CallContext
    with it and the whole run crashed with a raw ValueError. The id is the model's text to
    record, not the gate's to fail on: the refund pauses for finance, nothing runs, and after
    the approval it runs once."""
    shop = shop_on_both
    model = _Answers(
        _calls((7, "refund_order", dict(REFUND))), _calls(("done", "final_answer", {"answer": "Refunded."}))
    )
    gated = support_agent(shop.gate, ScriptedModel(Script([])))
    gated.agent.model = model
    out = gated.run("Refund order 1042", origin_message_id="m1", **ADA)
    assert isinstance(out, AwaitingApproval)
    assert [a.status for a in shop.store.approvals()] == ["pending"]
    assert shop.shop.receiver.count("refund") == 0
    [paused] = out.pending
    done = gated.resume(out, {paused.approval_id: Approve(grant(shop.gate, paused))})
    assert isinstance(done.decided[0][1], Executed)
    assert shop.shop.receiver.count("refund") == 1
    assert model.messages == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"code_block_tags": "markdown"},
        {"code_block_tags": ("<py>", "</py>")},
        {"use_structured_outputs_internally": True},
    ],
    ids=["default", "markdown", "own-tags", "structured"],
)
def test_the_scripted_model_drives_a_code_agent_as_its_script_says(
    shop_gate: ShopGate, options: dict[str, Any]
) -> None:
    """`ScriptedModel` wrote every code action in <code> tags with each value's repr: a value with
    "</code>" in it ended the action early, and an agent with markdown code blocks, its own tags or
    structured output could parse no action at all. Each step became a parsing error the model
    was asked again about, each consuming a turn: the run ended on the script's last turn, as
    code text, with nothing called, and `assert_complete()` passed. The scripted calls must run
    with their arguments as written and the run end on the scripted answer."""
    script = Script(
        [
            call("search_tickets", query="refund </code> `now`"),
            call("update_ticket_tags", ticket_id="t-17", tags=["<b>", "```"]),
            say("Tagged </code>."),
        ]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script), kind="code", **options)
    out = gated.run("Tag my refund ticket", origin_message_id="m1", **ADA)
    assert isinstance(out, Finished)
    assert out.output == "Tagged </code>."
    assert shop_gate.shop.reads["search_tickets"] == 1
    assert shop_gate.shop.receiver.count("ticket_tags", ticket_id="t-17", tags=["<b>", "```"]) == 1
    script.assert_complete()


def test_the_scripted_model_answers_a_tool_calling_agents_last_step_with_its_text(
    shop_gate: ShopGate,
) -> None:
    """At max_steps smolagents asks the model for a final answer in plain text (no tools, no stop
    sequences). `ScriptedModel` answered a ToolCallingAgent with a CodeAgent's code action, so
    the run's answer was "Thought: scripted.\\n<code>\\nfinal_answer('...')\\n</code>". The scripted
    `say` must be the answer; a scripted call there is a `ScriptError`, not an answer."""
    script = Script([call("search_tickets", query="refund"), say("Your ticket is t-17.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Find my refund ticket", origin_message_id="m1", max_steps=1, **ADA)
    assert isinstance(out, Finished)
    assert out.output == "Your ticket is t-17."
    script.assert_complete()
    model = ScriptedModel(Script([call("search_tickets", query="refund")]))
    with pytest.raises(ScriptError, match="plain text"):
        model.generate([])
