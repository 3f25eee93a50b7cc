"""The audit scan, its metrics, and the JSONL export, all from the stored rows.

A clean audit means: nothing ran that the table, at the time, did not allow. The scan re-derives
everything it checks from the rows themselves, never trusting a stored copy of a conclusion:

- every hash is recomputed from the stored arguments (approvals and executions); arguments
  erased by `effectgate.redact` are accepted only with their sealed redaction entry, which names
  the hash they had and the facts kept (a marker without one is `redaction_forged`);
- every approval and decision seal is verified with the keyring (when one is given);
- the table row and the policy each approval was made under are read from `eg_rules` (their
  canonical form, checked against its fingerprint), and the required role and number of distinct
  approvers are derived from them and compared with what was recorded and what was decided;
- every gated execution needs its approval, the same args hash, the executed version, enough
  distinct, validly sealed approvers holding the required role, and ran once;
- a policy that lets send, money or destructive calls run alone, or drops the second approver of
  destructive calls, is reported wherever an approval or execution was made under it.

Each kind of finding has its own code (`FindingKind`). The scan streams rows as tuples (never
ORM objects) and leaves counting to SQL: the event log, the largest table, is only aggregated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _audit_rows as col
from ._audit_rows import Bar, Merge
from ._audit_scan import Finding, FindingKind, Scan
from .chain import verify_chain
from .effects import Policy
from .report import p95
from .stores.protocol import Store
from .table import EffectTable
from .tokens import Keyring

__all__ = ["AuditReport", "Finding", "FindingKind", "Metrics", "audit", "export_jsonl"]


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


def audit(
    store: Store,
    table: EffectTable | None = None,
    policy: Policy | None = None,
    *,
    keyring: Keyring | None = None,
    chain: bool = False,
) -> AuditReport:
    """Scan the store (see the module docstring). With `table`, also compare every executed
    approval against the table as it is now (a reclassification shows). With `keyring` (the
    gate's), every seal is verified; without one, `seals_checked` is False. `policy` is accepted
    for compatibility: the scan uses the policy recorded with each approval and execution. With
    `chain` (and `keyring`), the ledger's own hash chain is recomputed too (`effectgate.chain`):
    a checkpointed row deleted, inserted or edited is a `chain_broken` finding."""
    del policy
    scan = Scan(store, table, keyring)
    succeeded = 0

    def executed(ex: tuple[Any, ...], runs: dict[str, int], bar: Bar | None = None) -> None:
        nonlocal succeeded
        status = ex[col.E_STATUS]
        if status == "succeeded":
            succeeded += 1
        if status in ("succeeded", "needs_reconciliation"):
            scan.execution(ex, runs, bar)

    with store.reading() as conn:
        # Three streams ordered by approval id, merged: each approval is checked with its own
        # decisions and executions, and nothing is kept once it is done (memory stays flat).
        decisions = Merge(store.audit_rows(conn, "decisions"), col.D_APPROVAL)
        executions = Merge(store.audit_rows(conn, "gated_executions"), col.E_APPROVAL)
        for a in store.audit_rows(conn, "approvals"):
            approval_id = a[col.A_ID]
            for orphan in executions.before(approval_id):
                executed(orphan, {})
            for _ in decisions.before(approval_id):  # a decision for no approval allows nothing
                pass
            bar = scan.approval(a, list(decisions.take(approval_id)))
            runs: dict[str, int] = {}
            for ex in executions.take(approval_id):
                executed(ex, runs, bar)
        for orphan in executions.rest():
            executed(orphan, {})
        for ex in store.audit_rows(conn, "other_executions"):
            executed(ex, {})
        counts = store.audit_counts(conn)
    statuses = scan.statuses
    proposals = sum(statuses.values()) - statuses["rejected"]
    sessions = counts["sessions"]
    metrics = Metrics(
        approval_latency_p95_s=p95(scan.latencies),
        approved=statuses["approved"] + statuses["executed"],
        denied=statuses["denied"],
        expired=statuses["expired"],
        rejected=statuses["rejected"],
        replays_absorbed=counts["replays"],
        gated_proposals=proposals,
        sessions=sessions,
        gated_proposals_per_1000_sessions=(1000.0 * proposals / sessions) if sessions else 0.0,
        executions=succeeded,
    )
    if chain and keyring is not None:
        for b in verify_chain(store, keyring, erased=scan.redacted):
            scan.add("chain_broken", b.table, f"ids {b.first_id}..{b.last_id}: {b.problem}")
    return AuditReport(scan.findings, metrics, seals_checked=keyring is not None)


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
