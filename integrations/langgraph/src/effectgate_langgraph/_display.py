"""What the interrupt payload shows a reviewer of one waiting call, and how that is checked.

A payload's `card` and its HITL action request (`args`, `description`) are what a person decides
on; the payload lives in the checkpoint, which anyone holding it can rewrite. So the payload's
signature (`_decisions.signed_fields`) covers a digest of each card (`shown`), and a payload
whose action request is not its card's tool, arguments and description (`described`) is not the
gate's (`_decisions.is_signed_payload`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from effectgate import Card
from effectgate.canonical import sha256_hex

#: What a grant changes on a card: the signature leaves it out, so an approve echoing the
#: signature of the payload it answers still matches the step once the grant is given.
VOLATILE = ("status", "approvals_given")


def as_text(text: str) -> str:
    """`text` as a Markdown code block: HITL inboxes render an action request's `description` as
    Markdown, and the card holds model text (the arguments), which must reach the reviewer as
    text, never as an image fetched on sight, a link or emphasis. The fence is longer than any
    run of backticks in `text` (the card writes line breaks out, so no line of it can close it)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def shown(request: Mapping[str, Any]) -> str:
    """A digest of what the payload shows of one call: its card (but `VOLATILE`) and `mismatch`."""
    card = request.get("card")
    kept = {k: v for k, v in card.items() if k not in VOLATILE} if isinstance(card, Mapping) else card
    return sha256_hex(json.dumps([kept, request.get("mismatch")], sort_keys=True, default=str).encode())


def described(request: Mapping[str, Any], action: object) -> bool:
    """Whether a HITL action request shows exactly its request's card: tool, arguments, text."""
    try:
        card = Card(**request["card"])
        expected = {"name": card.tool, "args": card.args, "description": as_text(card.render())}
        return isinstance(action, Mapping) and dict(action) == expected
    except (TypeError, KeyError, ValueError, RecursionError):  # a card the node never built
        return False


__all__ = ["VOLATILE", "as_text", "described", "shown"]
