"""What a webhook says: a Slack-compatible message built from the stored record.

The body is what Slack's incoming webhooks accept (`text`, `blocks`), plus Slack's message
`metadata` carrying the facts a program needs (approval id, version, args hash, delivery id). It
names the tool, effect, role, subject and deadline, warns when the card's text is not what it
looks like, and links to the card; the arguments themselves are shown only on the card, where
the reviewer decides.

Two kinds of text, kept apart:
- trusted text (the tool, effect, reversibility and role come from the effect table; counts,
  versions, times and links from the gate) may be `mrkdwn`, Slack's formatting;
- every value that came from a call (subject values, session and user ids, reasons, provider
  references, the warnings that quote them) is a `plain_text` object with `"emoji": false`, so
  Slack shows it as typed: no bold, italics, strike, code, link, mention or emoji. It is also
  escaped for &, < and >, clipped to a bounded length (the card shows all of it), and text
  that is not plain ASCII is wrapped in a Unicode isolate so a bidirectional override inside it
  cannot reorder the text around it.
The top-level `text` (what a phone notification shows) holds trusted text only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from .._display import remaining, when
from .._notice import Notification

VALUE_CHARS = 200  # of one call-written value in the message; the card shows all of it
SUBJECT_ENTRIES = 8
WARNINGS_SHOWN = 8
# FIRST STRONG ISOLATE ... POP DIRECTIONAL ISOLATE: closes any embedding or override left open inside.
_ISOLATE, _POP = "\u2068", "\u2069"


def escape(text: object) -> str:
    """Slack's three control characters; after this, text is shown as text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shown(value: object, limit: int = VALUE_CHARS) -> str:
    """A call-written value as it goes into a plain_text object: as JSON unless a string,
    escaped, clipped to `limit` characters (never inside an entity) and, unless plain ASCII,
    isolated."""
    raw = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = escape(raw)
    if len(text) > limit:
        cut = text[:limit]
        amp = cut.rfind("&")
        if amp != -1 and ";" not in cut[amp:]:
            cut = cut[:amp]
        text = cut + "…"
    return text if raw.isascii() else _ISOLATE + text + _POP


def plain(text: str) -> dict[str, Any]:
    """A text object Slack shows as typed."""
    return {"type": "plain_text", "text": text, "emoji": False}


def trusted(text: str) -> dict[str, Any]:
    """A mrkdwn text object, for text from the table and the gate only; `verbatim` keeps Slack
    from turning anything in it into a link or mention."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


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
    entries = sorted(subject.items(), key=lambda kv: str(kv[0]))
    parts = [f"{shown(k)}={shown(v)}" for k, v in entries[:SUBJECT_ENTRIES]]
    if len(entries) > SUBJECT_ENTRIES:
        parts.append(f"… and {len(entries) - SUBJECT_ENTRIES} more")
    return ", ".join(parts)


def _headline(n: Notification, now: float) -> str:
    """Trusted text only: the tool, its effect and reversibility, the role, the countdown."""
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
    """(label, text ready for plain_text): call-written values go through `shown`."""
    card = n.card
    if card is None:
        return [
            ("Tool", escape(n.tool)),
            ("Role", escape(n.approver_role or "-")),
            ("Reason", shown(n.reason) if n.reason else "-"),
            ("Provider ref", shown(n.provider_ref) if n.provider_ref else "-"),
        ]
    fields = [
        ("Subject", _subject(n)),
        ("Approvals", f"{card.approvals_given} of {card.approvals_required}"),
        ("Version", str(card.version)),
        ("Args sha256", card.args_hash[:16] + "…"),
        ("Expires", f"{when(card.expires_at)} ({remaining(card.expires_at - now)})"),
        ("Session", shown(card.session_id)),
        ("User", shown(card.user_id)),
    ]
    if card.reason:
        fields.append(("Reason", shown(card.reason)))
    return fields


def _warning_blocks(warnings: Iterable[str]) -> list[dict[str, Any]]:
    """The card's warnings, before anything else about the call: a trusted heading with their
    count, then the warnings themselves as plain text (they quote call-written keys and words)."""
    items = list(warnings)
    if not items:
        return []
    lines = [f"• {shown(w)}" for w in items[:WARNINGS_SHOWN]]
    if len(items) > WARNINGS_SHOWN:
        lines.append(f"… and {len(items) - WARNINGS_SHOWN} more on the card")
    heading = (
        f":warning: *{_count(len(items))}: text on this card is not what it looks like.* "
        "Read the card closely before deciding."
    )
    return [
        {"type": "section", "text": trusted(heading)},
        {"type": "section", "text": plain("\n".join(lines))},
    ]


def _count(warnings: int) -> str:
    return f"{warnings} warning" + ("" if warnings == 1 else "s")


def message(n: Notification, *, inbox_url: str | None, now: float) -> dict[str, Any]:
    """The Slack-compatible body for one notice (see the module's docstring for what may be
    formatted and what is plain text)."""
    link = card_url(n, inbox_url)
    headline = _headline(n, now)
    card = n.card
    warnings = tuple(card.warnings) if card is not None else ()
    text = headline
    if warnings:
        text += f" :warning: {_count(len(warnings))} on the card."
    if link:
        text += f" <{link}|Open the card>"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": trusted(headline)}]
    blocks += _warning_blocks(warnings)
    blocks.append(
        {"type": "section", "fields": [plain(f"{k}\n{v}") for k, v in _fields(n, now)]},
    )
    if link:
        label = "Open the queue" if n.kind == "needs_reconciliation" else "Open the card"
        blocks.append(
            {
                "type": "actions",
                "elements": [{"type": "button", "text": plain(label), "url": link}],
            }
        )
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
