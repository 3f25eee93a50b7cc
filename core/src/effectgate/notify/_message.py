"""What a webhook says: a Slack-compatible message built from the stored record.

The body is what Slack's incoming webhooks accept (`text`, `blocks`), plus Slack's message
`metadata` carrying the facts a program needs (approval id, version, args hash, delivery id,
whether the record verified). It names the tool, effect, role, subject and deadline, warns when
the card's text is not what it looks like, and links to the card; the arguments themselves are
shown only on the card, where the reviewer decides.

Two kinds of text, kept apart:
- trusted text (fixed wording, counts, times and links from the gate) may be `mrkdwn`, Slack's
  formatting. A name from the record (tool, effect, reversibility, role) joins it only as a code
  span, and only when it is one plain token (letters, digits, `_ . -`): a code span shows its
  content as typed, and such a token cannot close it. The stored record can be edited outside
  effectgate, so nothing else from it is ever formatted;
- every value from the record (those names in full, subject values, session and user ids,
  reasons, provider references, the warnings that quote them) is a `plain_text` object with
  `"emoji": false`, so Slack shows it as typed: no bold, italics, strike, code, link, mention or
  emoji. Characters that render as nothing, reorder the text or break the line (bidirectional
  controls, zero-width characters, control characters, newlines, tabs, line separators) are
  written out as `<U+202E>`, so a value cannot forge lines or fields of its own; the value is
  escaped for &, < and >, clipped to a bounded length (the card shows all of it), and when it
  still holds non-ASCII text (a right-to-left script, say) it is wrapped in a Unicode isolate,
  which nothing inside it can close.
A record that does not verify (its card carries TAMPERED_WARNING, or an unknown outcome's notice
says `intact=False`) is never presented as effectgate's: its headline is a fixed "does not
verify; do not act on it", with no name from the record in it, and the payload says
`"intact": false`.
The top-level `text` (what a phone notification shows) holds trusted text only.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from .._display import remaining, when
from .._notice import Notification
from .._textcheck import reveal
from ..outcomes import TAMPERED_WARNING, Card

VALUE_CHARS = 200  # of one call-written value in the message; the card shows all of it
SUBJECT_ENTRIES = 8
# Of the subject's field: Slack refuses a whole message with a field over 2,000 characters (an
# edited record's subject may be that long), and a refused page is lost.
SUBJECT_CHARS = 1900
WARNINGS_SHOWN = 8
# FIRST STRONG ISOLATE ... POP DIRECTIONAL ISOLATE: keeps right-to-left letters in a value from
# reordering the text around it. `reveal` has written out every bidirectional control inside.
_ISOLATE, _POP = "\u2068", "\u2069"
# What `reveal` leaves alone but a one-line value must not hold: newline, tab, line and
# paragraph separators (every other control character it writes out itself).
_LINE_BREAKS = {ord(c): f"<U+{ord(c):04X}>" for c in "\n\t\u2028\u2029"}
# A name from the record that may sit in a mrkdwn code span: it cannot hold a backtick, a space,
# an entity or anything Slack would turn into formatting, a link, a mention or an emoji.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_UNVERIFIED = (
    ":no_entry: *This approval record does not verify; do not act on it.* It was changed outside "
    "effectgate: what follows is what the edited record says, not effectgate's word."
)


def escape(text: object) -> str:
    """Slack's three control characters; after this, text is shown as text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shown(value: object, limit: int = VALUE_CHARS) -> str:
    """A value from the record as it goes into a plain_text object: as JSON unless a string,
    hidden and line-breaking characters written out, escaped, clipped to `limit` characters
    (never inside an entity) and, unless then plain ASCII, isolated."""
    raw = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    # Writing out and escaping only lengthen the text: `limit + 1` characters decide the clip.
    text = escape(reveal(raw[: limit + 1]).translate(_LINE_BREAKS))
    clipped = len(text) > limit
    if clipped:
        text = text[:limit]
        amp = text.rfind("&")
        if amp != -1 and ";" not in text[amp:]:
            text = text[:amp]
    if not text.isascii():
        text = _ISOLATE + text + _POP
    return text + "…" if clipped else text


def plain(text: str) -> dict[str, Any]:
    """A text object Slack shows as typed."""
    return {"type": "plain_text", "text": text, "emoji": False}


def trusted(text: str) -> dict[str, Any]:
    """A mrkdwn text object, for fixed wording and the gate's own figures only (see `_name`);
    `verbatim` keeps Slack from turning anything in it into a link or mention."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def intact(n: Notification) -> bool | None:
    """Whether the approval record behind `n` verifies: False when its card carries the
    tampered warning; without a card (an unknown outcome), what the gate found when it verified
    the row (`Notification.intact`), None when there is no approval (a write)."""
    if n.card is None:
        return n.intact
    return TAMPERED_WARNING not in n.card.warnings


def delivery_id(n: Notification) -> str:
    """Stable for one notice (kind, approval version, operation key and, for an unknown outcome,
    its `nonce`): retries and duplicate scans carry the same id, so a receiver can drop what it
    has already shown; a second unknown outcome of one key is a new page, with a new id."""
    fields: list[object] = [n.kind, n.approval_id, n.version, n.key]
    if n.nonce is not None:
        fields.append(n.nonce)
    basis = json.dumps(fields, separators=(",", ":"), default=str)  # an edited version: its text
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


def _name(value: object, otherwise: str) -> str:
    """A name from the record for mrkdwn: a code span if it is one plain token, else `otherwise`
    (fixed wording; the name itself is in the plain-text fields)."""
    if isinstance(value, str) and _TOKEN.fullmatch(value):
        return f"`{value}`"
    return otherwise


def _subject(n: Notification) -> str:
    subject = n.card.subject if n.card is not None else None
    if not subject:
        return "-"
    if not isinstance(subject, dict):  # an edited record's subject: any JSON, shown as its JSON
        return shown(subject)
    entries = sorted(subject.items(), key=lambda kv: str(kv[0]))
    parts: list[str] = []
    for k, v in entries[:SUBJECT_ENTRIES]:  # within Block Kit's 2,000 characters for one field
        part = f"{shown(k)}={shown(v)}"
        if sum(len(x) + 2 for x in parts) + len(part) > SUBJECT_CHARS:
            break
        parts.append(part)
    if len(entries) > len(parts):
        parts.append(f"… and {len(entries) - len(parts)} more")
    return ", ".join(parts)


def _headline(n: Notification, now: float) -> str:
    """Trusted text only: fixed wording, the countdown and the record's names as `_name` allows;
    for a record that does not verify, the fixed warning and nothing from the record."""
    if intact(n) is False:
        return _UNVERIFIED
    role = _name(n.approver_role, "the role named below") if n.approver_role else "the tool's owner"
    tool = _name(n.tool, "a tool (named below)")
    card = n.card
    if n.kind == "needs_reconciliation" or card is None:
        return (
            f":warning: *Needs reconciliation*: {tool} ran but its outcome at the provider is "
            f"unknown; *{role}* must settle it before anyone retries."
        )
    effect = _name(card.effect, "")
    reversibility = _name(card.reversibility, "")
    what = f"{tool} ({effect}, {reversibility})" if effect and reversibility else tool
    if n.kind == "expiring":
        return f":hourglass: *Approval expiring {escape(_countdown(card, now))}*: {what} waits for *{role}*."
    return f":raising_hand: *Approval needed*: {what} waits for *{role}*."


def _countdown(card: Card, now: float) -> str:
    try:
        return remaining(card.expires_at - now)
    except (TypeError, ValueError, OverflowError):  # an edited record's deadline
        return "at an unreadable time"


def _expires(card: Card, now: float) -> str:
    try:
        return f"{when(card.expires_at)} ({remaining(card.expires_at - now)})"
    except (TypeError, ValueError, OverflowError, OSError):  # an edited record's deadline
        return shown(card.expires_at)


def _fields(n: Notification, now: float) -> list[tuple[str, str]]:
    """(label, text ready for plain_text): every value from the record goes through `shown`."""
    card = n.card
    role = shown(n.approver_role) if n.approver_role else "-"
    if card is None:
        return [
            ("Tool", shown(n.tool)),
            ("Role", role),
            ("Reason", shown(n.reason) if n.reason else "-"),
            ("Provider ref", shown(n.provider_ref) if n.provider_ref else "-"),
        ]
    fields = [  # at most ten: Slack's limit for one section
        ("Tool", f"{shown(n.tool)} ({shown(card.effect)}, {shown(card.reversibility)})"),
        ("Role", role),
        ("Subject", _subject(n)),
        ("Approvals", f"{shown(card.approvals_given)} of {shown(card.approvals_required)}"),
        ("Version", shown(card.version)),
        ("Args sha256", shown(card.args_hash, 16)),
        ("Expires", _expires(card, now)),
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


def _as_json(value: object) -> object:
    """A payload value as JSON has it: text, a whole number, a finite number, true, false or null
    as they are; anything else an edited record holds (bytes, NaN) as its text."""
    if value is None or isinstance(value, str | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return str(value)


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
    # values as stored: an edited record's (a blob SQLite keeps) as text, never unsendable
    payload: dict[str, object] = {
        "kind": n.kind,
        "delivery": delivery_id(n),
        "intact": intact(n),
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
    payload = {k: _as_json(v) for k, v in payload.items()}
    return {
        "text": text,
        "blocks": blocks,
        "metadata": {"event_type": f"effectgate_{n.kind}", "event_payload": payload},
    }
