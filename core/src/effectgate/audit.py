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
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._rules import possible_roles
from ._seal import sealed_values, stored_args_hash
from .canonical import digest
from .chain import verify_chain
from .effects import Effect, Policy, weakened
from .redact import entries, is_redacted, redaction_problem
from .report import p95
from .stores.protocol import Store
from .stores.records import RuleRow
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
    "redaction_forged",
    "chain_broken",
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


_GATED_CLASSES = frozenset({Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE})

# Column positions of the streamed rows (stores/sql.py AUDIT_QUERIES, in this order).
A_ID, A_VERSION, A_GRANTS, A_SESSION, A_ORIGIN, A_USER, A_AGENT, A_TOOL, A_EFFECT = range(9)
A_SUBJECT, A_HASH, A_ROLE, A_REQUIRED, A_ROW_FP, A_POLICY_FP = range(9, 15)
A_SEAL, A_ARGS, A_STATUS, A_CREATED, A_DECIDED = range(15, 20)
D_APPROVAL, D_VERSION, D_ROUND, D_APPROVER, D_ROLE, D_DECISION, D_SEAL, D_ID = range(8)
E_ID, E_APPROVAL, E_VERSION, E_TOOL, E_EFFECT, E_HASH, E_ARGS, E_STATUS, E_ROW_FP, E_POLICY_FP = range(10)


class _Rules:
    """The recorded rules by fingerprint, each verified against its fingerprint once."""

    def __init__(self, rows: dict[str, RuleRow]) -> None:
        self._rows = rows
        self._parsed: dict[str, dict[str, Any] | None] = {}
        self._policies: dict[str, Policy | None] = {}
        self._by_tool: dict[str, list[tuple[float, str]]] | None = None

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

    def rows_of(self, tool: str) -> list[tuple[float, str]]:
        """(recorded at, fingerprint) of every verified row recorded for `tool`, oldest first."""
        if self._by_tool is None:
            self._by_tool = defaultdict(list)
            for fingerprint, row in sorted(self._rows.items(), key=lambda item: item[1].at):
                body = self.get(fingerprint) if row.kind == "row" else None
                if body is not None and isinstance(body.get("name"), str):
                    self._by_tool[body["name"]].append((row.at, fingerprint))
        return self._by_tool.get(tool, [])

    def policy(self, fingerprint: str) -> Policy | None:
        if fingerprint not in self._policies:
            body = self.get(fingerprint)
            self._policies[fingerprint] = Policy.from_canonical(body) if body is not None else None
        return self._policies[fingerprint]


@dataclass(slots=True)
class _Bar:
    """What an execution of one approval is held to (kept per approval, without its rows)."""

    version: int
    args_hash: str
    row_fingerprint: str
    effect: str
    role: str
    required: int
    approvers: dict[int, int]  # version -> most distinct valid approvers in any one round


class _Scan:
    def __init__(self, store: Store, table: EffectTable | None, keyring: Keyring | None) -> None:
        self.store = store
        self.table = table
        self.keyring = keyring
        self.rules = _Rules(store.rules())
        self.findings: list[Finding] = []
        self.reported_policies: set[str] = set()
        self.bars: dict[str, _Bar] = {}
        self.statuses: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.redacted = entries(store)

    def add(
        self, kind: FindingKind, tool: str, detail: str, approval: str | None = None, ex: int | None = None
    ) -> None:
        self.findings.append(Finding(kind, tool, detail, approval, ex))

    def policy(self, fingerprint: str, tool: str, approval_id: str | None = None) -> Policy | None:
        body = self.rules.get(fingerprint)
        if body is None:
            self.add("rule_missing", tool, f"policy {fingerprint[:12] or '-'} is not recorded", approval_id)
            return None
        if fingerprint not in self.reported_policies:
            self.reported_policies.add(fingerprint)
            for weakness in weakened(body):
                self.add("policy_weakened", tool, f"policy {fingerprint[:12]}: {weakness}", approval_id)
        return self.rules.policy(fingerprint)

    # -- approvals and their decisions

    def approval(self, a: tuple[Any, ...], decisions: list[tuple[Any, ...]]) -> None:
        approval_id, tool = a[A_ID], a[A_TOOL]
        self.statuses[a[A_STATUS]] += 1
        if a[A_DECIDED] is not None and a[A_STATUS] in ("approved", "executed"):
            self.latencies.append(a[A_DECIDED] - a[A_CREATED])
        if is_redacted(a[A_ARGS]):
            self.redaction(("eg_approvals", approval_id), tool, a[A_ARGS], a[A_HASH], approval_id)
        elif stored_args_hash(tool, a[A_ARGS]) != a[A_HASH]:
            self.add(
                "args_tampered", tool, "the stored arguments do not hash to the approval's hash", approval_id
            )
        if self.keyring is not None and not sealed_values(self.keyring, "approval", a[:A_SEAL], a[A_SEAL]):
            self.add("seal_broken", tool, "the approval's seal does not verify", approval_id)
        row = self.rules.get(a[A_ROW_FP])
        policy = self.policy(a[A_POLICY_FP], tool, approval_id)
        if row is None:
            self.add("rule_missing", tool, f"table row {a[A_ROW_FP][:12]} is not recorded", approval_id)
        role, required = a[A_ROLE], a[A_REQUIRED]
        if row is not None and policy is not None:
            args: Any = {}
            if row.get("escalate"):  # only escalation rules read the arguments
                try:
                    args = json.loads(a[A_ARGS])
                except ValueError:
                    args = {}
            effect = Effect(row["effect"])
            needed = policy.approvals_needed(effect)
            roles = possible_roles(row, args)
            if is_redacted(a[A_ARGS]):  # the erased arguments cannot be evaluated: any role of the row
                roles |= {r["role"] for r in row.get("escalate", ())}
            if a[A_EFFECT] != effect or required != needed or role not in roles:
                self.add(
                    "bar_lowered",
                    tool,
                    f"recorded {a[A_EFFECT]}, role {role}, {required} approver(s); the rule at the "
                    f"time says {effect}, role {' or '.join(sorted(roles))}, {needed} approver(s)",
                    approval_id,
                )
            # The bar an execution is held to: never lower than what the rule at the time says.
            role = role if role in roles else sorted(roles)[0]
            required = max(required, needed)
        if a[A_STATUS] == "approved":
            self.changed_since_approval(a)
        rounds: dict[tuple[int, int], set[str]] = defaultdict(set)
        for d in decisions:
            if not self._decision(a, d, policy, role):
                continue
            if d[D_DECISION] == "approve":
                rounds[(d[D_VERSION], d[D_ROUND])].add(d[D_APPROVER])
        approvers: dict[int, int] = {}
        for (version, _), people in rounds.items():
            approvers[version] = max(approvers.get(version, 0), len(people))
        self.bars[approval_id] = _Bar(
            a[A_VERSION], a[A_HASH], a[A_ROW_FP], a[A_EFFECT], role, required, approvers
        )

    def redaction(
        self,
        where: tuple[str, str],
        tool: str,
        args: str,
        args_hash: str,
        approval: str | None,
        ex: int | None = None,
    ) -> None:
        problem = redaction_problem(self.redacted, self.keyring, where, args, args_hash)
        if problem is not None:
            self.add("redaction_forged", tool, problem, approval, ex)

    def changed_since_approval(self, a: tuple[Any, ...]) -> None:
        """An approved call that has not run, whose tool changed after the approval (a row of
        the same name recorded since, or, with `table`, the table's row now): the reviewer
        approved another tool, and the grant can no longer run (execute re-derives the row)."""
        tool, fingerprint = a[A_TOOL], a[A_ROW_FP]
        recorded = self.rules.get(fingerprint)
        if recorded is not None and recorded.get("shadow") is True:
            return  # proposed in shadow mode: no grant exists, and a change of row is the switch to live
        decided = a[A_DECIDED] if a[A_DECIDED] is not None else a[A_CREATED]
        since = [f for at, f in self.rules.rows_of(tool) if f != fingerprint and at >= decided]
        if since:
            now = f"row {since[-1][:12]} was recorded after the approval"
        elif self.table is None:
            return
        else:
            spec = self.table.get(tool)
            if spec is not None and spec.fingerprint == fingerprint:
                return
            now = (
                "the tool is no longer in the table"
                if spec is None
                else f"the table's row is now {spec.fingerprint[:12]}"
            )
        self.add(
            "reclassified",
            tool,
            f"approved under row {fingerprint[:12]}, not executed; {now} (the tool changed since it "
            "was approved: its grant cannot run)",
            a[A_ID],
        )

    def _decision(self, a: tuple[Any, ...], d: tuple[Any, ...], policy: Policy | None, role: str) -> bool:
        """Report what is wrong with one decision; True when it counts as a valid approval."""
        tool, approval_id = a[A_TOOL], a[A_ID]
        if self.keyring is not None and not sealed_values(self.keyring, "decision", d[:D_SEAL], d[D_SEAL]):
            self.add(
                "decision_forged",
                tool,
                f"decision {d[D_ID]} by {d[D_APPROVER]}: seal does not verify",
                approval_id,
            )
            return False
        if d[D_DECISION] != "approve":
            return False
        ok = True
        if policy is not None and not policy.role_satisfies(d[D_ROLE], a[A_ROLE]):
            self.add(
                "wrong_role",
                tool,
                f"{d[D_APPROVER]} approved as {d[D_ROLE]}; {a[A_ROLE]} needed",
                approval_id,
            )
            ok = False
        if d[D_APPROVER] == a[A_USER] and not (policy is not None and policy.self_approval):
            self.add("self_approved", tool, f"{d[D_APPROVER]} approved their own call", approval_id)
            ok = False
        return ok and (policy is None or policy.role_satisfies(d[D_ROLE], role))

    # -- executions

    def execution(self, ex: tuple[Any, ...], runs: Counter[str]) -> None:
        ex_id, approval_id, tool = ex[E_ID], ex[E_APPROVAL], ex[E_TOOL]
        if is_redacted(ex[E_ARGS]):
            self.redaction(("eg_executions", str(ex_id)), tool, ex[E_ARGS], ex[E_HASH], approval_id, ex_id)
        elif stored_args_hash(tool, ex[E_ARGS]) != ex[E_HASH]:
            self.add(
                "args_tampered",
                tool,
                "the executed arguments do not hash to the recorded hash",
                approval_id,
                ex_id,
            )
        policy = self.policy(ex[E_POLICY_FP], tool, approval_id) if ex[E_POLICY_FP] else None
        spec = self.table.get(tool) if self.table is not None else None
        effect = Effect(ex[E_EFFECT])
        gated_now = policy.gates(effect) if policy is not None else effect in _GATED_CLASSES
        if not gated_now and approval_id is None:
            if spec is not None and spec.effect in _GATED_CLASSES and spec.effect != effect:
                self.add(
                    "reclassified",
                    tool,
                    f"ran ungated as {ex[E_EFFECT]}; the table now says {spec.effect}",
                    ex=ex_id,
                )
            return
        bar = self.bars.get(approval_id) if approval_id else None
        if bar is None:
            self.add("no_approval", tool, "gated execution with no approval record", approval_id, ex_id)
            return
        given = bar.approvers.get(ex[E_VERSION], 0) if ex[E_VERSION] is not None else 0
        if ex[E_VERSION] != bar.version or given < bar.required:
            self.add(
                "not_approved",
                tool,
                f"{given} of {bar.required} valid approvals for the executed version",
                approval_id,
                ex_id,
            )
        if ex[E_HASH] != bar.args_hash:
            self.add(
                "hash_mismatch",
                tool,
                f"executed {ex[E_HASH][:12]}, approved {bar.args_hash[:12]}",
                approval_id,
                ex_id,
            )
        if ex[E_STATUS] == "succeeded":
            runs[approval_id] += 1
            if runs[approval_id] == 2:
                self.add("executed_twice", tool, "executed more than once", approval_id, ex_id)
        if ex[E_ROW_FP] != bar.row_fingerprint:
            self.add(
                "reclassified",
                tool,
                "the tool's row changed between approval and execution",
                approval_id,
                ex_id,
            )
        if self.table is not None and (spec is None or spec.fingerprint != bar.row_fingerprint):
            now = (
                "is no longer in the table"
                if spec is None
                else f"is now {spec.effect}, role {spec.approver_role}"
            )
            self.add("reclassified", tool, f"approved as {bar.effect}; the tool {now}", approval_id, ex_id)


class _Merge:
    """A stream of rows ordered by the key at `index`, consumed one key at a time."""

    def __init__(self, rows: Iterator[tuple[Any, ...]], index: int) -> None:
        self._rows = rows
        self._index = index
        self._head: tuple[Any, ...] | None = next(rows, None)

    def before(self, key: str) -> Iterator[tuple[Any, ...]]:
        """The rows whose key sorts before `key` (their approval does not exist)."""
        while self._head is not None and self._head[self._index] < key:
            row, self._head = self._head, next(self._rows, None)
            yield row

    def take(self, key: str) -> Iterator[tuple[Any, ...]]:
        """The rows of `key` (call after `before(key)` is exhausted)."""
        while self._head is not None and self._head[self._index] == key:
            row, self._head = self._head, next(self._rows, None)
            yield row

    def rest(self) -> Iterator[tuple[Any, ...]]:
        while self._head is not None:
            row, self._head = self._head, next(self._rows, None)
            yield row


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
    scan = _Scan(store, table, keyring)
    succeeded = 0

    def executed(ex: tuple[Any, ...], runs: Counter[str]) -> None:
        nonlocal succeeded
        if ex[E_STATUS] == "succeeded":
            succeeded += 1
        if ex[E_STATUS] in ("succeeded", "needs_reconciliation"):
            scan.execution(ex, runs)

    with store.reading() as conn:
        # Three streams ordered by approval id, merged: each approval is checked with its own
        # decisions and executions, and nothing is kept once it is done (memory stays flat).
        decisions = _Merge(store.audit_rows(conn, "decisions"), D_APPROVAL)
        executions = _Merge(store.audit_rows(conn, "gated_executions"), E_APPROVAL)
        for a in store.audit_rows(conn, "approvals"):
            approval_id = a[A_ID]
            for orphan in executions.before(approval_id):
                executed(orphan, Counter())
            for _ in decisions.before(approval_id):  # a decision for no approval allows nothing
                pass
            scan.approval(a, list(decisions.take(approval_id)))
            runs: Counter[str] = Counter()
            for ex in executions.take(approval_id):
                executed(ex, runs)
            scan.bars.pop(approval_id, None)
        for orphan in executions.rest():
            executed(orphan, Counter())
        for ex in store.audit_rows(conn, "other_executions"):
            executed(ex, Counter())
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
        for b in verify_chain(store, keyring):
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
