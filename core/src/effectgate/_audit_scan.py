"""The audit's checks, and the findings they report (`audit.py` documents what is checked and
drives the scan over the streamed rows; `_audit_rows.py` holds the row plumbing).

`Scan.approval` checks one approval with its decisions and keeps the bar its executions are held
to; `Scan.execution` checks one execution against that bar (or, ungated, against the table).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Literal

from . import _audit_rows as col
from ._audit_rows import Bar, Rules
from ._rules import possible_roles
from ._seal import sealed_values, stored_args_hash
from .effects import Effect, Policy, weakened
from .redact import entries, is_redacted, redaction_problem
from .stores.protocol import Store
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


GATED_CLASSES = frozenset({Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE})


class Scan:
    """One pass over the streamed rows: its findings so far, and what later rows are checked
    against (the bar each approval set, the policies already reported)."""

    def __init__(self, store: Store, table: EffectTable | None, keyring: Keyring | None) -> None:
        self.store = store
        self.table = table
        self.keyring = keyring
        self.rules = Rules(store.rules())
        self.findings: list[Finding] = []
        self.reported_policies: set[str] = set()
        self.bars: dict[str, Bar] = {}
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
        approval_id, tool = a[col.A_ID], a[col.A_TOOL]
        self.statuses[a[col.A_STATUS]] += 1
        if a[col.A_DECIDED] is not None and a[col.A_STATUS] in ("approved", "executed"):
            self.latencies.append(a[col.A_DECIDED] - a[col.A_CREATED])
        redacted = is_redacted(a[col.A_ARGS])
        if redacted:
            self.redaction(("eg_approvals", approval_id), tool, a[col.A_ARGS], a[col.A_HASH], approval_id)
        elif stored_args_hash(tool, a[col.A_ARGS]) != a[col.A_HASH]:
            self.add(
                "args_tampered", tool, "the stored arguments do not hash to the approval's hash", approval_id
            )
        if self.keyring is not None and not sealed_values(
            self.keyring, "approval", a[: col.A_SEAL], a[col.A_SEAL]
        ):
            self.add("seal_broken", tool, "the approval's seal does not verify", approval_id)
        row = self.rules.get(a[col.A_ROW_FP])
        policy = self.policy(a[col.A_POLICY_FP], tool, approval_id)
        if row is None:
            self.add("rule_missing", tool, f"table row {a[col.A_ROW_FP][:12]} is not recorded", approval_id)
        role, required = a[col.A_ROLE], a[col.A_REQUIRED]
        if row is not None and policy is not None:
            args: Any = {}
            if row.get("escalate"):  # only escalation rules read the arguments
                try:
                    args = json.loads(a[col.A_ARGS])
                except ValueError:
                    args = {}
            effect = Effect(row["effect"])
            needed = policy.approvals_needed(effect)
            roles = possible_roles(row, args)
            if redacted:  # the erased arguments cannot be evaluated: any role of the row
                roles |= {r["role"] for r in row.get("escalate", ())}
            if a[col.A_EFFECT] != effect or required != needed or role not in roles:
                self.add(
                    "bar_lowered",
                    tool,
                    f"recorded {a[col.A_EFFECT]}, role {role}, {required} approver(s); the rule at the "
                    f"time says {effect}, role {' or '.join(sorted(roles))}, {needed} approver(s)",
                    approval_id,
                )
            # The bar an execution is held to: never lower than what the rule at the time says.
            role = role if role in roles else sorted(roles)[0]
            required = max(required, needed)
        if a[col.A_STATUS] == "approved":
            self.changed_since_approval(a)
        rounds: dict[tuple[int, int], set[str]] = defaultdict(set)
        for d in decisions:
            if not self._decision(a, d, policy, role):
                continue
            if d[col.D_DECISION] == "approve":
                rounds[(d[col.D_VERSION], d[col.D_ROUND])].add(d[col.D_APPROVER])
        approvers: dict[int, int] = {}
        for (version, _), people in rounds.items():
            approvers[version] = max(approvers.get(version, 0), len(people))
        self.bars[approval_id] = Bar(
            a[col.A_VERSION], a[col.A_HASH], a[col.A_ROW_FP], a[col.A_EFFECT], role, required, approvers
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
        tool, fingerprint = a[col.A_TOOL], a[col.A_ROW_FP]
        recorded = self.rules.get(fingerprint)
        if recorded is not None and recorded.get("shadow") is True:
            return  # proposed in shadow mode: no grant exists, and a change of row is the switch to live
        decided = a[col.A_DECIDED] if a[col.A_DECIDED] is not None else a[col.A_CREATED]
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
            a[col.A_ID],
        )

    def _decision(self, a: tuple[Any, ...], d: tuple[Any, ...], policy: Policy | None, role: str) -> bool:
        """Report what is wrong with one decision; True when it counts as a valid approval."""
        tool, approval_id = a[col.A_TOOL], a[col.A_ID]
        if self.keyring is not None and not sealed_values(
            self.keyring, "decision", d[: col.D_SEAL], d[col.D_SEAL]
        ):
            self.add(
                "decision_forged",
                tool,
                f"decision {d[col.D_ID]} by {d[col.D_APPROVER]}: seal does not verify",
                approval_id,
            )
            return False
        if d[col.D_DECISION] != "approve":
            return False
        ok = True
        if policy is not None and not policy.role_satisfies(d[col.D_ROLE], a[col.A_ROLE]):
            self.add(
                "wrong_role",
                tool,
                f"{d[col.D_APPROVER]} approved as {d[col.D_ROLE]}; {a[col.A_ROLE]} needed",
                approval_id,
            )
            ok = False
        if d[col.D_APPROVER] == a[col.A_USER] and not (policy is not None and policy.self_approval):
            self.add("self_approved", tool, f"{d[col.D_APPROVER]} approved their own call", approval_id)
            ok = False
        return ok and (policy is None or policy.role_satisfies(d[col.D_ROLE], role))

    # -- executions

    def execution(self, ex: tuple[Any, ...], runs: Counter[str]) -> None:
        ex_id, approval_id, tool = ex[col.E_ID], ex[col.E_APPROVAL], ex[col.E_TOOL]
        if is_redacted(ex[col.E_ARGS]):
            self.redaction(
                ("eg_executions", str(ex_id)), tool, ex[col.E_ARGS], ex[col.E_HASH], approval_id, ex_id
            )
        elif stored_args_hash(tool, ex[col.E_ARGS]) != ex[col.E_HASH]:
            self.add(
                "args_tampered",
                tool,
                "the executed arguments do not hash to the recorded hash",
                approval_id,
                ex_id,
            )
        policy = self.policy(ex[col.E_POLICY_FP], tool, approval_id) if ex[col.E_POLICY_FP] else None
        spec = self.table.get(tool) if self.table is not None else None
        effect = Effect(ex[col.E_EFFECT])
        gated_now = policy.gates(effect) if policy is not None else effect in GATED_CLASSES
        if not gated_now and approval_id is None:
            if spec is not None and spec.effect in GATED_CLASSES and spec.effect != effect:
                self.add(
                    "reclassified",
                    tool,
                    f"ran ungated as {ex[col.E_EFFECT]}; the table now says {spec.effect}",
                    ex=ex_id,
                )
            return
        bar = self.bars.get(approval_id) if approval_id else None
        if bar is None:
            self.add("no_approval", tool, "gated execution with no approval record", approval_id, ex_id)
            return
        given = bar.approvers.get(ex[col.E_VERSION], 0) if ex[col.E_VERSION] is not None else 0
        if ex[col.E_VERSION] != bar.version or given < bar.required:
            self.add(
                "not_approved",
                tool,
                f"{given} of {bar.required} valid approvals for the executed version",
                approval_id,
                ex_id,
            )
        if ex[col.E_HASH] != bar.args_hash:
            self.add(
                "hash_mismatch",
                tool,
                f"executed {ex[col.E_HASH][:12]}, approved {bar.args_hash[:12]}",
                approval_id,
                ex_id,
            )
        if ex[col.E_STATUS] == "succeeded":
            runs[approval_id] += 1
            if runs[approval_id] == 2:
                self.add("executed_twice", tool, "executed more than once", approval_id, ex_id)
        if ex[col.E_ROW_FP] != bar.row_fingerprint:
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
