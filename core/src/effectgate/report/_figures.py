"""What the report's figures are: the results `effectgate report` returns (`Rate` per tool or
role and mode, `ToolRates`, `Metrics`, `Figures`; `to_dict()` is the `--json` output), and the
definitions they count by (the statuses counted approved or undecided, `per_1000`, the
nearest-rank `p95`). `_counting` computes them from the store; see the package docstring for what
each figure means."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._verify import NOT_CHECKED

Mode = Literal["shadow", "live", "unverified"]
APPROVED = frozenset({"approved", "executing", "executed", "failed", "needs_reconciliation"})
UNDECIDED = frozenset({"pending", "expired"})


@dataclass
class Rate:
    """One group's counts (see the package docstring)."""

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

    def add(self, tool: str, status: str, edited: bool, n: int) -> None:
        """Count `n` calls of `tool` in `status` (`edited`: a reviewer edited their arguments)."""
        self.tools.add(tool)
        if status == "rejected":
            self.rejected += n
        elif status in UNDECIDED:
            self.undecided += n
            self.expired += n if status == "expired" else 0
        else:
            self.decided += n
            self.edited += n if edited else 0
            self.denied += n if status == "denied" else 0
            self.approved += n if status in APPROVED else 0
            self.disagreed += n if status == "denied" or edited else 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tools"] = sorted(self.tools)
        data["disagreement"] = self.disagreement
        return data


@dataclass
class ToolRates:
    """One tool's decisions over both modes. The rates are over `settled` (decided or expired: the
    calls a reviewer was shown that reached an end); an edited call is also approved or denied,
    so `edited` overlaps the others. Pending calls are counted beside, never in a rate."""

    tool: str
    decided: int = 0
    approved: int = 0
    denied: int = 0
    edited: int = 0
    expired: int = 0
    pending: int = 0

    @property
    def settled(self) -> int:
        return self.decided + self.expired

    def rate(self, what: Literal["approved", "denied", "edited", "expired"]) -> float | None:
        return getattr(self, what) / self.settled if self.settled else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["settled"] = self.settled
        data["rates"] = {w: self.rate(w) for w in ("approved", "denied", "edited", "expired")}
        return data


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
    # (UTC day, model id, gated proposals of that model, sessions of the day with a call of that model)
    gated_by_model: list[tuple[str, str, int, int]] = field(default_factory=list[tuple[str, str, int, int]])
    replays_by_day: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])  # (UTC day, replays)
    # the backlog by the UTC day each record began waiting (its last update): (day, records)
    backlog_by_day: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])
    backlog_erased: int = 0  # awaiting reconciliation, erased with their call: not in the backlog
    decision_rates: list[ToolRates] = field(default_factory=list[ToolRates])  # per tool, by name

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
            {"day": d, "proposals": n, "sessions": s, "per_1000_sessions": per_1000(n, s)}
            for d, n, s in self.gated_by_day
        ]
        data["gated_by_model"] = [
            {"day": d, "model_id": m, "proposals": n, "sessions": s, "per_1000_sessions": per_1000(n, s)}
            for d, m, n, s in self.gated_by_model
        ]
        data["replays_by_day"] = [{"day": d, "replays": n} for d, n in self.replays_by_day]
        data["backlog_by_day"] = [{"day": d, "records": n} for d, n in self.backlog_by_day]
        data["decision_rates"] = [r.to_dict() for r in self.decision_rates]
        return data


@dataclass
class Figures:
    """Everything `effectgate report` shows: the disagreement rates by tool and by role, and the
    rollout figures. `to_dict()` is the `--json` output. `unverified`: the approvals in the window
    whose seal does not verify under the keyring given (counted under mode "unverified"), or None
    when no keyring was given and no seal was checked; `note` says what either means."""

    since: float | None
    until: float | None
    by_tool: list[Rate]
    by_role: list[Rate]
    metrics: Metrics
    unverified: int | None = None

    @property
    def seals_checked(self) -> bool:
        return self.unverified is not None

    @property
    def note(self) -> str | None:
        """What the reader must know before trusting the mode split, or None."""
        if self.unverified is None:
            return NOT_CHECKED
        if self.unverified:
            return (
                f"{self.unverified} approval(s) in this window carry a seal that does not verify under "
                "this keyring, or a status their sealed record contradicts (edited in the database, or "
                'sealed with another keyring): counted under mode "unverified", never shadow or live; '
                "`effectgate audit` names those whose seal does not verify"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "seals_checked": self.seals_checked,
            "unverified": self.unverified,
            "note": self.note,
            "by_tool": [r.to_dict() for r in self.by_tool],
            "by_role": [r.to_dict() for r in self.by_role],
            "metrics": self.metrics.to_dict(),
        }


def per_1000(proposals: int, sessions: int) -> float | None:
    """Gated proposals per 1,000 sessions (None without sessions)."""
    return 1000.0 * proposals / sessions if sessions else None


def p95_rank(count: int) -> int:
    """The index, in ascending order, of the p95 of `count` values (nearest rank, never below 0)."""
    return max(0, math.ceil(0.95 * count) - 1)


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    return sorted(values)[p95_rank(len(values))]
