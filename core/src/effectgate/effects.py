"""Effect classes, reversibility, and the policy that says which classes need a person.

Other taxonomies map onto ours with `Effect.from_label`:

| their word                                   | our class     |
|----------------------------------------------|---------------|
| read, read_only, readonly, safe, low, query  | READ          |
| write, draft, reversible, medium, update     | WRITE         |
| send, external, notify, bulk                 | SEND          |
| money, high, financial, payment, spend       | MONEY         |
| destructive, critical, delete, irreversible  | DESTRUCTIVE   |

"bulk" maps to SEND; the bulk threshold itself is an escalation rule on the row
(`Escalate.count_above("to", 500, role="marketing_lead")`), because it depends on the arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from .canonical import digest


class Effect(StrEnum):
    """What a tool does to the world, from harmless to irreversible."""

    READ = "read"
    WRITE = "write"
    SEND = "send"
    MONEY = "money"
    DESTRUCTIVE = "destructive"

    @classmethod
    def from_label(cls, label: str) -> Effect:
        """Map a word from another taxonomy onto an effect class (see the module table)."""
        key = label.strip().lower().replace("-", "_").replace(" ", "_")
        try:
            return _LABELS[key]
        except KeyError:
            known = ", ".join(sorted(_LABELS))
            raise ValueError(f"unknown effect label {label!r}; known labels: {known}") from None


_LABELS: dict[str, Effect] = {
    **dict.fromkeys(["read", "read_only", "readonly", "safe", "low", "query"], Effect.READ),
    **dict.fromkeys(["write", "draft", "reversible", "medium", "update"], Effect.WRITE),
    **dict.fromkeys(["send", "external", "notify", "bulk"], Effect.SEND),
    **dict.fromkeys(["money", "high", "financial", "payment", "spend"], Effect.MONEY),
    **dict.fromkeys(["destructive", "critical", "delete", "irreversible"], Effect.DESTRUCTIVE),
}


_VALUES = frozenset(e.value for e in Effect)
_KNOWN = ", ".join(e.value for e in Effect)


class Reversibility(StrEnum):
    """How an effect can be undone; shown to the approver on the card."""

    REVERSIBLE = "reversible"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Which effect classes run on their own, and the limits on the ones that do not.

    The default is the one every deployment starts from: read and write are autonomous, send,
    money and destructive wait for a person, destructive needs two distinct approvers, a grant
    token lives 300 s, a pending approval expires after 24 h (never auto-approved), and a session
    holds at most 20 pending approvals. A stricter deployment narrows it explicitly.

    `role_grants` lets a senior role approve for a junior one: `{"finance_lead": {"finance"}}`.
    `self_approval` lets the user who made a call approve it (off by default: the requesting
    user is never one of its approvers).

    The policy is part of what an approval is bound to (`fingerprint`): a decision under another
    policy is refused, and the audit reports a policy that lets send, money or destructive calls
    run on their own or drops the second approver for destructive ones (`weakened`).
    """

    autonomous: frozenset[Effect] = frozenset({Effect.READ, Effect.WRITE})
    double_confirmation: frozenset[Effect] = frozenset({Effect.DESTRUCTIVE})
    token_ttl: float = 300.0
    pending_ttl: float = 24 * 3600.0
    max_pending_per_session: int = 20
    lease_seconds: float = 60.0
    read_retries: int = 3
    retry_backoff: float = 0.05
    role_grants: Mapping[str, frozenset[str]] = field(default_factory=dict[str, frozenset[str]])
    self_approval: bool = False

    def __post_init__(self) -> None:
        for name in ("autonomous", "double_confirmation"):  # a typo ("Destructive") would loosen it
            given: object = getattr(self, name)
            items = [given] if isinstance(given, str) else list(given)  # type: ignore[call-overload]
            unknown = [e for e in items if not isinstance(e, str) or e not in _VALUES]
            if isinstance(given, str) or unknown:
                raise ValueError(f"Policy.{name} must be a set of effect classes ({_KNOWN}), not {given!r}")
            object.__setattr__(self, name, frozenset(Effect(e) for e in items))
        if Effect.READ not in self.autonomous:
            raise ValueError("a policy cannot gate reads: READ must stay autonomous")
        for name in ("token_ttl", "pending_ttl", "lease_seconds"):  # NaN is never `<= 0`, nor reached
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"Policy.{name} must be a positive, finite number of seconds")
        if not (math.isfinite(self.retry_backoff) and self.retry_backoff >= 0):
            raise ValueError("Policy.retry_backoff must be a finite number of seconds, not negative")
        for name, least in (("max_pending_per_session", 1), ("read_retries", 0)):  # NaN: no limit at all
            count = getattr(self, name)
            whole = type(count) in (int, float) and math.isfinite(count) and count == int(count)
            if not (whole and count >= least):
                raise ValueError(f"Policy.{name} must be a whole number, at least {least} (not {count!r})")
        if not isinstance(self.self_approval, bool):  # a text such as "false" would be taken as true
            raise ValueError(f"Policy.self_approval must be True or False, not {self.self_approval!r}")
        grants: Mapping[str, object] = self.role_grants  # `in` a text tests its substrings ("fin")
        for held, granted in grants.items():
            roles = [held, *([] if isinstance(granted, str) else granted)]  # type: ignore[misc]
            if isinstance(granted, str) or not all(isinstance(role, str) for role in roles):
                raise ValueError(f"Policy.role_grants[{held!r}] must be a set of roles, not {granted!r}")

    def canonical(self) -> dict[str, Any]:
        """What decides routing and approval, as JSON (timeouts and retries are left out)."""
        return {
            "autonomous": sorted(str(e) for e in self.autonomous),
            "double_confirmation": sorted(str(e) for e in self.double_confirmation),
            "role_grants": {k: sorted(v) for k, v in sorted(self.role_grants.items())},
            "self_approval": self.self_approval,
        }

    @classmethod
    def from_canonical(cls, data: Mapping[str, Any]) -> Policy:
        """The policy a `canonical()` form describes (timeouts and limits at their defaults)."""
        return cls(
            autonomous=frozenset(Effect(e) for e in data["autonomous"]),
            double_confirmation=frozenset(Effect(e) for e in data["double_confirmation"]),
            role_grants={k: frozenset(v) for k, v in data["role_grants"].items()},
            self_approval=bool(data["self_approval"]),
        )

    @cached_property
    def fingerprint(self) -> str:
        return digest(self.canonical())

    def weakened(self) -> list[str]:
        """What this policy lets through that the default does not (empty for a sound policy)."""
        return weakened(self.canonical())

    def gates(self, effect: Effect) -> bool:
        """True when calls of this class wait for an approval."""
        return effect not in self.autonomous

    def approvals_needed(self, effect: Effect) -> int:
        """How many distinct approvers a call of this class needs (0 when autonomous)."""
        if not self.gates(effect):
            return 0
        return 2 if effect in self.double_confirmation else 1

    def role_satisfies(self, held: str, required: str) -> bool:
        """True when an approver holding `held` may decide for `required`."""
        return held == required or required in self.role_grants.get(held, frozenset())


_GATED = ("send", "money", "destructive")


def weakened(policy: Mapping[str, Any]) -> list[str]:
    """The weakenings of a policy in its canonical form (as recorded with an approval)."""
    out = [f"{e} runs without approval" for e in _GATED if e in policy.get("autonomous", ())]
    if "destructive" not in policy.get("double_confirmation", ()):
        out.append("destructive needs only one approver")
    return out
