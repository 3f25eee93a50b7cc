"""`verify_webhook` on hostile input and replays: every malformed header is a WebhookSignatureError
(never ValueError or another crash), and with `seen` a delivery is accepted once per window, by
the delivery id the signature covers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import respx

from effectgate import Keyring
from effectgate.errors import WebhookSignatureError
from effectgate.notify import (
    DELIVERY,
    EVENT,
    KEY_ID,
    SIGNATURE,
    TIMESTAMP,
    Notification,
    SeenDeliveries,
    verify_webhook,
)
from effectgate.notify._signature import sign
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import URL, MakeNotifier, Rig, hand_card, propose

Request = tuple[bytes, dict[str, str]]
Send = Callable[..., Request]


@pytest.fixture
def send(make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock) -> Send:
    """`send(approval_id="a-1")`: deliver a hand-built notice now; the raw body and headers received."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    notifier = make_notifier()

    def deliver(approval_id: str = "a-1") -> Request:
        n = Notification(
            kind="pending",
            tool="send_email",
            approver_role="support_lead",
            at=clock.now(),
            approval_id=approval_id,
            version=1,
            card=hand_card({"to": "x"}, clock),
        )
        assert notifier.deliver(n).delivered
        request = route.calls[-1].request
        return request.content, dict(request.headers)

    return deliver


def refusal(ring: Keyring, body: bytes, headers: dict[str, Any], now: float, **kw: Any) -> str:
    with pytest.raises(WebhookSignatureError) as info:
        verify_webhook(ring, body, headers, now=now, **kw)
    return info.value.reason


def replace(headers: dict[str, str], name: str, value: Any) -> dict[str, Any]:
    kept: dict[str, Any] = {k: v for k, v in headers.items() if k.lower() != name.lower()}
    return {**kept, name: value}


@pytest.mark.parametrize(
    "stamp",
    [
        "١٢٣",
        "²",
        "1800000000²",
        "9" * 5000,
        "9" * 16,
        "-1800000000",
        "",
        " 1800000000",
        "1.8e9",
        "+18",
        "0x6B",
    ],
)
def test_a_malformed_timestamp_is_refused_not_crashed(
    stamp: str, send: Send, ring: Keyring, clock: FakeClock
) -> None:
    """Non-ASCII digits, superscripts, thousands of digits, signs, blanks and other notations are
    refused as missing or stale: nothing but WebhookSignatureError escapes."""
    body, headers = send()
    assert refusal(ring, body, replace(headers, TIMESTAMP, stamp), clock.now()) in ("missing", "stale")


@pytest.mark.parametrize(
    ("kid", "reason"),
    [("ключ", "unknown_key"), ("k" * 100_000, "unknown_key"), ("wh1\n", "unknown_key"), ("", "missing")],
)
def test_a_malformed_key_id_is_refused(
    kid: str, reason: str, send: Send, ring: Keyring, clock: FakeClock
) -> None:
    """A key id outside the keyring's alphabet or length is refused before any lookup."""
    body, headers = send()
    assert refusal(ring, body, replace(headers, KEY_ID, kid), clock.now()) == reason


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda mac: "v1=" + "é" * 64, "forged"),
        (lambda mac: "v1=" + "a" * 1_000_000, "forged"),
        (lambda mac: mac.upper().replace("V1=", "v1="), "forged"),
        (lambda mac: mac + " ", "forged"),
        (lambda mac: mac + ", " + mac, "forged"),
        (lambda mac: "v2=" + mac[3:], "forged"),
        (lambda mac: "", "missing"),
    ],
)
def test_a_malformed_signature_is_refused(
    make: Callable[[str], str], reason: str, send: Send, ring: Keyring, clock: FakeClock
) -> None:
    """Non-ASCII, huge, upper-case, padded, doubled or other-scheme signatures are refused."""
    body, headers = send()
    bad = make(headers[SIGNATURE.lower()])
    assert refusal(ring, body, replace(headers, SIGNATURE, bad), clock.now()) == reason


def test_odd_header_mappings_are_refused(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """Bytes or a list instead of text, or two spellings of one header with different values, are
    refused."""
    body, headers = send()
    stamp = headers[TIMESTAMP.lower()]
    assert refusal(ring, body, replace(headers, TIMESTAMP, stamp.encode()), clock.now()) == "missing"
    doubled = {**headers, TIMESTAMP: str(int(stamp) + 1)}
    assert refusal(ring, body, doubled, clock.now()) == "forged"
    assert refusal(ring, body, replace(headers, KEY_ID, ["wh1"]), clock.now()) == "missing"


def test_a_replayed_delivery_is_refused(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """The first copy verifies; the same request again within the window is refused as replayed."""
    body, headers = send()
    seen = SeenDeliveries()
    verify_webhook(ring, body, headers, now=clock.now(), seen=seen)
    assert json.loads(body)["metadata"]["event_payload"]["delivery"] in seen
    clock.advance(299)
    assert refusal(ring, body, headers, clock.now(), seen=seen) == "replayed"
    clock.advance(2)
    assert refusal(ring, body, headers, clock.now(), seen=seen) == "stale"


def test_other_deliveries_pass_and_old_ids_are_forgotten(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """Distinct deliveries each verify once; ids whose window has passed are dropped from the log."""
    seen = SeenDeliveries()
    first = send("a-1")
    verify_webhook(ring, *first, now=clock.now(), seen=seen)
    clock.advance(200)
    verify_webhook(ring, *send("a-2"), now=clock.now(), seen=seen)
    assert len(seen) == 2
    clock.advance(200)
    verify_webhook(ring, *send("a-3"), now=clock.now(), seen=seen)
    assert len(seen) == 2
    assert json.loads(first[0])["metadata"]["event_payload"]["delivery"] not in seen


def test_a_refused_retry_extends_the_window(
    make_notifier: MakeNotifier, router: respx.MockRouter, ring: Keyring, clock: FakeClock
) -> None:
    """A re-signed retry of an accepted delivery is refused, and stays refused for its own window,
    past the first copy's: no copy of a delivery id is ever accepted twice."""
    route = router.post(URL).mock(side_effect=[httpx.Response(503), httpx.Response(200)])
    n = Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"to": "x"}, clock),
    )
    d = make_notifier(backoff=100).deliver(n)
    assert d.statuses == (503, 200)
    first, retry = (c.request for c in route.calls)
    seen = SeenDeliveries()
    sent = float(first.headers[TIMESTAMP])
    verify_webhook(ring, first.content, first.headers, now=sent, seen=seen)
    assert refusal(ring, retry.content, retry.headers, sent + 100, seen=seen) == "replayed"
    assert refusal(ring, retry.content, retry.headers, sent + 350, seen=seen) == "replayed"
    assert refusal(ring, first.content, first.headers, sent + 350, seen=seen) == "stale"


def test_forget_lets_the_retry_through(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """A receiver that verified a delivery but could not act on it forgets it; the retry verifies."""
    body, headers = send()
    seen = SeenDeliveries()
    verify_webhook(ring, body, headers, now=clock.now(), seen=seen)
    seen.forget(json.loads(body)["metadata"]["event_payload"]["delivery"])
    verify_webhook(ring, body, headers, now=clock.now(), seen=seen)


def test_the_signed_delivery_id_counts_not_the_header(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """A header naming another delivery is forged (with or without `seen`); without the header the
    signed id is still the one remembered, so changing the header cannot dodge the replay check."""
    body, headers = send()
    other = replace(headers, DELIVERY, "0" * 32)
    assert refusal(ring, body, other, clock.now()) == "forged"
    seen = SeenDeliveries()
    assert refusal(ring, body, other, clock.now(), seen=seen) == "forged"
    assert len(seen) == 0
    bare = {k: v for k, v in headers.items() if k.lower() != DELIVERY.lower()}
    verify_webhook(ring, body, bare, now=clock.now(), seen=seen)
    assert refusal(ring, body, headers, clock.now(), seen=seen) == "replayed"
    assert refusal(ring, body, replace(headers, DELIVERY, "ünïcode" * 1000), clock.now()) == "forged"


@pytest.mark.parametrize(
    "body", [b"{}", b"not json", b"[1]", b'{"metadata": {"event_payload": {"delivery": 7}}}']
)
def test_a_signed_body_without_a_delivery_id_is_refused_with_seen(
    body: bytes, ring: Keyring, clock: FakeClock
) -> None:
    """A correctly signed body that carries no delivery id verifies alone, but not with `seen`."""
    headers = sign(ring, body, int(clock.now()))
    verify_webhook(ring, body, headers, now=clock.now())
    assert refusal(ring, body, headers, clock.now(), seen=SeenDeliveries()) == "missing"


def test_concurrent_copies_are_accepted_once(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """Sixteen threads verifying the same request at once with one log: exactly one is accepted."""
    body, headers = send()
    seen = SeenDeliveries()
    start = threading.Barrier(16)
    outcomes: list[str] = []
    lock = threading.Lock()

    def receive() -> None:
        start.wait()
        try:
            verify_webhook(ring, body, headers, now=clock.now(), seen=seen)
            result = "ok"
        except WebhookSignatureError as exc:
            result = exc.reason
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=receive) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["ok"] + ["replayed"] * 15


def test_a_gate_delivery_verifies_once(
    rig: Rig, router: respx.MockRouter, ring: Keyring, store: SQLStore
) -> None:
    """A real proposal's webhook verifies with `seen` on the first receipt and is refused on a replay."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    propose(gate)
    request = route.calls[0].request
    now = float(request.headers[TIMESTAMP])
    seen = SeenDeliveries()
    verify_webhook(ring, request.content, request.headers, now=now, seen=seen)
    assert request.headers[DELIVERY] in seen
    assert refusal(ring, request.content, dict(request.headers), now, seen=seen) == "replayed"


def test_the_signed_event_kind_counts_not_the_header(send: Send, ring: Keyring, clock: FakeClock) -> None:
    """An event header naming another kind is forged (with or without `seen`, and then nothing is
    remembered); without the header the request verifies; a signed body with no kind refuses any
    event header."""
    body, headers = send()
    assert headers[EVENT.lower()] == "pending"
    for kind in ("needs_reconciliation", "expiring", "Pending", "pending ", ""):
        assert refusal(ring, body, replace(headers, EVENT, kind), clock.now()) == "forged", kind
    seen = SeenDeliveries()
    assert refusal(ring, body, replace(headers, EVENT, "expiring"), clock.now(), seen=seen) == "forged"
    assert len(seen) == 0
    bare = {k: v for k, v in headers.items() if k.lower() != EVENT.lower()}
    verify_webhook(ring, body, bare, now=clock.now(), seen=seen)
    verify_webhook(ring, body, headers, now=clock.now())
    kindless = b'{"metadata": {"event_payload": {"delivery": "d1"}}}'
    signed = sign(ring, kindless, int(clock.now()))
    verify_webhook(ring, kindless, signed, now=clock.now())
    assert refusal(ring, kindless, {**signed, EVENT: "pending"}, clock.now()) == "forged"
