"""The webhook body: every call-written value is Slack plain text (never mrkdwn, never in the
fallback text), and the card's warnings reach the reviewer before the card is opened."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
import respx

from effectgate.examples.shop import context
from effectgate.notify import Notification, NotificationKind, message
from effectgate.testing import FakeClock

from .conftest import INBOX, URL, Rig, hand_card, propose

HOSTILE = "*bold* <https://evil.example|click> @channel evil.example _x_ `y`"
RLO = "ad\u202egpj.exe@example.test"  # shows as "ad" + "tset.elpmaxe@exe.jpg"
# What must never be Slack formatting: each is only ever inside a plain_text object (the bidi
# override and the zero-width space written out, as `reveal` writes them).
MARKERS = ("*bold*", "evil.example", "@channel", "_x_", "`y`", "&lt;U+202E&gt;", "&lt;U+200B&gt;")


def text_objects(node: Any) -> Iterator[dict[str, Any]]:
    """Every Slack text object anywhere in a body."""
    if isinstance(node, Mapping):
        if node.get("type") in ("plain_text", "mrkdwn") and isinstance(node.get("text"), str):
            yield dict(node)
        for value in node.values():
            yield from text_objects(value)
    elif isinstance(node, list):
        for item in node:
            yield from text_objects(item)


def rendered(body: Mapping[str, Any]) -> tuple[str, list[str], list[str]]:
    """(fallback text, mrkdwn texts, plain texts); asserts every text object is marked safe."""
    objects = list(text_objects(body["blocks"]))
    for o in objects:
        if o["type"] == "plain_text":
            assert o["emoji"] is False, o
        else:
            assert o["verbatim"] is True, o
    mrkdwn = [o["text"] for o in objects if o["type"] == "mrkdwn"]
    plain = [o["text"] for o in objects if o["type"] == "plain_text"]
    return body["text"], mrkdwn, plain


def assert_only_plain(body: Mapping[str, Any], markers: tuple[str, ...]) -> list[str]:
    """Each marker appears in some plain_text object and in no mrkdwn text nor the fallback."""
    text, mrkdwn, plain = rendered(body)
    for marker in markers:
        assert marker not in text, marker
        assert all(marker not in m for m in mrkdwn), marker
        assert any(marker in p for p in plain), marker
    return plain


def test_model_written_values_reach_slack_only_as_plain_text(
    rig: Rig, router: respx.MockRouter, clock: FakeClock
) -> None:
    """A real proposal whose subject, session and user carry Slack markup, links, mentions, a bidi
    override and a zero-width space posts them only as plain text; the warnings come first."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    ctx = context("m1", session_id="s-*bold*-@channel", user_id="u_x_\u200b")
    out = propose(gate, "send_email", {"to": [HOSTILE, RLO], "subject": "hi", "body": "hi"}, ctx)
    warnings = out.card.warnings
    assert any("U+202E" in w for w in warnings)
    body = json.loads(route.calls[0].request.content)
    plain = assert_only_plain(body, MARKERS)
    raw = json.dumps(body, ensure_ascii=False)
    assert "\u202e" not in raw
    assert "\u200b" not in raw
    assert "<https://evil.example" not in raw
    assert any("&lt;https://evil.example|click&gt;" in p for p in plain)
    text, mrkdwn, _ = rendered(body)
    assert f"{len(warnings)} warning" in text
    assert any(f"{len(warnings)} warning" in m for m in mrkdwn)
    for w in warnings:
        assert any(w.split(": ", 1)[1] in p for p in plain), w
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds[:3] == ["section", "section", "section"]
    assert body["blocks"][2]["text"]["type"] == "plain_text"  # the warnings, before the fields


@pytest.mark.parametrize("kind", ["pending", "expiring", "needs_reconciliation"])
def test_no_call_value_in_mrkdwn_or_fallback(kind: NotificationKind, clock: FakeClock) -> None:
    """For every kind of notice, subject, session, user, reason and provider ref are plain text only."""
    base: dict[str, Any] = {"tool": "send_email", "approver_role": "support_lead", "at": clock.now()}
    if kind == "needs_reconciliation":
        n = Notification(kind=kind, key="op-1", reason=HOSTILE, provider_ref=RLO, **base)
    else:
        card = hand_card({"to": HOSTILE}, clock, session_id=RLO, user_id="u\u200b_x_")
        n = Notification(kind=kind, card=card, approval_id="a-1", version=1, **base)
    body = message(n, inbox_url=INBOX, now=clock.now())
    assert_only_plain(body, MARKERS if kind != "needs_reconciliation" else MARKERS[:-1])


def test_the_fallback_text_names_only_trusted_facts(clock: FakeClock) -> None:
    """The notification text is the headline (tool, effect, reversibility, role), the warning count
    and the card link: nothing else from the card."""
    card = hand_card({"to": "ada@example.test"}, clock, warnings=("/args/to: invisible",))
    n = Notification(
        kind="pending", tool="send_email", approver_role="support_lead", at=clock.now(), card=card
    )
    text = message(n, inbox_url=INBOX, now=clock.now())["text"]
    for fact in ("send_email", "send", "irreversible", "support_lead", "1 warning on the card"):
        assert fact in text
    for value in ("ada@example.test", "s-1", "u1", "invisible"):
        assert value not in text


def test_a_card_without_warnings_has_no_warning_blocks(clock: FakeClock) -> None:
    """No warnings: no warning heading, no warning list, no count in the fallback."""
    n = Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"to": "ada@example.test"}, clock),
    )
    body = message(n, inbox_url=INBOX, now=clock.now())
    assert "warning" not in json.dumps(body).lower()
    assert [b["type"] for b in body["blocks"]] == ["section", "section", "actions"]


def test_many_warnings_are_counted_and_folded(clock: FakeClock) -> None:
    """Twelve warnings: the heading and fallback count all twelve, eight are listed, the rest folded."""
    warnings = [f"/args/to/{i}: invisible character U+200B ZERO WIDTH SPACE" for i in range(12)]
    n = Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"to": "x"}, clock, warnings=warnings),
    )
    body = message(n, inbox_url=INBOX, now=clock.now())
    text, mrkdwn, plain = rendered(body)
    assert "12 warnings" in text
    assert any("12 warnings" in m for m in mrkdwn)
    [listed] = [p for p in plain if "/args/to/0" in p]
    assert listed.count("• ") == 8
    assert "/args/to/8" not in listed
    assert "and 4 more on the card" in listed


def test_values_are_clipped_escaped_and_revealed(clock: FakeClock) -> None:
    """A long value is clipped with an ellipsis, never inside an entity; a bidi override is written
    out, not passed on; right-to-left letters are wrapped in a Unicode isolate; ASCII is left as is."""
    n = Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"a": "x" + "&" * 1000, "b": RLO, "c": "plain", "d": "\u05d0\u05d1 1"}, clock),
    )
    body = message(n, inbox_url=INBOX, now=clock.now())
    [subject] = [p for p in rendered(body)[2] if p.startswith("Subject\n")]
    first, second, third, fourth = subject.removeprefix("Subject\n").split(", ")
    assert first.startswith("a=x&amp;")
    assert first.endswith("&amp;…")
    assert len(first) < 250
    assert second == "b=ad&lt;U+202E&gt;gpj.exe@example.test"
    assert third == "c=plain"
    assert fourth == "d=\u2068\u05d0\u05d1 1\u2069"
