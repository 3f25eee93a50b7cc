"""The webhook notifier: a Slack-compatible, signed request per notice, retried with backoff off
the gate's thread, every delivery recorded in the gate's log; the receiver is mocked with respx
and time is a FakeClock, so nothing touches the network or sleeps."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import respx

from effectgate import Keyring
from effectgate.errors import WebhookSignatureError
from effectgate.examples.shop import Shop, app
from effectgate.notify import (
    DELIVERY,
    EVENT,
    KEY_ID,
    SIGNATURE,
    TIMESTAMP,
    Notification,
    verify_webhook,
)
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import EVIL, INBOX, URL, MakeNotifier, Rig, hand_card, propose


def detail(store: SQLStore, kind: str) -> list[dict[str, Any]]:
    return [json.loads(e.detail_json) for e in store.events(kind=kind)]


def webhook_events(store: SQLStore) -> list[str]:
    return [e.kind for e in store.events() if e.kind.startswith(("webhook_", "notify_"))]


def test_a_proposal_posts_one_slack_compatible_message(
    rig: Rig, router: respx.MockRouter, store: SQLStore
) -> None:
    """A refund proposal posts one Slack-shaped message linking to its card; the log names only the host."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    out = propose(gate)
    assert route.call_count == 1
    request = route.calls[0].request
    body = json.loads(request.content)
    assert isinstance(body["blocks"], list)
    assert body["blocks"]
    assert f"<{INBOX}/approvals/{out.approval_id}|Open the card>" in body["text"]
    payload = body["metadata"]["event_payload"]
    assert body["metadata"]["event_type"] == "effectgate_pending"
    assert (payload["approval_id"], payload["version"], payload["tool"]) == (
        out.approval_id,
        1,
        "refund_order",
    )
    assert payload["approver_role"] == "finance"
    assert payload["args_hash"] == out.card.args_hash
    assert request.headers[EVENT] == "pending"
    assert request.headers[DELIVERY] == payload["delivery"]
    [event] = store.events(kind="webhook_delivered")
    assert (event.approval_id, event.version) == (out.approval_id, 1)
    recorded = json.loads(event.detail_json)
    assert (recorded["attempts"], recorded["target"], recorded["statuses"]) == (
        1,
        "hooks.example.test",
        [200],
    )
    assert all("/T1" not in e.detail_json for e in store.events())


def test_the_signature_verifies_and_refuses_tampering(
    notice: Notification,
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    ring: Keyring,
    clock: FakeClock,
) -> None:
    """The request verifies with the webhook keyring and nothing else: a changed byte, a late check,
    another keyring or missing headers are each refused with their reason."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    assert make_notifier().deliver(notice).delivered
    request = route.calls[0].request
    body, headers, now = request.content, request.headers, clock.now()
    assert headers[KEY_ID] == ring.current
    verify_webhook(ring, body, headers, now=now)

    def reason(keys: Keyring, raw: bytes, hdrs: Mapping[str, str], at: float) -> str:
        with pytest.raises(WebhookSignatureError) as info:
            verify_webhook(keys, raw, hdrs, now=at)
        return info.value.reason

    tampered = bytes([body[0] ^ 1]) + body[1:]
    assert reason(ring, tampered, headers, now) == "forged"
    assert reason(ring, body, headers, now + 301) == "stale"
    assert reason(Keyring.generate("other"), body, headers, now) == "unknown_key"
    assert reason(Keyring.generate(ring.current), body, headers, now) == "forged"
    assert reason(ring, body, {}, now) == "missing"
    unsigned = {k: v for k, v in headers.items() if k.lower() != SIGNATURE.lower()}
    assert reason(ring, body, unsigned, now) == "missing"


def test_retries_honour_retry_after_and_re_sign(
    notice: Notification,
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    ring: Keyring,
    clock: FakeClock,
    store: SQLStore,
) -> None:
    """503, 429 (Retry-After: 7), 200: three requests, waits of 1 s and 7 s, each re-signed at its own
    time under one delivery id, and one delivery recorded."""
    route = router.post(URL).mock(
        side_effect=[
            httpx.Response(503),
            httpx.Response(429, headers={"Retry-After": "7"}),
            httpx.Response(200),
        ]
    )
    d = make_notifier(backoff=1.0).deliver(notice)
    assert (d.delivered, d.attempts, d.statuses, d.waits) == (True, 3, (503, 429, 200), (1.0, 7.0))
    assert clock.slept == [1.0, 7.0]
    requests = [c.request for c in route.calls]
    assert len(requests) == 3
    stamps = [int(r.headers[TIMESTAMP]) for r in requests]
    assert stamps[1] - stamps[0] == 1
    assert stamps[2] - stamps[1] == 7
    for r in requests:
        verify_webhook(ring, r.content, r.headers, now=float(r.headers[TIMESTAMP]))
    assert {r.headers[DELIVERY] for r in requests} == {d.delivery_id}
    assert len({r.headers[SIGNATURE] for r in requests}) == 3
    [recorded] = detail(store, "webhook_delivered")
    assert (recorded["attempts"], recorded["statuses"]) == (3, [503, 429, 200])
    assert detail(store, "webhook_failed") == []


def test_connection_errors_retry_then_fail_without_touching_the_call(
    rig: Rig, router: respx.MockRouter, store: SQLStore, clock: FakeClock
) -> None:
    """A receiver that is down is tried `attempts` times, then one webhook_failed is logged; the call
    is still Pending and its approval untouched."""
    route = router.post(URL).mock(side_effect=httpx.ConnectError("down"))
    gate, _ = rig(attempts=3)
    out = propose(gate)
    assert route.call_count == 3
    assert clock.slept == [1.0, 2.0]
    [failed] = store.events(kind="webhook_failed")
    assert (failed.approval_id, failed.version) == (out.approval_id, 1)
    recorded = json.loads(failed.detail_json)
    assert (recorded["attempts"], recorded["statuses"]) == (3, [None, None, None])
    assert "ConnectError" in recorded["error"]
    assert "down" in recorded["error"]
    assert webhook_events(store) == ["webhook_failed"]
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert (row.status, row.version) == ("pending", 1)
    assert gate.card(out.approval_id) == out.card


def test_a_client_error_is_final(
    notice: Notification,
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    clock: FakeClock,
    store: SQLStore,
) -> None:
    """A 400 is not retried: one request, no wait, one webhook_failed."""
    route = router.post(URL).mock(return_value=httpx.Response(400))
    d = make_notifier().deliver(notice)
    assert (d.delivered, d.attempts, d.statuses, d.error) == (False, 1, (400,), "HTTP 400")
    assert route.call_count == 1
    assert clock.slept == []
    [recorded] = detail(store, "webhook_failed")
    assert (recorded["attempts"], recorded["error"]) == (1, "HTTP 400")


def test_an_unexpected_client_error_is_recorded_not_raised(
    notice: Notification,
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    clock: FakeClock,
    store: SQLStore,
) -> None:
    """An error that is not an HTTP failure (a broken client) is final and recorded, never raised."""
    route = router.post(URL).mock(side_effect=RuntimeError("client bug"))
    d = make_notifier().deliver(notice)
    assert (d.delivered, d.attempts) == (False, 1)
    assert route.call_count == 1
    assert clock.slept == []
    [recorded] = detail(store, "webhook_failed")
    assert "client bug" in recorded["error"]


def test_backoff_doubles_up_to_its_cap(
    notice: Notification,
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    clock: FakeClock,
    store: SQLStore,
) -> None:
    """Waits double from `backoff` and stop at `max_backoff`."""
    route = router.post(URL).mock(return_value=httpx.Response(500))
    d = make_notifier(backoff=10, max_backoff=15, attempts=4).deliver(notice)
    assert route.call_count == 4
    assert clock.slept == [10.0, 15.0, 15.0]
    assert (d.delivered, d.attempts, d.waits) == (False, 4, (10.0, 15.0, 15.0))
    assert detail(store, "webhook_failed")[0]["statuses"] == [500] * 4


def test_a_hanging_webhook_never_blocks_the_gate(rig: Rig, router: respx.MockRouter, store: SQLStore) -> None:
    """With background delivery the call returns while the receiver hangs; flush then sees it through."""
    entered, release = threading.Event(), threading.Event()

    def stuck(request: httpx.Request) -> httpx.Response:
        entered.set()
        release.wait(10)
        return httpx.Response(200)

    route = router.post(URL).mock(side_effect=stuck)
    gate, notifier = rig(background=True)
    try:
        out = propose(gate)
        assert entered.wait(10), "the delivery never started"
        assert not release.is_set()
        assert store.events(kind="webhook_delivered") == []
        assert notifier.flush(timeout=0.05) is False
    finally:
        release.set()
    assert notifier.flush(timeout=10) is True
    assert route.call_count == 1
    [event] = store.events(kind="webhook_delivered")
    assert event.approval_id == out.approval_id


@pytest.mark.parametrize("kind", ["pending", "needs_reconciliation"])
def test_call_values_are_escaped(
    kind: str, make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock
) -> None:
    """A subject, reason or provider ref written by a model or a provider shows as text: no mention,
    no link, no markup survives into `text` or any block."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    base: dict[str, Any] = {"tool": "send_email", "approver_role": "support_lead", "at": clock.now()}
    if kind == "pending":
        card = hand_card({"to": EVIL, EVIL: "x"}, clock)
        n = Notification(kind="pending", card=card, record=lambda k, d: recorded.append((k, d)), **base)
    else:
        n = Notification(
            kind="needs_reconciliation",
            key="op-1",
            reason=EVIL,
            provider_ref=EVIL,
            record=lambda k, d: recorded.append((k, d)),
            **base,
        )
    assert make_notifier().deliver(n).delivered
    body = json.loads(route.calls[0].request.content)
    rendered = [body["text"], json.dumps(body["blocks"], ensure_ascii=False)]
    for text in rendered:
        assert "<!channel>" not in text
        assert "<https://evil" not in text
    assert "&lt;!channel&gt;" in rendered[1]
    assert "&amp; co" in rendered[1]
    assert [k for k, _ in recorded] == ["webhook_delivered"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"roles": {"support_lead"}}, 0),
        ({"kinds": {"needs_reconciliation"}}, 0),
        ({"roles": {"finance"}, "kinds": {"pending"}}, 1),
    ],
)
def test_roles_and_kinds_filter_notices(
    options: dict[str, Any], expected: int, rig: Rig, router: respx.MockRouter, store: SQLStore
) -> None:
    """A webhook gets only the kinds and roles it asked for; a filtered-out notice sends and logs nothing."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig(**options)
    propose(gate)
    assert route.call_count == expected
    assert webhook_events(store) == ["webhook_delivered"] * expected


@pytest.mark.parametrize("same", ["keyring", "secret"])
def test_the_gate_refuses_a_notifier_holding_its_grant_key(
    same: str, store: SQLStore, clock: FakeClock, make_notifier: MakeNotifier
) -> None:
    """A notifier signing with the gate's grant secret (same keyring, or same secret renamed) is refused."""
    grant_ring = Keyring.generate("g1")
    secret = grant_ring.dumps().partition(":")[2]
    webhook_ring = grant_ring if same == "keyring" else Keyring.parse(f"w1:{secret}")
    notifier = make_notifier(keyring=webhook_ring)
    with pytest.raises(ValueError, match="grant keyring"):
        app(store, keyring=grant_ring, clock=clock, shop=Shop(), notify=notifier)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"url": "ftp://hooks.example.test/T1"}, "http"),
        ({"url": "hooks.example.test/T1"}, "http"),
        ({"url": "https:///T1"}, "http"),
        ({"kinds": {"pending", "approved"}}, "unknown notification kinds"),
        ({"attempts": 0}, "attempts"),
    ],
)
def test_the_constructor_refuses_bad_options(
    options: dict[str, Any], match: str, make_notifier: MakeNotifier
) -> None:
    """A URL that is not http(s)://host, an unknown kind or zero attempts is refused up front."""
    with pytest.raises(ValueError, match=match):
        make_notifier(**options)


@pytest.mark.parametrize("status", [200, 400])
def test_a_failing_record_does_not_make_deliver_raise(
    status: int, make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock
) -> None:
    """When the log cannot be written, deliver still returns how the delivery went."""
    route = router.post(URL).mock(return_value=httpx.Response(status))

    def broken(kind: str, detail: Mapping[str, Any]) -> None:
        raise RuntimeError("store is down")

    n = Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"to": "x"}, clock),
        record=broken,
    )
    d = make_notifier().deliver(n)
    assert d.delivered is (status == 200)
    assert route.call_count == 1
