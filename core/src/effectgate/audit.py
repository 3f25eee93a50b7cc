"""The audit scan, its metrics, and the JSONL export, all from the append-only rows.

The scan proves that every gated execution had its approval. It reports a gated execution
with no approval record, one whose approval was never fully approved, one whose args hash
differs from the approval's, an approval executed more than once, and a tool whose row changed
(reclassified) since the approval, or that ran ungated and is gated now.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .effects import Effect, Policy
from .stores.records import ApprovalRow
from .stores.sql import SQLStore
from .table import EffectTable

FindingKind = Literal["no_approval", "not_approved", "hash_mismatch", "executed_twice", "reclassified"]


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

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "findings": [asdict(f) for f in self.findings],
            "metrics": asdict(self.metrics) if self.metrics else None,
        }


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def audit(store: SQLStore, table: EffectTable | None = None, policy: Policy | None = None) -> AuditReport:
    """Scan the store. With `table`, also compare every approval against the table as it is now."""
    policy = policy or Policy()
    approvals: dict[str, ApprovalRow] = {a.id: a for a in store.approvals()}
    approvals_given: Counter[tuple[str, int]] = Counter(
        (d.approval_id, d.version) for d in store.all_decisions() if d.decision == "approve"
    )
    executions = [e for e in store.executions() if e.status == "succeeded"]
    per_approval = Counter(e.approval_id for e in executions if e.approval_id)
    findings: list[Finding] = []
    flagged_twice: set[str] = set()
    for ex in executions:
        spec = table.get(ex.tool) if table is not None else None
        if not policy.gates(Effect(ex.effect)):
            if spec is not None and policy.gates(spec.effect):
                findings.append(
                    Finding(
                        "reclassified",
                        ex.tool,
                        f"ran ungated as {ex.effect}; the table now says {spec.effect}",
                        execution_id=ex.id,
                    )
                )
            continue
        approval = approvals.get(ex.approval_id) if ex.approval_id else None
        if approval is None:
            findings.append(
                Finding(
                    "no_approval", ex.tool, "gated execution with no approval record", ex.approval_id, ex.id
                )
            )
            continue
        if (
            ex.version != approval.version
            or approvals_given[(approval.id, approval.version)] < approval.approvals_required
        ):
            findings.append(
                Finding(
                    "not_approved",
                    ex.tool,
                    f"{approvals_given[(approval.id, approval.version)]} of "
                    f"{approval.approvals_required} approvals for the executed version",
                    approval.id,
                    ex.id,
                )
            )
        if ex.args_hash != approval.args_hash:
            findings.append(
                Finding(
                    "hash_mismatch",
                    ex.tool,
                    f"executed {ex.args_hash[:12]}, approved {approval.args_hash[:12]}",
                    approval.id,
                    ex.id,
                )
            )
        if per_approval[approval.id] > 1 and approval.id not in flagged_twice:
            flagged_twice.add(approval.id)
            findings.append(
                Finding(
                    "executed_twice",
                    ex.tool,
                    f"executed {per_approval[approval.id]} times",
                    approval.id,
                    ex.id,
                )
            )
        if ex.row_fingerprint != approval.row_fingerprint:
            findings.append(
                Finding(
                    "reclassified",
                    ex.tool,
                    "the tool's row changed between approval and execution",
                    approval.id,
                    ex.id,
                )
            )
        if table is not None and (spec is None or spec.fingerprint != approval.row_fingerprint):
            now = (
                "is no longer in the table"
                if spec is None
                else f"is now {spec.effect}, role {spec.approver_role}"
            )
            findings.append(
                Finding(
                    "reclassified",
                    ex.tool,
                    f"approved as {approval.effect}; the tool {now}",
                    approval.id,
                    ex.id,
                )
            )
    return AuditReport(findings, _metrics(store, approvals, len(executions)))


def _metrics(store: SQLStore, approvals: dict[str, ApprovalRow], executions: int) -> Metrics:
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


def export_jsonl(store: SQLStore) -> Iterator[str]:
    """Every approval, decision, execution and event, one JSON object a line, tagged by table."""
    for table, rows in (
        ("approvals", store.approvals()),
        ("decisions", store.all_decisions()),
        ("executions", store.executions()),
        ("events", store.events()),
    ):
        for row in rows:
            yield json.dumps({"table": table, **row.model_dump()}, sort_keys=True, default=str)
