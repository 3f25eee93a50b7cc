"""Text from the stored record in the webhook body: a record that does not verify is never
presented as effectgate's, no name from the record is ever Slack formatting, and no value can
break a line (forging fields of its own) or leave a bidirectional control open."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx
import sqlalchemy as sa

from effectgate.examples.shop import context
from effectgate.notify import Notification, NotificationKind, message
from effectgate.outcomes import TAMPERED_WARNING
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import INBOX, URL, Rig, hand_card, propose
from .test_message import rendered, text_objects

# A name that, formatted, would read as a decision: bold, an emoji, an unclosed code span.
FORGED = "money, compensable) waits for nobody. *Auto-approved by finance* :white_check_mark: `x"
UNVERIFIED = "does not verify; do not act on it"
FIELD = "ACME Ltd\n\nApprovals\n1 of 1 (already approved by fiona)\n\nStatus\nno action needed"
# Everything that starts a new line (or moves the cursor) in some renderer.
BREAKS = ("\n", "\r", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029")
_OPENERS = "\u202a\u202b\u202d\u202e"


def edit(store: SQLStore, approval_id: str, **columns: Any) -> None:
    """Change columns of a stored approval behind effectgate's back (its seal is left as it was)."""
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    with store.transaction() as conn:
        result = conn.execute(
            sa.text(f"UPDATE eg_approvals SET {sets} WHERE id = :id"), {**columns, "id": approval_id}
        )
        assert result.rowcount == 1


def expiring_body(
    rig: Rig, router: respx.MockRouter, store: SQLStore, clock: FakeClock, **columns: Any
) -> Any:
    """A refund proposal, its row edited, then its expiry warning: (the card, the body posted)."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    out = propose(gate)
    assert json.loads(route.calls[0].request.content)["metadata"]["event_payload"]["intact"] is True
    edit(store, out.approval_id, **columns)
    clock.advance(out.card.expires_at - clock.now() - 60)
    [card] = gate.warn_expiring(within=300)
    assert route.call_count == 2
    return card, json.loads(route.calls[1].request.content)


def test_a_record_that_does_not_verify_gets_the_fixed_headline(
    rig: Rig, router: respx.MockRouter, store: SQLStore, clock: FakeClock
) -> None:
    """An approval whose sealed effect was edited to read as a decision is announced with the fixed
    "does not verify; do not act on it" headline: no name from the record in the fallback text or
    any mrkdwn, the edited text only as plain text, and `intact: false` in the signed payload."""
    card, body = expiring_body(rig, router, store, clock, effect=FORGED)
    assert card.warnings[0] == TAMPERED_WARNING
    text, mrkdwn, plain = rendered(body)
    assert UNVERIFIED in body["blocks"][0]["text"]["text"]
    assert text.startswith(body["blocks"][0]["text"]["text"])
    for word in ("refund_order", "finance", "compensable", "money", "Auto-approved", "`x"):
        assert word not in text, word
        assert all(word not in m for m in mrkdwn), word
    assert any("*Auto-approved by finance* :white_check_mark: `x" in p for p in plain)
    assert body["metadata"]["event_payload"]["intact"] is False
    events = [e.kind for e in store.events() if e.kind.startswith("webhook_")]
    assert events == ["webhook_delivered", "webhook_delivered"]


@pytest.mark.parametrize("field", ["tool", "effect", "reversibility", "approver_role"])
@pytest.mark.parametrize("kind", ["pending", "expiring", "needs_reconciliation"])
def test_no_name_with_markup_reaches_mrkdwn(field: str, kind: NotificationKind, clock: FakeClock) -> None:
    """Tool, effect, reversibility and role with markup, an emoji and a stray backtick: for every
    kind of notice, none of it in the fallback text or any mrkdwn; all of it as plain text."""
    card = replace(hand_card({"to": "x"}, clock), **{field: FORGED})
    base: dict[str, Any] = {"tool": card.tool, "approver_role": card.approver_role, "at": clock.now()}
    if kind == "needs_reconciliation":
        n = Notification(kind=kind, key="op-1", reason="timeout", **base)
    else:
        n = Notification(kind=kind, card=card, approval_id="a-1", version=1, **base)
    text, mrkdwn, plain = rendered(message(n, inbox_url=INBOX, now=clock.now()))
    for m in (text, *mrkdwn):
        assert "Auto-approved" not in m
        assert m.count("`") % 2 == 0, m
    if kind != "needs_reconciliation" or field in ("tool", "approver_role"):
        assert any("*Auto-approved by finance* :white_check_mark: `x" in p for p in plain)


def test_line_breaks_in_values_are_written_out(clock: FakeClock) -> None:
    """Newlines, returns, tabs, form feeds, NEL and line separators in subject values, keys, the
    session, user, reason and warnings are written out: each field is its label and one line,
    each warning one line, so no value forges a field or a line of its own."""
    odd = "a" + "b".join(BREAKS) + "z"
    card = replace(
        hand_card({"payee": FIELD, "x": odd, odd: 1, "n": [FIELD]}, clock, session_id=FIELD, user_id=odd),
        reason=FIELD,
        warnings=(f"/args/x: {FIELD}", odd),
    )
    n = Notification(
        kind="pending", tool="send_email", approver_role="support_lead", at=clock.now(), card=card
    )
    body = message(n, inbox_url=INBOX, now=clock.now())
    for o in text_objects(body["blocks"]):
        for c in BREAKS[1:]:
            assert c not in o["text"], (c, o)
    fields = [f["text"] for b in body["blocks"] if "fields" in b for f in b["fields"]]
    assert all(f.count("\n") == 1 for f in fields), fields
    [subject] = [f for f in fields if f.startswith("Subject\n")]
    assert "payee=ACME Ltd&lt;U+000A&gt;&lt;U+000A&gt;Approvals&lt;U+000A&gt;1 of 1" in subject
    [listed] = [p for p in rendered(body)[2] if p.startswith("• ")]
    assert listed.count("\n") == 1


def test_newlines_in_a_proposal_cannot_forge_fields(rig: Rig, router: respx.MockRouter) -> None:
    """A real proposal whose session and user ids carry newlines and would-be fields: its message
    still has exactly one Approvals and one Status-free field list, each value on one line."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    propose(
        gate,
        "send_email",
        {"to": ["a@example.test"], "subject": "hi", "body": "hi"},
        context("m1", session_id=FIELD, user_id=FIELD),
    )
    body = json.loads(route.calls[0].request.content)
    fields = [f["text"] for b in body["blocks"] if "fields" in b for f in b["fields"]]
    assert all(f.count("\n") == 1 for f in fields), fields
    assert sum("\nApprovals\n" in f or f.startswith("Approvals\n") for f in fields) == 1
    assert not any("\nStatus" in f for f in fields)


def _open_at_end(text: str) -> list[str]:
    """The embeddings and overrides still open at the end of `text` (UAX #9, simplified: a PDI
    with no open isolate does nothing; one closes its isolate and what was opened inside it)."""
    stack: list[str] = []
    for c in text:
        if c in "\u2066\u2067\u2068":
            stack.append("isolate")
        elif c == "\u2069" and "isolate" in stack:
            while stack.pop() != "isolate":
                pass
        elif c in _OPENERS:
            stack.append("embedding")
        elif c == "\u202c" and stack and stack[-1] == "embedding":
            stack.pop()
    return stack


@pytest.mark.parametrize(
    "value", ["ACME\u2069\u202e", "\u05d0\u2069\u202e", "x\u2066\u202b", "\u202e\u202c\u2069\u202d"]
)
def test_a_value_cannot_close_its_isolate_or_leave_an_override_open(value: str, clock: FakeClock) -> None:
    """A pop-directional-isolate inside a value followed by an override: written out, so no
    plain text ends with an embedding or override still open, and none reaches Slack raw."""
    card = hand_card({"a_payee": value, "b_iban": "GB33BUKB20201555555555"}, clock, session_id=value)
    n = Notification(kind="pending", tool="pay", approver_role="finance", at=clock.now(), card=card)
    body = message(n, inbox_url=INBOX, now=clock.now())
    for o in text_objects(body["blocks"]):
        assert _open_at_end(o["text"]) == [], o
        assert not any(c in o["text"] for c in _OPENERS + "\u202c\u2066\u2067"), o
    [subject] = [p for p in rendered(body)[2] if p.startswith("Subject\n")]
    assert "&lt;U+2" in subject
    assert subject.endswith(", b_iban=GB33BUKB20201555555555")
