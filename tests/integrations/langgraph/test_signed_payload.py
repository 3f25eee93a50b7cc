"""The signed interrupt payload, and crossed grants: a decision may echo the payload's signature
and is refused when the step no longer signs the same; a grant filed under another approval runs
nothing. On the hand-built graph and on create_agent, with both checkpointers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from effectgate.adapter import TamperedState, verify_state
from effectgate.canonical import args_hash
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import ARTIFACT_KEY, approve, deny
from effectgate_langgraph._display import shown
from tests.conformance.adapters import EMAIL, REFUND, SUPPORT_LEAD, ShopGate, grant

from ._graph import edit_paused_call
from ._paused import TAMPERED, assert_answer_refused, paused_refund, plain_resume, status_of, tool_messages
from .conftest import MakeLangGraphHarness

#: The payload fields the signature covers, per request (effectgate_langgraph._decisions), with
#: the digest of its card (`_display.shown`).
SIGNED = ("approval_id", "version", "args_hash", "tool", "tool_call_id", "call_args_hash")


def _signed(payload: Mapping[str, Any], user_id: str) -> dict[str, Any]:
    """The fields the payload's signature covers; the user id is the application's own."""
    return {
        "session_id": payload["session_id"],
        "origin_message_id": payload["origin_message_id"],
        "user_id": user_id,
        "requests": [{**{k: r[k] for k in SIGNED}, "shown": shown(r)} for r in payload["requests"]],
    }


def test_decision_echoing_the_payload_signature_runs_once(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A decision that echoes the signature of the payload it answers is accepted: the call runs once."""
    h, paused = paused_refund(node_or_agent, say("Refunded."))
    signature = h.interrupt.value["signature"]
    verify_state(shop_gate.gate, "langgraph.approval", _signed(h.interrupt.value, "u1"), signature)
    done = h.decide({paused.approval_id: {**approve(grant(shop_gate.gate, paused)), "signature": signature}})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
    h.script.assert_complete()


@pytest.mark.parametrize("approved", [False, True], ids=["edited-before-approval", "edited-after-approval"])
def test_decision_echoing_a_signature_from_before_the_checkpoint_edit_is_refused(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, approved: bool
) -> None:
    """A decision echoing the signature of the payload shown before the checkpoint was edited is
    refused, even a deny the step would otherwise take; nothing runs and nothing is decided.

    Edited before approval, the step now waits on version 2 with no mismatch, so the signature
    alone refuses the stale deny; a deny echoing the new payload's signature is then taken."""
    h, paused = paused_refund(node_or_agent, say("I could not refund it."))
    before = h.interrupt.value["signature"]
    token = grant(shop_gate.gate, paused) if approved else None
    edit_paused_call(h.graph, h.config, {"amount": 1})
    decision = {**(approve(token) if token else deny("not this")), "signature": before}

    again = h.invoke(plain_resume({paused.approval_id: decision}))
    [waiting] = again.paused
    payload = h.interrupt.value
    assert payload["signature"] != before
    assert_answer_refused(h, paused.approval_id)
    assert status_of(shop_gate, paused.approval_id) == (("approved", 1) if approved else ("pending", 2))
    assert [d.decision for d in shop_gate.store.all_decisions()] == (["approve"] if approved else [])
    assert shop_gate.shop.receiver.count("refund") == 0

    done = h.decide({waiting.approval_id: {**deny("changed"), "signature": payload["signature"]}})
    assert done.paused == ()
    assert status_of(shop_gate, paused.approval_id)[0] == "denied"
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    h.script.assert_complete()


def test_payload_signature_altered_by_the_application(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """An altered payload signature authorises nothing and disables nothing: a decision echoing it
    is refused, and the step signs its own view again on every pause.

    The node never reads the payload back (it rebuilds the waiting calls from the gate and the
    checkpoint each run), so what it checks is a decision's echoed signature against the one it
    computes now. The application can verify a payload itself with `verify_state` over the
    signed fields and its own user id; an altered field does not verify."""
    h, paused = paused_refund(node_or_agent, say("Refunded."))
    payload = h.interrupt.value
    original = payload["signature"]
    with pytest.raises(TamperedState):
        verify_state(shop_gate.gate, "langgraph.approval", _signed(payload, "u1"), "k1.forged")
    forged_fields = _signed(payload, "u1")
    forged_fields["requests"][0]["args_hash"] = args_hash("refund_order", TAMPERED)
    with pytest.raises(TamperedState):
        verify_state(shop_gate.gate, "langgraph.approval", forged_fields, original)
    with pytest.raises(TamperedState):
        verify_state(shop_gate.gate, "langgraph.approval", _signed(payload, "u2"), original)

    payload["signature"] = "k1.forged"  # the application's copy, altered
    token = grant(shop_gate.gate, paused)
    again = h.decide({paused.approval_id: {**approve(token), "signature": payload["signature"]}})
    assert again.paused == (paused,)
    assert_answer_refused(h, paused.approval_id)
    assert h.interrupt.value["signature"] == original
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []

    done = h.decide({paused.approval_id: {**approve(token), "signature": original}})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()


# -- crossed grants


def test_crossed_grant_in_one_resume_runs_neither_call(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """`{refund_id: approve(email_grant), email_id: deny(...)}` in one resume runs neither call:
    the refund's decision is refused and it keeps waiting, the email is denied and never sent."""
    h = node_or_agent(
        Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL)), say("Neither was done.")])
    )
    by_tool = {p.tool: p for p in h.send("Refund 1042 and email me", message_id="m3").paused}
    refund, email = by_tool["refund_order"], by_tool["send_email"]
    email_token = grant(shop_gate.gate, email, SUPPORT_LEAD)

    crossed = h.decide({refund.approval_id: approve(email_token), email.approval_id: deny("no email")})
    assert crossed.paused == (refund,)
    assert_answer_refused(h, refund.approval_id)
    assert shop_gate.shop.receiver.count("email") == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert status_of(shop_gate, email.approval_id) == ("denied", 1)
    assert status_of(shop_gate, refund.approval_id) == ("pending", 1)

    done = h.deny(refund, "not today")
    assert done.paused == ()
    codes = {m.name: m.artifact[ARTIFACT_KEY]["code"] for m in tool_messages(h)}
    assert codes == {"refund_order": "denied", "send_email": "denied"}
    assert shop_gate.shop.receiver.effects == []
    h.script.assert_complete()
