"""A RunState snapshot edited between pause and resume: its identity is signed, and nothing runs.

Every scenario pauses on u1's refund of order 1042, edits the snapshot JSON as someone holding it
could, restores it with `RunState.from_string`, decides it and resumes it with a script whose next
turn reads order 2001 (u2's). Effects are counted at the receiver and on the record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from agents import Runner, RunState
from agents.testing import ModelStep, assistant_message, function_call
from agents.testing import ScriptedModel as SDKScriptedModel

from effectgate.testing import Script, call, say
from effectgate_openai_agents import TamperedState, approve, call_context, pending_approvals, reject
from tests.conformance.adapters import FINANCE, REFUND, Paused, ShopGate, grant

from ._harness import OpenAIAgentsHarness, context, support_agent, tool_results
from ._snapshots import EDITS, Edit, both, drop_entry, drop_interruption, set_value, tampered
from .conftest import MakeOpenAIHarness


def _paused_on_refund(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> tuple[OpenAIAgentsHarness, Paused, str]:
    """u1's refund paused (the next scripted turn reads u2's order 2001), and a valid grant for it."""
    h = oa_harness(Script([call("refund_order", **REFUND), call("get_order", order_id="2001"), say("Done.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    return h, paused, grant(shop_gate.gate, paused)


def _restore(h: OpenAIAgentsHarness, snapshot: str) -> RunState[Any, Any]:
    return asyncio.run(RunState.from_string(h.agent, snapshot))


def _nothing_ran(shop_gate: ShopGate, paused: Paused) -> None:
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.store.executions() == []
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert (row.status, row.token_used_at) == ("approved", None)  # the grant was not spent


def _untampered_resume_refunds_once(h: OpenAIAgentsHarness, shop_gate: ShopGate, token: str) -> None:
    assert h.snapshot is not None
    state = _restore(h, h.snapshot)
    [waiting] = pending_approvals(state)
    approve(state, waiting, token)
    result = Runner.run_sync(h.agent, state)
    assert [(o.result.tool, o.result.ok) for o in tool_results(result)] == [
        ("refund_order", True),
        ("get_order", False),  # u1 may not read u2's order
    ]
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert shop_gate.shop.reads["get_order"] == 0
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]
    h.script.assert_complete()


@pytest.mark.parametrize("name", EDITS)
def test_an_edited_identity_is_refused_and_nothing_runs(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate, name: str
) -> None:
    """A snapshot whose identity (user, session, message, effectgate's entry or its signature) was
    edited is refused with TamperedState when approved, before the grant is attached or the SDK
    item approved, so resuming it only pauses again: no refund, no read of u2's order, the grant
    unspent; the untampered snapshot then resumes and refunds once."""
    h, paused, token = _paused_on_refund(oa_harness, shop_gate)
    assert h.snapshot is not None
    state = _restore(h, tampered(h.snapshot, EDITS[name]))
    [waiting] = pending_approvals(state)
    with pytest.raises(TamperedState):
        approve(state, waiting, token)
    assert state.get_interruptions()  # still pending in the SDK
    assert state._context is not None
    assert state._context.get_approval_status("refund_order", waiting.call_id) is None
    assert [i.call_id for i in Runner.run_sync(h.agent, state).interruptions] == [waiting.call_id]
    _nothing_ran(shop_gate, paused)
    _untampered_resume_refunds_once(h, shop_gate, token)


@pytest.mark.parametrize(
    "decide",
    [
        pytest.param(lambda state, waiting: state.approve(waiting.item), id="sdk-approve-alone"),
        pytest.param(
            lambda state, waiting: state.reject(waiting.item, rejection_message="no"), id="sdk-reject"
        ),
    ],
)
def test_without_effectgate_entry_no_other_decision_runs_anything(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate, decide: Callable[[Any, Any], None]
) -> None:
    """With effectgate's entry deleted and user_id set to u2, a decision made in the SDK alone
    (approve or reject) ends the resumed run with TamperedState before u2's order is read."""
    h, paused, _ = _paused_on_refund(oa_harness, shop_gate)
    assert h.snapshot is not None
    state = _restore(h, tampered(h.snapshot, both(drop_entry, set_value("user_id", "u2"))))
    [waiting] = pending_approvals(state)
    assert waiting.approval_id is None
    decide(state, waiting)
    with pytest.raises(TamperedState):
        Runner.run_sync(h.agent, state)
    _nothing_ran(shop_gate, paused)


def test_effectgate_reject_of_a_tampered_state_decides_nothing_and_runs_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """`reject` on a state whose user_id was edited is refused with TamperedState before anything
    is denied or rejected in the SDK (the identity it would decide for is not the signed one);
    resuming it only pauses again, and the model's next call (u2's order) never comes. The
    approval stays as it was, for the untampered snapshot (or the inbox) to decide."""
    h, paused, _ = _paused_on_refund(oa_harness, shop_gate)
    assert h.snapshot is not None
    state = _restore(h, tampered(h.snapshot, set_value("user_id", "u2")))
    [waiting] = pending_approvals(state)
    with pytest.raises(TamperedState):
        reject(shop_gate.gate, state, waiting, approver=FINANCE, reason="no")
    assert [i.call_id for i in Runner.run_sync(h.agent, state).interruptions] == [waiting.call_id]
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "approved"  # the grant minted for the test, unspent and undenied
    assert row.token_used_at is None


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(set_value("user_id", "u2"), id="user_id"),
        pytest.param(both(drop_entry, set_value("user_id", "u2")), id="entry-deleted-and-user_id"),
    ],
)
def test_a_snapshot_stripped_of_its_interruption_is_still_a_resume(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate, edit: Edit
) -> None:
    """The interruption removed from the snapshot too (so it holds no pending call and no decision):
    once the application has looked at it with pending_approvals, running it ends with
    TamperedState and u2's order is not read (before the fix it was read as u2)."""
    h, _, _ = _paused_on_refund(oa_harness, shop_gate)
    assert h.snapshot is not None
    state = _restore(h, tampered(h.snapshot, both(edit, drop_interruption)))
    assert pending_approvals(state) == []
    with pytest.raises(TamperedState):
        Runner.run_sync(h.agent, state)
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []


def test_a_stripped_interruption_with_its_identity_intact_runs_as_that_user(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The resume check refuses only a changed identity: the same stripped snapshot with u1's
    identity untouched runs on as u1 (the refund never runs; reading 2001 is out of u1's scope)."""
    h, paused, _ = _paused_on_refund(oa_harness, shop_gate)
    assert h.snapshot is not None
    state = _restore(h, tampered(h.snapshot, drop_interruption))
    assert pending_approvals(state) == []
    result = Runner.run_sync(h.agent, state)
    assert [(o.result.tool, o.result.ok) for o in tool_results(result)] == [("get_order", False)]
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "approved"


def test_a_new_run_on_a_copy_of_a_paused_context_is_not_a_resume(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """A new run whose context copies a paused run's (effectgate entry included) with a new message
    id is a new run: it is signed afresh and its read runs, even after the paused state was
    inspected."""
    h = oa_harness(
        Script([call("refund_order", **REFUND), call("get_order", order_id="1042"), say("Shipped.")])
    )
    first = Runner.run_sync(h.agent, "Please refund order 1042", context=context("m3"))
    state = first.to_state()
    assert [p.tool for p in pending_approvals(state)] == ["refund_order"]
    follow = {**first.context_wrapper.context, "origin_message_id": "m4"}
    result = Runner.run_sync(h.agent, "Where is order 1042?", context=follow)
    assert [(o.result.tool, o.result.ok) for o in tool_results(result)] == [("get_order", True)]
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_a_call_the_gate_never_saw_still_leaves_a_signed_identity(shop_gate: ShopGate) -> None:
    """Arguments that do not parse make the SDK pause without asking the gate; the run's identity is
    signed all the same, so the rejected call's resumed run goes on (its read runs once)."""
    model = SDKScriptedModel(
        [
            ModelStep(output=[function_call("refund_order", "{not json", call_id="c1", item_id="fc-c1")]),
            ModelStep(
                output=[function_call("get_order", '{"order_id":"1042"}', call_id="c2", item_id="fc-c2")]
            ),
            ModelStep(output=[assistant_message("Your order has shipped.", item_id="msg-1")]),
        ]
    )
    agent = support_agent(shop_gate.gate, model)  # type: ignore[arg-type]
    first = Runner.run_sync(agent, "refund 1042", context=context("m3"))
    state = asyncio.run(RunState.from_string(agent, first.to_state().to_string()))
    [waiting] = pending_approvals(state)
    assert waiting.approval_id is None
    reject(shop_gate.gate, state, waiting, approver=FINANCE, reason="unreadable request")
    result = Runner.run_sync(agent, state)
    assert result.final_output == "Your order has shipped."
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.approvals() == []


def test_the_signed_identity_does_not_name_the_agent(shop_gate: ShopGate) -> None:
    """A run that hands off between gated agents keeps one identity: the agent id (fixed when tools
    are wrapped) is not part of what is signed, while the user is."""
    ctx = context("m3")
    call_context(ctx, agent_id="support", gate=shop_gate.gate)
    call_context(ctx, agent_id="billing", gate=shop_gate.gate, resumed=True)
    with pytest.raises(TamperedState):
        call_context({**ctx, "user_id": "u2"}, agent_id="support", gate=shop_gate.gate, resumed=True)
