"""How stored values are shown to a person (web card, webhook, notebook card): one place, so
every surface prints the same arguments, times and countdowns."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gate import EffectGate

FOLD = 2000  # characters of one value shown before folding (the rest is one click away, never cut)


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def fold(value: Any) -> list[dict[str, Any]]:
    """Each top-level argument as (name, text, folded?): long values are folded with their size."""
    items = value.items() if isinstance(value, dict) else [("", value)]
    out = []
    for name, v in items:
        text = pretty(v)
        out.append({"name": name, "text": text, "folded": len(text) > FOLD, "size": len(text)})
    return out


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def remaining(seconds: float) -> str:
    """A countdown: "in 4m 10s", "in 2h 0m 5s", "in 3d 1h 20m", or "expired"."""
    if seconds <= 0:
        return "expired"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    parts += [f"{hours}h"] if hours or days else []
    parts += [f"{minutes}m", f"{s}s"] if not days else [f"{minutes}m"]
    return "in " + " ".join(parts)


def duration(seconds: float) -> str:
    """A length of time: "0s", "45s", "12m 30s", "2h 0m 5s", "3d 1h 20m"."""
    return "0s" if seconds < 1 else remaining(seconds).removeprefix("in ")


def card_view(gate: EffectGate, approval_id: str) -> dict[str, Any]:
    """Everything a reviewer's card shows, read from the store: the card, its arguments folded,
    the subject's history and balance, other decisions in flight on the subject, the decisions
    taken, the result once executed, and the countdown. Raises UnknownApproval."""
    card = gate.card(approval_id)
    view = gate.subject_view(approval_id)
    decisions = [d for d in gate.store.all_decisions() if d.approval_id == approval_id]
    result = gate.result(approval_id) if card.status == "executed" else None
    return {
        "card": card,
        "args": fold(dict(card.args)),
        "view": view,
        "in_flight": [e for e in view.history if e.status in ("pending", "approved")],
        "decisions": decisions,
        "result": result,
        "expires": remaining(card.expires_at - gate.clock.now()),
    }
