"""The audit scan, its metrics, and the JSONL export, all from the stored rows.

A clean audit means: nothing ran that the table, at the time, did not allow. The scan re-derives
everything it checks from the rows themselves, never trusting a stored copy of a conclusion:

- every hash is recomputed from the stored arguments (approvals and executions);
- every approval and decision seal is verified with the keyring (when one is given);
- the table row and the policy each approval was made under are read from `eg_rules` (their
  canonical form, checked against its fingerprint), and the required role and number of distinct
  approvers are derived from them and compared with what was recorded and what was decided;
- every gated execution needs its approval, the same args hash, the executed version, enough
  distinct, validly sealed approvers holding the required role, and ran once;
- a policy that lets send, money or destructive calls run alone, or drops the second approver of
  destructive calls, is reported wherever an approval or execution was made under it.

Each kind of finding has its own code (`FindingKind`).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._rules import possible_roles
from ._seal import approval_sealed, decision_intact, stored_args_hash
from .canonical import digest
from .effects import Effect, Policy, weakened
from .stores.protocol import Store
from .stores.records import ApprovalRow, DecisionRow, ExecutionRow, RuleRow
from .table import EffectTable
from .tokens import Keyring

FindingKind = Literal[
    "no_approval",
    "not_approved",
    "hash_mismatch",
    "args_tampered",
    "seal_broken",
    "decision_forged",
    "wrong_role",
    "self_approved",
    "bar_lowered",
    "rule_missing",
    "policy_weakened",
    "executed_twice",
    "reclassified",
]


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    tool: str
    detail: str
    approval_id: str | None = None
    execution_id: int | None = None


@dataclass(frozen=True)
class Metrics:
    approval_latency_p95_s: float | None
    approved: int
    denied: int
    expired: int
    rejected: int
    replays_absorbed: int
    gated_proposals: int
    sessions: int
    gated_proposals_per_1000_sessions: float
    executions: int


@dataclass(frozen=True)
class AuditReport:
    findings: list[Finding] = field(default_factory=list[Finding])
    metrics: Metrics | None = None
    seals_checked: bool = True

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "seals_checked": self.seals_checked,
            "findings": [asdict(f) for f in self.findings],
            "metrics": asdict(self.metrics) if self.metrics else None,
        }


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


_GATED_CLASSES = frozenset({Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE})


class _Rules:
    """The recorded rules by fingerprint, each verified against its fingerprint once."""

    def __init__(self, rows: dict[str, RuleRow]) -> None:
        self._rows = rows
        self._parsed: dict[str, dict[str, Any] | None] = {}

    def get(self, fingerprint: str) -> dict[str, Any] | None:
        if fingerprint not in self._parsed:
            row = self._rows.get(fingerprint)
            body: dict[str, Any] | None = None
            if row is not None:
                try:
                    parsed = json.loads(row.body_json)
                    body = parsed if digest(parsed) == fingerprint else None
                except (ValueError, TypeError, RecursionError):
                    body = None
            self._parsed[fingerprint] = body
        return self._parsed[fingerprint]


class _Scan:
    def __init__(self, store: Store, table: EffectTable | None, keyring: Keyring | None) -> None:
        self.table = table
        self.keyring = keyring
        self.rules = _Rules(store.rules())
        self.findings: list[Finding] = []
        self.approvals: dict[str, ApprovalRow] = {a.id: a for a in store.approvals()}
        self.decisions: dict[tuple[str, int], list[DecisionRow]] = defaultdict(list)
        self.by_approval: dict[str, list[DecisionRow]] = defaultdict(list)
        for d in store.all_decisions():
            self.decisions[(d.approval_id, d.version)].append(d)
            self.by_approval[d.approval_id].append(d)
        self.executions: list[ExecutionRow] = store.executions()
        self.bad_policies: set[str] = set()

    def add(
        self, kind: FindingKind, tool: str, detail: str, approval: str | None = None, ex: int | None = None
    ) -> None:
        self.findings.append(Finding(kind, tool, detail, approval, ex))

    def policy(self, fingerprint: str, tool: str, approval_id: str | None = None) -> Policy | None:
        body = self.rules.get(fingerprint)
        if body is None:
            self.add("rule_missing", tool, f"policy {fingerprint[:12] or '-'} is not recorded", approval_id)
            return None
        if fingerprint not in self.bad_policies:
            self.bad_policies.add(fingerprint)
            for weakness in weakened(body):
                self.add("policy_weakened", tool, f"policy {fingerprint[:12]}: {weakness}", approval_id)
        return Policy.from_canonical(body)

    # -- approvals

    def approval(self, a: ApprovalRow) -> tuple[str, int] | None:
        """Check one approval; return its (required role, required approvers) when derivable."""
        if stored_args_hash(a.tool, a.args_json) != a.args_hash:
            self.add("args_tampered", a.tool, "the stored arguments do not hash to the approval's hash", a.id)
        if self.keyring is not None and not approval_sealed(self.keyring, a):
            self.add("seal_broken", a.tool, "the approval's seal does not verify", a.id)
        row = self.rules.get(a.row_fingerprint)
        policy = self.policy(a.policy_fingerprint, a.tool, a.id)
        if row is None:
            self.add("rule_missing", a.tool, f"table row {a.row_fingerprint[:12]} is not recorded", a.id)
        if row is None or policy is None:
            return None
        try:
            args = json.loads(a.args_json)
        except ValueError:
            args = {}
        effect = Effect(row["effect"])
        required = policy.approvals_needed(effect)
        roles = possible_roles(row, args)
        if a.effect != effect or a.approvals_required != required or a.approver_role not in roles:
            self.add(
                "bar_lowered",
                a.tool,
                f"recorded {a.effect}, role {a.approver_role}, {a.approvals_required} approver(s); the rule "
                f"at the time says {effect}, role {' or '.join(sorted(roles))}, {required} approver(s)",
                a.id,
            )
        for d in self.by_approval.get(a.id, ()):
            self.decision(a, d, policy)
        # The bar an execution is held to: never lower than what the rule at the time says.
        role = a.approver_role if a.approver_role in roles else sorted(roles)[0]
        return role, max(required, a.approvals_required)

    def decision(self, a: ApprovalRow, d: DecisionRow, policy: Policy) -> None:
        if self.keyring is not None and not decision_intact(self.keyring, d):
            self.add(
                "decision_forged", a.tool, f"decision {d.id} by {d.approver_id}: seal does not verify", a.id
            )
            return
        if d.decision != "approve":
            return
        if not policy.role_satisfies(d.role, a.approver_role):
            self.add(
                "wrong_role", a.tool, f"{d.approver_id} approved as {d.role}; {a.approver_role} needed", a.id
            )
        if d.approver_id == a.user_id and not policy.self_approval:
            self.add("self_approved", a.tool, f"{d.approver_id} approved their own call", a.id)

    def approvers(self, a: ApprovalRow, version: int, role: str, policy: Policy | None) -> int:
        """The most distinct, valid approvers holding `role` in any one grant round."""
        rounds: dict[int, set[str]] = defaultdict(set)
        for d in self.decisions.get((a.id, version), []):
            if d.decision != "approve" or (
                d.approver_id == a.user_id and not (policy and policy.self_approval)
            ):
                continue
            if self.keyring is not None and not decision_intact(self.keyring, d):
                continue
            if policy is not None and not policy.role_satisfies(d.role, role):
                continue
            rounds[d.grant_round].add(d.approver_id)
        return max((len(v) for v in rounds.values()), default=0)

    # -- executions

    def execution(
        self, ex: ExecutionRow, bars: dict[str, tuple[str, int] | None], runs: Counter[str]
    ) -> None:
        if stored_args_hash(ex.tool, ex.args_json) != ex.args_hash:
            self.add(
                "args_tampered",
                ex.tool,
                "the executed arguments do not hash to the recorded hash",
                ex.approval_id,
                ex.id,
            )
        policy = (
            self.policy(ex.policy_fingerprint, ex.tool, ex.approval_id) if ex.policy_fingerprint else None
        )
        spec = self.table.get(ex.tool) if self.table is not None else None
        effect = Effect(ex.effect)
        gated_now = policy.gates(effect) if policy is not None else effect in _GATED_CLASSES
        if not gated_now and ex.approval_id is None:
            if spec is not None and spec.effect in _GATED_CLASSES and spec.effect != effect:
                self.add(
                    "reclassified",
                    ex.tool,
                    f"ran ungated as {ex.effect}; the table now says {spec.effect}",
                    ex=ex.id,
                )
            return
        a = self.approvals.get(ex.approval_id) if ex.approval_id else None
        if a is None:
            self.add("no_approval", ex.tool, "gated execution with no approval record", ex.approval_id, ex.id)
            return
        bar = bars.get(a.id)
        role, required = bar if bar is not None else (a.approver_role, a.approvals_required)
        given = self.approvers(a, ex.version if ex.version is not None else -1, role, self._policy_of(a))
        if ex.version != a.version or given < required:
            self.add(
                "not_approved",
                ex.tool,
                f"{given} of {required} valid approvals for the executed version",
                a.id,
                ex.id,
            )
        if ex.args_hash != a.args_hash:
            self.add(
                "hash_mismatch",
                ex.tool,
                f"executed {ex.args_hash[:12]}, approved {a.args_hash[:12]}",
                a.id,
                ex.id,
            )
        if ex.status == "succeeded":
            runs[a.id] += 1
            if runs[a.id] == 2:
                self.add("executed_twice", ex.tool, "executed more than once", a.id, ex.id)
        if ex.row_fingerprint != a.row_fingerprint:
            self.add(
                "reclassified", ex.tool, "the tool's row changed between approval and execution", a.id, ex.id
            )
        if self.table is not None and (spec is None or spec.fingerprint != a.row_fingerprint):
            now = (
                "is no longer in the table"
                if spec is None
                else f"is now {spec.effect}, role {spec.approver_role}"
            )
            self.add("reclassified", ex.tool, f"approved as {a.effect}; the tool {now}", a.id, ex.id)

    def _policy_of(self, a: ApprovalRow) -> Policy | None:
        body = self.rules.get(a.policy_fingerprint)
        return Policy.from_canonical(body) if body is not None else None


def audit(
    store: Store,
    table: EffectTable | None = None,
    policy: Policy | None = None,
    *,
    keyring: Keyring | None = None,
) -> AuditReport:
    """Scan the store (see the module docstring). With `table`, also compare every executed
    approval against the table as it is now (a reclassification shows). With `keyring` (the
    gate's), every seal is verified; without one, `seals_checked` is False. `policy` is accepted
    for compatibility: the scan uses the policy recorded with each approval and execution."""
    del policy
    scan = _Scan(store, table, keyring)
    bars: dict[str, tuple[str, int] | None] = {}
    for a in scan.approvals.values():
        bars[a.id] = scan.approval(a)
    runs: Counter[str] = Counter()
    for ex in scan.executions:
        if ex.status in ("succeeded", "needs_reconciliation"):
            scan.execution(ex, bars, runs)
    succeeded = sum(1 for e in scan.executions if e.status == "succeeded")
    return AuditReport(
        scan.findings, _metrics(store, scan.approvals, succeeded), seals_checked=keyring is not None
    )


def _metrics(store: Store, approvals: dict[str, ApprovalRow], executions: int) -> Metrics:
    statuses = Counter(a.status for a in approvals.values())
    latencies = [
        a.decided_at - a.created_at
        for a in approvals.values()
        if a.decided_at is not None and a.status in ("approved", "executed")
    ]
    events = store.events()
    sessions = len({e.session_id for e in events if e.session_id})
    proposals = sum(1 for a in approvals.values() if a.status != "rejected")
    return Metrics(
        approval_latency_p95_s=_p95(latencies),
        approved=statuses["approved"] + statuses["executed"],
        denied=statuses["denied"],
        expired=statuses["expired"],
        rejected=statuses["rejected"],
        replays_absorbed=sum(1 for e in events if e.kind == "replay"),
        gated_proposals=proposals,
        sessions=sessions,
        gated_proposals_per_1000_sessions=(1000.0 * proposals / sessions) if sessions else 0.0,
        executions=executions,
    )


def export_jsonl(store: Store) -> Iterator[str]:
    """Every approval, decision, execution and event, one JSON object a line, tagged by table."""
    for table, rows in (
        ("approvals", store.approvals()),
        ("decisions", store.all_decisions()),
        ("executions", store.executions()),
        ("events", store.events()),
    ):
        for row in rows:
            yield json.dumps({"table": table, **row.model_dump()}, sort_keys=True, default=str)
