"""Model proposal against human decision: the disagreement rate per tool and per approver role.

    rates = disagreement(store, by="tool", since=..., until=...)

Over the gated calls proposed in a window (`created_at` in [since, until)), for each tool (or
approver role) and mode (shadow or live):

- `decided`: approved (including those that then ran, failed or await reconciliation) or denied;
- `denied`, and `edited`: a reviewer edited the arguments (an amendment recorded with `edited_by`);
- `disagreement` = (denied or edited) / decided: how often people did not take the model's call
  as it was. A team reads it per tool to see from data when a class may leave shadow mode.
- `undecided` (pending or expired) and `rejected` (out of scope, never shown to a reviewer) are
  counted beside, never in the rate.

The mode of a call is re-derived, not read from a mutable column: an approval's sealed row
fingerprint names the recorded table row, whose body must hash to that fingerprint; a row whose
body says `shadow` was proposed in shadow mode. A call whose recorded row cannot be verified is
counted under mode "unverified".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .canonical import digest
from .stores.protocol import Store

Mode = Literal["shadow", "live", "unverified"]
APPROVED = frozenset({"approved", "executing", "executed", "failed", "needs_reconciliation"})
UNDECIDED = frozenset({"pending", "expired"})


@dataclass
class Rate:
    """One group's counts (see the module docstring)."""

    key: str  # the tool, or the approver role
    mode: Mode
    decided: int = 0
    approved: int = 0
    denied: int = 0
    edited: int = 0
    disagreed: int = 0
    undecided: int = 0
    rejected: int = 0
    tools: set[str] = field(default_factory=set[str])

    @property
    def disagreement(self) -> float | None:
        return self.disagreed / self.decided if self.decided else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tools"] = sorted(self.tools)
        data["disagreement"] = self.disagreement
        return data


def modes(store: Store) -> dict[str, Mode]:
    """Each recorded row fingerprint's mode, from bodies that hash to their fingerprint."""
    out: dict[str, Mode] = {}
    for fingerprint, rule in store.rules().items():
        try:
            body = json.loads(rule.body_json)
        except ValueError:
            continue
        if isinstance(body, dict) and digest(body) == fingerprint:
            out[fingerprint] = "shadow" if body.get("shadow") is True else "live"
    return out


def edited_approvals(store: Store) -> set[str]:
    """Approvals a reviewer edited (an amendment recorded with `edited_by`)."""
    edited: set[str] = set()
    for event in store.events(kind="amended"):
        if event.approval_id and json.loads(event.detail_json or "{}").get("edited_by"):
            edited.add(event.approval_id)
    return edited


def disagreement(
    store: Store,
    *,
    by: Literal["tool", "role"] = "tool",
    since: float | None = None,
    until: float | None = None,
) -> list[Rate]:
    """The rates per tool (or approver role) and mode, sorted by key then mode."""
    mode_of = modes(store)
    edited = edited_approvals(store)
    groups: dict[tuple[str, Mode], Rate] = {}
    for row in _in_window(store.approvals(), since, until):
        mode = mode_of.get(row.row_fingerprint, "unverified")
        key = row.tool if by == "tool" else row.approver_role
        rate = groups.setdefault((key, mode), Rate(key, mode))
        rate.tools.add(row.tool)
        if row.status == "rejected":
            rate.rejected += 1
            continue
        if row.status in UNDECIDED:
            rate.undecided += 1
            continue
        rate.decided += 1
        was_edited = row.id in edited
        rate.edited += was_edited
        if row.status == "denied":
            rate.denied += 1
        elif row.status in APPROVED:
            rate.approved += 1
        rate.disagreed += row.status == "denied" or was_edited
    return [groups[k] for k in sorted(groups)]


def _in_window(rows: Iterable[Any], since: float | None, until: float | None) -> Iterable[Any]:
    for row in rows:
        if (since is None or row.created_at >= since) and (until is None or row.created_at < until):
            yield row


__all__ = ["Rate", "disagreement", "edited_approvals", "modes"]
