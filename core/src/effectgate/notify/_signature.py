"""How a webhook request is signed, and how a receiver checks it (signature, age, replay).

Signature: `X-Effectgate-Signature: v1=<hex HMAC-SHA256(key, "v1:" + timestamp + ":" + body)>`,
with `X-Effectgate-Timestamp` (Unix seconds, ASCII digits) and `X-Effectgate-Key-Id`. Each notice
also carries a delivery id, in `X-Effectgate-Delivery` and inside the signed body
(`metadata.event_payload.delivery`), and its kind, in `X-Effectgate-Event` and inside the signed
body (`metadata.event_payload.kind`); only the signed ones count, and a header that disagrees
with them is refused. A receiver checks each request with `verify_webhook`, passing a
`SeenDeliveries` to refuse a delivery it has already accepted.
"""

from __future__ import annotations

import heapq
import hmac
import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import WebhookSignatureError
from ..tokens import Keyring

SIGNATURE = "X-Effectgate-Signature"
TIMESTAMP = "X-Effectgate-Timestamp"
KEY_ID = "X-Effectgate-Key-Id"
DELIVERY = "X-Effectgate-Delivery"
EVENT = "X-Effectgate-Event"
SCHEME = "v1"

# Every header is matched against its exact ASCII shape before it is parsed or looked up:
# `str.isdigit` accepts "²" and "١٢٣" (which `int` then rejects or reads), and `int` refuses
# strings of more than 4300 digits, so neither may see an unchecked header.
_STAMP = re.compile(r"[0-9]{1,15}")
_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")  # the Keyring's own key-id alphabet
_MAC = re.compile(r"v1=[0-9a-f]{64}")
_DELIVERY_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _signed(timestamp: int | str, body: bytes) -> bytes:
    return f"{SCHEME}:{timestamp}:".encode() + body


def sign(keyring: Keyring, body: bytes, timestamp: int) -> dict[str, str]:
    """The signature headers for `body` sent at `timestamp` (Unix seconds)."""
    kid, mac = keyring.hmac_hex(_signed(timestamp, body))
    return {SIGNATURE: f"{SCHEME}={mac}", TIMESTAMP: str(timestamp), KEY_ID: kid}


class SeenDeliveries:
    """The delivery ids a receiver has accepted, each kept while a copy of its request could still
    pass the timestamp check (until its signed timestamp + the tolerance), then forgotten.

    Pass one to every `verify_webhook(..., seen=...)` call of a receiver process; it is
    thread-safe. It holds only ids of requests whose signature verified, so its size is bounded
    by what the sender sends within one tolerance window. It lives in memory: receivers behind
    several processes need one shared log (the same `remember` on a shared store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []  # a heap of (until, id); stale pairs are skipped

    def remember(self, delivery_id: str, *, until: float, now: float) -> bool:
        """Record `delivery_id` as accepted until `until`: True if it is new, False if it is
        already remembered (then it is kept until the later of the two times, since the refused
        copy could itself be replayed until then). Ids whose time passed before `now` are
        forgotten first."""
        with self._lock:
            self._prune(now)
            known = self._until.get(delivery_id)
            if known is None or until > known:
                self._until[delivery_id] = until
                heapq.heappush(self._expiry, (until, delivery_id))
            return known is None

    def forget(self, delivery_id: str) -> None:
        """Drop `delivery_id`, so the sender's retry of it is accepted: call it when the receiver
        verified a delivery but could not act on it (and answered with an error)."""
        with self._lock:
            self._until.pop(delivery_id, None)

    def __contains__(self, delivery_id: object) -> bool:
        """Whether `delivery_id` is remembered (expired ids leave at the next `remember`)."""
        with self._lock:
            return delivery_id in self._until

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)

    def _prune(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            until, delivery_id = heapq.heappop(self._expiry)
            if self._until.get(delivery_id) == until:
                del self._until[delivery_id]


def _header(headers: Mapping[Any, Any], name: str) -> str | None:
    """One header's value, matched case-insensitively; two spellings with different values
    (a hand-built mapping) are refused rather than one of them picked."""
    values = [v for k, v in headers.items() if isinstance(k, str) and k.lower() == name.lower()]
    if any(v != values[0] for v in values[1:]):
        raise WebhookSignatureError("forged", f"conflicting {name} headers")
    value = values[0] if values else None
    if value is not None and not isinstance(value, str):
        raise WebhookSignatureError("missing", f"the {name} header is not text")
    return value


def _signed_payload(body: bytes) -> dict[str, Any]:
    """The event payload inside a verified body, or {} if it carries none."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    metadata = parsed.get("metadata") if isinstance(parsed, dict) else None
    payload = metadata.get("event_payload") if isinstance(metadata, dict) else None
    return payload if isinstance(payload, dict) else {}


def _signed_delivery(payload: dict[str, Any]) -> str | None:
    """The delivery id inside a verified payload, or None if it carries none."""
    delivery = payload.get("delivery")
    if isinstance(delivery, str) and _DELIVERY_ID.fullmatch(delivery):
        return delivery
    return None


def verify_webhook(
    keyring: Keyring,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float,
    tolerance: float = 300,
    seen: SeenDeliveries | None = None,
) -> None:
    """Check a received request; raise WebhookSignatureError unless all of these hold:

    - the signature, timestamp and key-id headers are present and well-formed ("missing");
    - the timestamp is within `tolerance` seconds of `now` ("stale");
    - the key id is in `keyring` ("unknown_key");
    - the MAC matches the raw body, compared in constant time ("forged");
    - an `X-Effectgate-Delivery` header, if sent, equals the delivery id in the signed body
      ("forged"), and an `X-Effectgate-Event` header, if sent, equals its kind ("forged");
    - with `seen`: the signed body carries a delivery id ("missing") that `seen` has not accepted
      within the window ("replayed"); it is remembered once everything else has passed.

    The sender retries a failed delivery with the same delivery id, so answer "replayed" with a
    2xx (it was handled) and do not act on it again; if the receiver could not act on a verified
    delivery, `seen.forget(id)` lets the retry through."""
    signature = _header(headers, SIGNATURE)
    stamp = _header(headers, TIMESTAMP)
    kid = _header(headers, KEY_ID)
    if not signature or not stamp or not kid:
        raise WebhookSignatureError("missing", "the request carries no effectgate signature headers")
    if not _STAMP.fullmatch(stamp):
        raise WebhookSignatureError("missing", "the timestamp is not Unix seconds")
    sent = int(stamp)
    if not abs(now - sent) <= tolerance:  # also refuses a NaN `now`
        raise WebhookSignatureError("stale", f"the timestamp is more than {tolerance:g}s from now")
    if not _KID.fullmatch(kid):
        raise WebhookSignatureError("unknown_key", "the key id is not one a keyring can hold")
    try:
        _, expected = keyring.hmac_hex(_signed(stamp, body), kid=kid)
    except Exception as exc:
        raise WebhookSignatureError("unknown_key", f"no key with id {kid!r}") from exc
    if not _MAC.fullmatch(signature) or not hmac.compare_digest(
        signature.encode(), f"{SCHEME}={expected}".encode()
    ):
        raise WebhookSignatureError("forged", "the signature does not match the body")
    claimed = _header(headers, DELIVERY)
    event = _header(headers, EVENT)
    if claimed is None and event is None and seen is None:
        return
    payload = _signed_payload(body)
    delivery = _signed_delivery(payload)
    # ids and kinds, not secrets: no constant-time comparison needed
    if claimed is not None and claimed != delivery:
        raise WebhookSignatureError("forged", "the delivery header is not the signed delivery id")
    if event is not None and event != payload.get("kind"):
        raise WebhookSignatureError("forged", "the event header is not the signed event kind")
    if seen is None:
        return
    if delivery is None:
        raise WebhookSignatureError("missing", "the signed body carries no delivery id")
    if not seen.remember(delivery, until=sent + tolerance, now=now):
        raise WebhookSignatureError("replayed", f"delivery {delivery} was already accepted")
