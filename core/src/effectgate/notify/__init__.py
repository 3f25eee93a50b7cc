"""Notifications for reviewers: signed, Slack-compatible webhooks.

    from effectgate import EffectGate, Keyring
    from effectgate.notify import WebhookNotifier
    hook = WebhookNotifier(SLACK_URL, keyring=Keyring.parse(WEBHOOK_KEYS), inbox_url="https://inbox")
    gate = EffectGate(table, store, notify=hook)   # new approvals and needs_reconciliation
    gate.warn_expiring(within=900)                 # periodically: approvals about to lapse

A receiver checks each request with one `seen = SeenDeliveries()` for its lifetime:
`verify_webhook(keyring, raw_body, headers, now=time.time(), seen=seen)` refuses a bad or stale
signature and a delivery it has already accepted.
Needs the `notify` extra: pip install "effectgate[notify]".
"""

from __future__ import annotations

from ..errors import MissingDependency

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the install-hint test
    raise MissingDependency("httpx (webhook notifications)", "notify") from exc

from .._notice import Notification, NotificationKind
from ._message import message
from ._signature import DELIVERY, EVENT, KEY_ID, SIGNATURE, TIMESTAMP, SeenDeliveries, verify_webhook
from ._webhook import ALL_KINDS, Delivery, WebhookNotifier

__all__ = [
    "ALL_KINDS",
    "DELIVERY",
    "EVENT",
    "KEY_ID",
    "SIGNATURE",
    "TIMESTAMP",
    "Delivery",
    "Notification",
    "NotificationKind",
    "SeenDeliveries",
    "WebhookNotifier",
    "message",
    "verify_webhook",
]
