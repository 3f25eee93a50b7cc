"""Round 29 (LangGraph): a resume over an approval row edited in the database while the graph was
paused, and a reviewer's answer over an approval amended while its interrupt was shown.

1. A tampered approval on resume. Before, the re-run step's registration raised `TamperedRecord`
   out of `graph.invoke`, recorded nothing, and every later resume raised again: the thread was
   stuck for good. Now the core answers the step's tampered call `Refused("tampered")` (the other
   calls of the step keep their outcomes) and records the refusal; the model gets an error
   ToolMessage saying so, nothing runs, and the thread goes on (the other adapters, too, give the
   model a gate's refusal as a tool result). SQLite and PostgreSQL, the node and the middleware.
   A row edited after its grant was asked for forever (its token and every deny were refused);
   one edited while an answer is applied raised out of `graph.invoke`: both are refused now.
2. A HITL answer carries no version. An amend made outside the thread while the interrupt is
   shown, an answer addressed to the interrupt an in-thread amend replaced, and a decision echoing
   the version it was shown are all refused: nothing is applied. A plain `Command(resume=...)`
   after an in-thread amend answers the new interrupt (v2); whether it must be refused is left as
   a strict xfail (a design decision).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import CallContext, Pending, Refused
from effectgate.errors import TamperedRecord
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import FakeClock, Script, call, say, step
from effectgate_langgraph import approve
from tests.conformance.adapters import (
    EMAIL,
    FINANCE,
    REFUND,
    SUPPORT_LEAD,
    Paused,
    ShopGate,
    grant,
    open_shop_gate,
)

from ._graph import LangGraphHarness
from ._paused import status_of
from .conftest import MakeLangGraphHarness

HITL_APPROVE: dict[str, Any] = {"decisions": [{"type": "approve"}]}
#: How the row is edited in the database: its arguments (the hash no longer matches), or a sealed
#: column (the seal no longer verifies).
EDITS: dict[str, dict[str, Any]] = {
    "arguments": {"args_json": json.dumps({**REFUND, "amount": 1})},
    "role": {"approver_role": "support"},
}


@pytest.fixture
def shop_gate(store_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    """The shop's gate on SQLite and on PostgreSQL."""
    with open_shop_gate(store_url, clock) as parts:
        yield parts


@pytest.fixture
def checkpointer() -> BaseCheckpointSaver[Any]:
    return InMemorySaver()


def _tamper(shop_gate: ShopGate, approval_id: str, values: dict[str, Any]) -> None:
    """Edit a pending approval behind effectgate's back, as someone with database access could."""
    with shop_gate.store.transaction() as conn:
        assert shop_gate.store.update_approval(conn, approval_id, expect_status=["pending"], values=values)


def _tampered_refusals(shop_gate: ShopGate) -> list[tuple[str | None, str | None]]:
    """(tool, refused approval) of each recorded `tampered` refusal."""
    out = []
    for e in shop_gate.store.events(kind="refused"):
        detail = json.loads(e.detail_json or "{}")
        if detail.get("code") == "tampered":
            out.append((e.tool, detail.get("refused_approval")))
    return out


def _answer_to(h: LangGraphHarness, tool_call_id: str) -> ToolMessage:
    [message] = [m for m in h.messages() if isinstance(m, ToolMessage) and m.tool_call_id == tool_call_id]
    return message


def _told_refused(h: LangGraphHarness, tool_call_id: str) -> None:
    """The model was told the call was refused as tampered, not the row's content."""
    message = _answer_to(h, tool_call_id)
    assert message.status == "error"
    assert str(message.content).startswith("Refused (tampered): approval ")
    assert "amount" not in str(message.content)
    assert "support" not in str(message.content)


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hitl_resume_over_a_tampered_approval_refuses_it_and_the_thread_goes_on(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, edit: str
) -> None:
    """A refund paused, its approval row edited, then approved (HITL): nothing runs, the refusal
    is recorded (`tampered`, naming the approval), the model is told the call was refused and
    answers; the row is left as it was, and the user's next message is served."""
    h = node_or_agent(
        Script(
            [
                call("refund_order", id="call-1", **REFUND),
                say("The refund was refused."),
                call("get_order", id="call-2", order_id="1042"),
                say("Shipped."),
            ]
        ),
        native_approver=FINANCE,
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    _tamper(shop_gate, paused.approval_id, EDITS[edit])
    assert h.invoke(Command(resume=HITL_APPROVE)).paused == ()
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert _tampered_refusals(shop_gate) == [("refund_order", paused.approval_id)]
    _told_refused(h, "call-1")
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert h.send("Where is my order?", message_id="m4").paused == ()
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_an_async_resume_over_a_tampered_approval_refuses_it(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The async node does the same: no exception, the refusal recorded, nothing runs."""
    h = lg_harness(
        Script([call("refund_order", id="call-1", **REFUND), say("Refused.")]), native_approver=FINANCE
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    _tamper(shop_gate, paused.approval_id, EDITS["arguments"])
    assert asyncio.run(h.ainvoke(Command(resume=HITL_APPROVE))).paused == ()
    assert shop_gate.shop.receiver.count("refund") == 0
    assert _tampered_refusals(shop_gate) == [("refund_order", paused.approval_id)]
    _told_refused(h, "call-1")
    h.script.assert_complete()


def test_the_intact_call_of_the_step_still_runs_on_its_grant(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A refund and an email paused in one step; the refund's row is edited. The email, answered
    by approval id with its grant, is sent once; the refund is refused as tampered, never run."""
    h = lg_harness(
        Script(
            [
                step(call("refund_order", id="call-1", **REFUND), call("send_email", id="call-2", **EMAIL)),
                say("Sent."),
            ]
        )
    )
    by_tool = {p.tool: p for p in h.send("Refund 1042 and tell me", message_id="m3").paused}
    refund, email = by_tool["refund_order"], by_tool["send_email"]
    _tamper(shop_gate, refund.approval_id, EDITS["arguments"])
    token = grant(shop_gate.gate, email, SUPPORT_LEAD)
    assert h.decide({email.approval_id: approve(token)}).paused == ()
    assert shop_gate.shop.receiver.count("email") == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [(e.approval_id, e.status) for e in shop_gate.store.executions()] == [
        (email.approval_id, "succeeded")
    ]
    assert _tampered_refusals(shop_gate) == [("refund_order", refund.approval_id)]
    _told_refused(h, "call-1")
    assert _answer_to(h, "call-2").status == "success"
    h.script.assert_complete()


def test_a_positional_answer_for_a_step_with_a_tampered_call_is_asked_again(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The same step answered by position (HITL, two approves): the payload no longer lists what
    it showed, so nothing is applied and the email alone is asked for again; approved then, it
    is sent once. The refund never runs."""
    h = lg_harness(
        Script(
            [
                step(call("refund_order", id="call-1", **REFUND), call("send_email", id="call-2", **EMAIL)),
                say("Sent."),
            ]
        ),
        native_approver=SUPPORT_LEAD,
    )
    by_tool = {p.tool: p for p in h.send("Refund 1042 and tell me", message_id="m3").paused}
    refund, email = by_tool["refund_order"], by_tool["send_email"]
    _tamper(shop_gate, refund.approval_id, EDITS["arguments"])
    again = h.invoke(Command(resume={"decisions": [{"type": "approve"}, {"type": "approve"}]}))
    assert again.paused == (email,)
    assert status_of(shop_gate, email.approval_id) == ("pending", 1)
    assert shop_gate.shop.receiver.effects == []
    assert h.invoke(Command(resume=HITL_APPROVE)).paused == ()
    assert shop_gate.shop.receiver.count("email") == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    _told_refused(h, "call-1")
    h.script.assert_complete()


GRANTED_THEN_EDITED: dict[str, Callable[[Paused, str], Command[Any]]] = {
    "approve-by-id": lambda paused, token: Command(resume={paused.approval_id: approve(token)}),
    "hitl-reject": lambda paused, token: Command(resume={"decisions": [{"type": "reject", "message": "no"}]}),
}


@pytest.mark.parametrize("answer", list(GRANTED_THEN_EDITED))
def test_an_approval_edited_after_its_grant_is_refused_not_asked_for_forever(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, answer: str
) -> None:
    """The refund granted (its token minted), then its row's arguments edited. Before, the step
    asked for it again and again: the token was refused as tampered, and so was every deny
    (`gate.deny` refuses a row that does not verify), so the paused call could never be settled.
    Now either answer ends the call for the model as refused (`tampered`, recorded), nothing
    runs, the grant stays unspent, and the conversation goes on."""
    h = lg_harness(
        Script([call("refund_order", id="call-1", **REFUND), say("Refused.")]), native_approver=FINANCE
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    token = grant(shop_gate.gate, paused)
    with shop_gate.store.transaction() as conn:
        values = EDITS["arguments"]
        assert shop_gate.store.update_approval(
            conn, paused.approval_id, expect_status=["approved"], values=values
        )
    assert h.invoke(GRANTED_THEN_EDITED[answer](paused, token)).paused == ()
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    token_refused = [json.loads(e.detail_json or "{}") for e in shop_gate.store.events(kind="token_refused")]
    recorded = _tampered_refusals(shop_gate) + [("token", d.get("reason")) for d in token_refused]
    assert recorded == (
        [("token", "tampered")] if answer == "approve-by-id" else [("refund_order", paused.approval_id)]
    )
    _told_refused(h, "call-1")
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert (row.status, row.token_used_at) == ("approved", None)
    h.script.assert_complete()


def test_a_row_edited_while_the_answer_is_applied_is_refused_not_raised(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The row is edited after the step registered its call and before the HITL approve reaches
    `gate.approve` (the application's approver function runs in between): the approve is
    refused, and the call, read again, is refused as tampered (recorded) instead of raising out
    of `graph.invoke`; nothing runs and the model is told."""
    target: list[str] = []

    def approver(config: Any, context: Any) -> Any:
        _tamper(shop_gate, target[0], EDITS["arguments"])
        return FINANCE

    h = lg_harness(
        Script([call("refund_order", id="call-1", **REFUND), say("Refused.")]), native_approver=approver
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    target.append(paused.approval_id)
    assert h.invoke(Command(resume=HITL_APPROVE)).paused == ()
    assert shop_gate.shop.receiver.count("refund") == 0
    assert _tampered_refusals(shop_gate) == [("refund_order", paused.approval_id)]
    _told_refused(h, "call-1")
    h.script.assert_complete()


def test_the_core_step_answers_a_tampered_call_and_records_it(shop_gate: ShopGate) -> None:
    """`call_step` answers the tampered call `Refused("tampered")` (the step's other call keeps
    its outcome) and records the refusal; `call` still raises `TamperedRecord`, recorded too."""
    gate = shop_gate.gate
    ctx = CallContext(session_id="s-ada", origin_message_id="m3", user_id="u1", agent_id=SUPPORT_AGENT)
    calls: list[tuple[str, Mapping[str, Any], str]] = [
        ("refund_order", REFUND, "call-1"),
        ("send_email", EMAIL, "call-2"),
    ]
    refund, email = gate.call_step(calls, ctx)
    assert isinstance(refund, Pending)
    assert isinstance(email, Pending)
    _tamper(shop_gate, refund.approval_id, EDITS["arguments"])
    refused, replayed = gate.call_step(calls, ctx)
    assert isinstance(refused, Refused)
    assert (refused.code, refused.approval_id, refused.tool) == (
        "tampered",
        refund.approval_id,
        "refund_order",
    )
    assert isinstance(replayed, Pending)
    assert (replayed.approval_id, replayed.version, replayed.replay) == (email.approval_id, 1, True)
    with pytest.raises(TamperedRecord):
        gate.call("refund_order", REFUND, ctx)
    assert _tampered_refusals(shop_gate) == [("refund_order", refund.approval_id)] * 2
    assert shop_gate.store.executions() == []
    assert shop_gate.shop.receiver.effects == []


# -- 2. a HITL answer over an approval amended while its interrupt was shown

LOWER = {**REFUND, "amount": 11000}


def test_an_amend_outside_the_thread_while_shown_refuses_the_plain_answer(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The approval is amended to version 2 by another process (a new message of the session)
    while v1's interrupt is shown; the reviewer's plain HITL approve is refused (the interrupt
    showed v1): no decision, nothing runs. The new payload shows v2; approved, 110 runs once."""
    h = lg_harness(
        Script([call("refund_order", id="call-1", **REFUND), say("Done.")]), native_approver=FINANCE
    )
    [v1] = h.send("Please refund order 1042", message_id="m3").paused
    ctx = CallContext(session_id="s-ada", origin_message_id="m9", user_id="u1", agent_id=SUPPORT_AGENT)
    assert shop_gate.gate.call("refund_order", LOWER, ctx).version == 2  # type: ignore[union-attr]
    [v2] = h.invoke(Command(resume=HITL_APPROVE)).paused
    assert (v2.approval_id, v2.version) == (v1.approval_id, 2)
    [refused] = h.interrupt.value["refused"]
    assert "showed other calls (or versions)" in refused["reason"]
    assert status_of(shop_gate, v1.approval_id) == ("pending", 2)
    with shop_gate.store.transaction() as conn:
        assert shop_gate.store.decisions(conn, v1.approval_id) == []
    assert shop_gate.shop.receiver.count("refund") == 0


def _amended_in_thread(lg_harness: MakeLangGraphHarness) -> tuple[LangGraphHarness, Any]:
    """v1's interrupt shown (kept as the reviewer saw it), then the user's next message amends
    the approval to 110.00 (v2), which the graph pauses on with a new interrupt."""
    h = lg_harness(
        Script(
            [
                call("refund_order", id="call-1", **REFUND),
                call("refund_order", id="call-2", **LOWER),
                say("Done."),
            ]
        ),
        native_approver=FINANCE,
    )
    [v1] = h.send("Please refund order 1042", message_id="m3").paused
    shown = h.interrupt
    [v2] = h.send("Make it 110", message_id="m4").paused
    assert (v2.approval_id, v2.version) == (v1.approval_id, 2)
    return h, shown


def _nothing_decided(h: LangGraphHarness, shop_gate: ShopGate, approval_id: str) -> None:
    assert status_of(shop_gate, approval_id) == ("pending", 2)
    with shop_gate.store.transaction() as conn:
        assert shop_gate.store.decisions(conn, approval_id) == []
    assert shop_gate.shop.receiver.count("refund") == 0


def test_an_answer_to_the_interrupt_an_amend_replaced_is_not_applied(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A HITL approve addressed to v1's interrupt (by its id) after the amend reaches no call:
    v2 is not approved, nothing runs, the graph still pauses on v2."""
    h, shown = _amended_in_thread(lg_harness)
    [again] = h.invoke(Command(resume={shown.id: HITL_APPROVE})).paused
    assert again.version == 2
    _nothing_decided(h, shop_gate, again.approval_id)


def test_a_decision_echoing_the_version_it_was_shown_is_refused_after_an_amend(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A plain HITL approve that echoes v1's version (what the reviewer was shown) is refused."""
    h, shown = _amended_in_thread(lg_harness)
    [request] = shown.value["requests"]
    answer = {"decisions": [{"type": "approve", "version": request["version"]}]}
    [again] = h.invoke(Command(resume=answer)).paused
    [refused] = h.interrupt.value["refused"]
    assert refused["reason"].startswith("the decision is for version 1")
    _nothing_decided(h, shop_gate, again.approval_id)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "design decision: a plain Command(resume={'decisions': [...]}) names neither interrupt nor "
        "version, so after a user message amends the approval in the thread it answers the new "
        "interrupt (v2, 110.00) although the reviewer may have been looking at v1's card (120.00). "
        "Refusing it (e.g. the first plain answer after an amend of an approval whose older version "
        "an unanswered interrupt showed) would change langchain's HITL contract"
    ),
)
def test_a_plain_answer_after_an_in_thread_amend_is_not_applied_to_the_new_version(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The reviewer approves, plain HITL, what they were shown (v1, 120.00) after the user's
    message amended it to 110.00: no refund of 110.00 should run on that answer."""
    h, _ = _amended_in_thread(lg_harness)
    h.invoke(Command(resume=HITL_APPROVE))
    assert shop_gate.shop.receiver.count("refund", amount=11000) == 0
