"""What a webhook says: a Slack-compatible message built from the stored record, and its signature.

The body is what Slack's incoming webhooks accept (`text`, `blocks`), plus Slack's message
`metadata` carrying the facts a program needs (approval id, version, args hash). It names the
tool, effect, role, subject and deadline, and links to the card; the arguments themselves are
shown only on the card, where the reviewer decides. Every value that came from a call (a subject
id is model-written) is escaped, so it cannot become a link, a mention or formatting.

Signature: `X-Effectgate-Signature: v1=<hex HMAC-SHA256(key, "v1:" + timestamp + ":" + body)>`,
with `X-Effectgate-Timestamp` (Unix seconds) and `X-Effectgate-Key-Id`; the receiver checks it
with `verify_webhook`, constant-time, and refuses timestamps outside its tolerance (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from .._display import remaining, when
from .._notice import Notification
from ..errors import WebhookSignatureError
from ..tokens import Keyring

SIGNATURE = "X-Effectgate-Signature"
TIMESTAMP = "X-Effectgate-Timestamp"
KEY_ID = "X-Effectgate-Key-Id"
DELIVERY = "X-Effectgate-Delivery"
EVENT = "X-Effectgate-Event"
SCHEME = "v1"


def escape(text: object) -> str:
    """Slack's three control characters; after this, text is shown as text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def delivery_id(n: Notification) -> str:
    """Stable for one notice (kind, approval version, operation key): retries and duplicate
    scans carry the same id, so a receiver can drop what it has already shown."""
    basis = json.dumps([n.kind, n.approval_id, n.version, n.key], separators=(",", ":"))
    return hashlib.sha256(basis.encode()).hexdigest()[:32]


def card_url(n: Notification, inbox_url: str | None) -> str | None:
    if inbox_url is None:
        return None
    base = inbox_url.rstrip("/")
    if n.kind == "needs_reconciliation":
        return f"{base}/reconciliation"
    if n.approval_id is None:
        return base + "/"
    return f"{base}/approvals/{quote(n.approval_id, safe='')}"


def _subject(n: Notification) -> str:
    subject = n.card.subject if n.card is not None else None
    if not subject:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in sorted(subject.items()))


def _headline(n: Notification, now: float) -> str:
    role = escape(n.approver_role or "the tool's owner")
    tool = escape(n.tool)
    card = n.card
    if n.kind == "needs_reconciliation":
        return (
            f":warning: *Needs reconciliation*: `{tool}` ran but its outcome at the provider is "
            f"unknown; *{role}* must settle it before anyone retries."
        )
    assert card is not None
    what = f"`{tool}` ({escape(card.effect)}, {escape(card.reversibility)})"
    if n.kind == "expiring":
        left = remaining(card.expires_at - now)
        return f":hourglass: *Approval expiring {escape(left)}*: {what} waits for *{role}*."
    return f":raising_hand: *Approval needed*: {what} waits for *{role}*."


def _fields(n: Notification, now: float) -> list[tuple[str, str]]:
    card = n.card
    if card is None:
        fields = [("Tool", n.tool), ("Role", n.approver_role or "-")]
        fields += [("Reason", n.reason or "-"), ("Provider ref", n.provider_ref or "-")]
        return fields
    return [
        ("Subject", _subject(n)),
        ("Approvals", f"{card.approvals_given} of {card.approvals_required}"),
        ("Version", str(card.version)),
        ("Args sha256", card.args_hash[:16] + "…"),
        ("Expires", f"{when(card.expires_at)} ({remaining(card.expires_at - now)})"),
        ("Session", card.session_id),
    ]


def message(n: Notification, *, inbox_url: str | None, now: float) -> dict[str, Any]:
    """The Slack-compatible body for one notice."""
    link = card_url(n, inbox_url)
    headline = _headline(n, now)
    fields = _fields(n, now)
    text = headline + (f" <{link}|Open the card>" if link else "")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": headline}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{escape(v)}"} for k, v in fields],
        },
    ]
    if link:
        label = "Open the queue" if n.kind == "needs_reconciliation" else "Open the card"
        blocks.append(
            {
                "type": "actions",
                "elements": [{"type": "button", "text": {"type": "plain_text", "text": label}, "url": link}],
            }
        )
    card = n.card
    payload = {
        "kind": n.kind,
        "delivery": delivery_id(n),
        "approval_id": n.approval_id,
        "version": n.version,
        "tool": n.tool,
        "approver_role": n.approver_role,
        "args_hash": card.args_hash if card else None,
        "expires_at": card.expires_at if card else None,
        "key": n.key,
        "provider_ref": n.provider_ref,
        "reason": n.reason,
        "card_url": link,
    }
    return {
        "text": text,
        "blocks": blocks,
        "metadata": {"event_type": f"effectgate_{n.kind}", "event_payload": payload},
    }


def _signed(timestamp: int | str, body: bytes) -> bytes:
    return f"{SCHEME}:{timestamp}:".encode() + body


def sign(keyring: Keyring, body: bytes, timestamp: int) -> dict[str, str]:
    """The signature headers for `body` sent at `timestamp` (Unix seconds)."""
    kid, mac = keyring.hmac_hex(_signed(timestamp, body))
    return {SIGNATURE: f"{SCHEME}={mac}", TIMESTAMP: str(timestamp), KEY_ID: kid}


def verify_webhook(
    keyring: Keyring, body: bytes, headers: Mapping[str, str], *, now: float, tolerance: float = 300
) -> None:
    """Check a received request's signature; raise WebhookSignatureError unless the key id is in
    `keyring`, the MAC matches the raw body (constant-time) and the timestamp is within
    `tolerance` seconds of `now` (a replayed request is refused)."""
    lower = {k.lower(): v for k, v in headers.items()}
    signature = lower.get(SIGNATURE.lower())
    stamp = lower.get(TIMESTAMP.lower())
    kid = lower.get(KEY_ID.lower())
    if not signature or not stamp or not kid:
        raise WebhookSignatureError("missing", "the request carries no effectgate signature headers")
    if not stamp.isdigit():
        raise WebhookSignatureError("missing", "the timestamp is not Unix seconds")
    if abs(now - int(stamp)) > tolerance:
        raise WebhookSignatureError("stale", f"the timestamp is more than {tolerance:g}s from now")
    try:
        _, expected = keyring.hmac_hex(_signed(stamp, body), kid=kid)
    except Exception as exc:
        raise WebhookSignatureError("unknown_key", f"no key with id {kid!r}") from exc
    scheme, _, mac = signature.partition("=")
    if scheme != SCHEME or not hmac.compare_digest(mac.encode(), expected.encode()):
        raise WebhookSignatureError("forged", "the signature does not match the body")
