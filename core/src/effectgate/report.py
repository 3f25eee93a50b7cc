"""Model proposal against human decision: the disagreement rate per tool and per approver role,
and the rollout figures (`metrics`): p95 approval latency per role against a target, replays
absorbed, gated proposals per day against the sessions of that day, the reconciliation backlog.

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
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
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
    undecided: int = 0  # pending or expired
    expired: int = 0
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
            rate.expired += row.status == "expired"
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


@dataclass
class Metrics:
    """The rollout figures over a window (see `metrics`)."""

    since: float | None
    until: float | None
    latency_p95_s: dict[str, float | None]  # per approver role: created -> decided, decided calls
    latency_targets: dict[str, float]
    proposals: int  # gated calls proposed (not counting replays)
    replays_absorbed: int  # the same message again, answered from the record: no second approval
    gated_by_day: list[tuple[str, int, int]]  # (UTC day, gated proposals, sessions with any call)
    needs_reconciliation: int  # operations whose outcome is unknown, now

    @property
    def replay_rate(self) -> float | None:
        total = self.proposals + self.replays_absorbed
        return self.replays_absorbed / total if total else None

    def latency_met(self, role: str) -> bool | None:
        p95, target = self.latency_p95_s.get(role), self.latency_targets.get(role)
        return None if p95 is None or target is None else p95 <= target

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["replay_rate"] = self.replay_rate
        data["latency_met"] = {role: self.latency_met(role) for role in self.latency_p95_s}
        data["gated_by_day"] = [
            {"day": d, "proposals": n, "sessions": s, "per_1000_sessions": 1000.0 * n / s if s else None}
            for d, n, s in self.gated_by_day
        ]
        return data


def metrics(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    targets: Mapping[str, float] | None = None,
) -> Metrics:
    """p95 approval latency per role (against `targets`, seconds per role), replays absorbed,
    gated proposals per day against the sessions active that day, and the reconciliation backlog."""
    latencies: dict[str, list[float]] = defaultdict(list)
    proposals_by_day: dict[str, int] = defaultdict(int)
    proposals = 0
    for row in _in_window(store.approvals(), since, until):
        if row.status == "rejected":
            continue
        proposals += 1
        proposals_by_day[_day(row.created_at)] += 1
        if row.decided_at is not None and row.status not in UNDECIDED:
            latencies[row.approver_role].append(row.decided_at - row.created_at)
        else:
            latencies.setdefault(row.approver_role, [])
    sessions_by_day: dict[str, set[str]] = defaultdict(set)
    replays = 0
    for event in _in_window_at(store.events(), since, until):
        if event.session_id:
            sessions_by_day[_day(event.at)].add(event.session_id)
        replays += event.kind == "replay" and event.approval_id is not None
    days = sorted(set(proposals_by_day) | set(sessions_by_day))
    return Metrics(
        since=since,
        until=until,
        latency_p95_s={role: p95(values) for role, values in sorted(latencies.items())},
        latency_targets=dict(targets or {}),
        proposals=proposals,
        replays_absorbed=replays,
        gated_by_day=[(d, proposals_by_day.get(d, 0), len(sessions_by_day.get(d, ()))) for d in days],
        needs_reconciliation=len(store.idempotency_records(status="needs_reconciliation")),
    )


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).date().isoformat()


def _in_window_at(rows: Iterable[Any], since: float | None, until: float | None) -> Iterable[Any]:
    for row in rows:
        if (since is None or row.at >= since) and (until is None or row.at < until):
            yield row


def _in_window(rows: Iterable[Any], since: float | None, until: float | None) -> Iterable[Any]:
    for row in rows:
        if (since is None or row.created_at >= since) and (until is None or row.created_at < until):
            yield row


__all__ = ["Metrics", "Rate", "disagreement", "edited_approvals", "metrics", "modes", "p95"]
