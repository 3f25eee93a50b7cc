"""The audit's checks and their findings (`audit.py` documents what is checked and drives the
scan over the streamed rows; `_audit_rows.py` holds the row plumbing). `Scan.approval` checks one
approval with its decisions and returns the bar its executions are held to; `Scan.execution`
checks one execution against that bar, and against the recorded table row it names (an execution
with no approval: that row says whether it needed one)."""

from __future__ import annotations

from collections import Counter
from math import isfinite
from typing import Any

from ._audit_deadline import approved_late
from ._audit_rows import (
    A_ARGS,
    A_CREATED,
    A_DECIDED,
    A_EFFECT,
    A_GRANTS,
    A_HASH,
    A_ID,
    A_POLICY_FP,
    A_REQUIRED,
    A_ROLE,
    A_ROW_FP,
    A_SEAL,
    A_STATUS,
    A_SUBJECT,
    A_TOOL,
    A_USER,
    A_VERSION,
    D_APPROVER,
    D_DECISION,
    D_ID,
    D_ROLE,
    D_ROUND,
    D_SEAL,
    D_VERSION,
    E_APPROVAL,
    E_ARGS,
    E_EFFECT,
    E_HASH,
    E_ID,
    E_POLICY_FP,
    E_ROW_FP,
    E_STATUS,
    E_TOOL,
    E_VERSION,
    EFFECTS,
    UNSEALED,
    Bar,
    Derived,
    Finding,
    FindingKind,
    Rules,
    changed_since,
    foreign_key,
    is_shadow,
    marker_problem,
    ran,
    roles_of,
    row_problem,
    status_at,
)
from ._audit_sealed import backing, entries, status_tampered
from ._person import person
from ._rules import possible_roles
from ._seal import RELEASE, seal_checker, stored_args_hash
from .effects import Effect, Policy, weakened
from .redact import is_redacted
from .report._figures import APPROVED
from .stores.protocol import Store
from .table import EffectTable
from .tokens import Keyring

_TIME, _UNMET = (int, float), 1 << 30  # a value of another type edited in (SQLite): no time, no bar met

GATED_CLASSES = frozenset({Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE})


class Scan:
    """One pass over the streamed rows: its findings so far, and what later rows are checked
    against (the rules derived, the policies already reported)."""

    def __init__(self, store: Store, table: EffectTable | None, keyring: Keyring | None) -> None:
        self.store = store
        self.table = table
        self.keyring = keyring
        self.rules = Rules(store.rules(), keyring, reread=store.rules)  # rules recorded since: read again
        self.findings: list[Finding] = []
        self.reported_policies: set[str] = set()
        self.statuses: Counter[str] = Counter()
        self.now = store.clock.now()
        self.latencies: list[float] = []
        # The redaction entry backing each erased value, and those hidden beside one (`backing`):
        # read again once on a miss (a redaction committed since).
        self.redacted, self.hidden = backing(entries(store), keyring)
        self.reread = False
        self.approval_sealed = seal_checker(keyring, "approval") if keyring is not None else None
        self.decision_sealed = seal_checker(keyring, "decision") if keyring is not None else None
        # What each (table row, policy) pair of recorded rules implies, derived once (only for
        # pairs whose rules are both recorded: a missing one is reported at every approval).
        self.derived: dict[tuple[str, str], Derived] = {}
        self.policies: dict[str, Policy] = {}  # the recorded policies seen so far, by fingerprint
        self.weakened: dict[int, str] = {}  # finding index -> policy, of policy_weakened findings
        self.succeeded = 0

    def add(
        self, kind: FindingKind, tool: str, detail: str, approval: str | None = None, ex: int | None = None
    ) -> None:
        self.findings.append(Finding(kind, tool, detail, approval, ex))

    def policy(self, fingerprint: str, tool: str, approval_id: str | None = None) -> Policy | None:
        body, policy = self.rules.get(fingerprint), self.rules.policy(fingerprint)
        if body is None or policy is None:  # not recorded, or not a policy's body
            self.add("rule_missing", tool, f"policy {fingerprint[:12] or '-'} is not recorded", approval_id)
            return None
        if fingerprint not in self.reported_policies:
            self.reported_policies.add(fingerprint)
            for weakness in weakened(body):
                self.weakened[len(self.findings)] = fingerprint
                self.add("policy_weakened", tool, f"policy {fingerprint[:12]}: {weakness}", approval_id)
        return policy

    # -- approvals and their decisions

    def approval(self, a: tuple[Any, ...], decisions: list[tuple[Any, ...]]) -> Bar:
        """Check one approval with its decisions; the bar its executions are held to."""
        approval_id, tool, args, status = a[A_ID], a[A_TOOL], a[A_ARGS], a[A_STATUS]
        self.statuses[status if status != "pending" else status_at(a, self.now)] += 1  # or expired
        approved = status in APPROVED
        timed = approved and type(a[A_DECIDED]) in _TIME and type(a[A_CREATED]) in _TIME
        if timed and isfinite(latency := a[A_DECIDED] - a[A_CREATED]):  # NaN, infinity: no clock's
            self.latencies.append(latency)
        redacted = is_redacted(args)
        recomputed = None
        if redacted:
            self.redaction(("eg_approvals", approval_id), tool, args, a[A_HASH], approval_id)
        elif (recomputed := stored_args_hash(tool, args)) != a[A_HASH]:
            self.add(
                "args_tampered", tool, "the stored arguments do not hash to the approval's hash", approval_id
            )
        if self.approval_sealed is not None and not self.approval_sealed(a[:A_SEAL], a[A_SEAL]):
            self.add("seal_broken", tool, "the approval's seal does not verify", approval_id)
        role, required = a[A_ROLE], a[A_REQUIRED] if type(a[A_REQUIRED]) is int else _UNMET
        rule = self.derived.get((a[A_ROW_FP], a[A_POLICY_FP])) or self.derive(a)
        policy = rule.policy if rule is not None else self.rules.policy(a[A_POLICY_FP])
        if rule is not None:
            roles = rule.roles if rule.roles is not None and not redacted else roles_of(rule, args, redacted)
            effect, needed = rule.effect, rule.needed
            if a[A_EFFECT] != effect or required != needed or role not in roles:
                self.add(
                    "bar_lowered",
                    tool,
                    f"recorded {a[A_EFFECT]}, role {role}, {a[A_REQUIRED]} approver(s); the rule at the "
                    f"time says {effect}, role {' or '.join(sorted(roles))}, {needed} approver(s)",
                    approval_id,
                )
            # The bar an execution is held to: never lower than what the rule at the time says.
            role = role if role in roles else sorted(roles)[0]
            required = max(required, needed)
        shadow = rule.shadow if rule is not None else is_shadow(self.rules.get(a[A_ROW_FP]), a[A_SUBJECT])
        # An approved call that has not run, whose tool changed since: its grant cannot run.
        if status == "approved" and (now := changed_since(self.rules, self.table, a, self.now)) is not None:
            detail = f"approved under row {a[A_ROW_FP][:12]}, not executed; {now} (the tool changed since "
            self.add("reclassified", tool, detail + "it was approved: its grant cannot run)", approval_id)
        # As at execute: only the round that minted the version's last grant (its sealed count of
        # grants) counts, unless given back unpresented (a sealed release); a sealed denial is final.
        # A shadow call is decided in round 0 and never granted (its run is `shadow_executed`).
        last = (a[A_VERSION], 0 if shadow else a[A_GRANTS] - 1) if type(a[A_GRANTS]) is int else None
        people: set[str] = set()
        denied: set[int] = set()  # versions with a sealed denial: final for the version, as at execute
        released = False
        for d in decisions:
            if self._decision(a, d, policy, role):
                if (d[D_VERSION], d[D_ROUND]) == last:
                    people.add(d[D_APPROVER])  # one person under two spellings: below
            elif self._sealed_as(d, "deny"):
                denied.add(d[D_VERSION])
            elif (d[D_VERSION], d[D_ROUND]) == last and self._sealed_as(d, RELEASE):
                released = True
        revoked = released or a[A_VERSION] in denied
        if denied or status == "denied" or approved is not (type(a[A_GRANTS]) is int and a[A_GRANTS] > 0):
            self.findings += status_tampered(a, approved, a[A_VERSION] in denied, shadow)
        self.findings += approved_late(a, decisions, self.decision_sealed)
        count = len(people) if len(people) < 2 else len({person(p) for p in people})
        approvers = {a[A_VERSION]: count} if people and not revoked else {}
        return Bar(
            a[A_VERSION],
            a[A_HASH],
            a[A_ROW_FP],
            a[A_EFFECT],
            role,
            required,
            approvers,
            tool,
            args,
            recomputed,
            shadow,
            frozenset(denied),
        )

    def derive(self, a: tuple[Any, ...]) -> Derived | None:
        """What the approval's recorded table row and policy imply (kept for the next approval
        made under both), or None, reporting what is not recorded (at every approval)."""
        tool, approval_id = a[A_TOOL], a[A_ID]
        row = self.rules.table_row(a[A_ROW_FP])
        policy = self.policy(a[A_POLICY_FP], tool, approval_id)
        if row is None:
            self.add("rule_missing", tool, f"table row {a[A_ROW_FP][:12]} is not recorded", approval_id)
        if row is None or policy is None:
            return None
        effect = Effect(row["effect"])
        escalates = bool(row.get("escalate"))  # only escalation rules read the arguments
        rule = Derived(
            row,
            policy,
            effect,
            policy.approvals_needed(effect),
            None if escalates else frozenset(possible_roles(row, {})),
            row.get("shadow") is True,
        )
        self.derived[(a[A_ROW_FP], a[A_POLICY_FP])] = rule
        return rule

    def redaction(
        self,
        where: tuple[str, str],
        tool: str,
        args: str,
        args_hash: str,
        approval: str | None,
        ex: int | None = None,
    ) -> None:
        if (*where, "args_json") not in self.redacted and not self.reread:  # its markers and entries
            self.reread = True  # commit together: read them again
            self.redacted, self.hidden = backing(entries(self.store), self.keyring)
        problem = marker_problem(self.redacted.get((*where, "args_json")), self.keyring, args, args_hash)
        if problem is not None:
            self.add("redaction_forged", tool, f"the arguments: {problem}", approval, ex)

    def _sealed_as(self, d: tuple[Any, ...], kind: str) -> bool:
        """Whether a decision is a `kind` ("deny", or a `RELEASE`) whose seal verifies (or seals are
        not checked): the gate refuses to run a version denied, or a grant given back, whatever
        the status column says (`Ledger.decided`, `_seal.grant_released`)."""
        return d[D_DECISION] == kind and (
            self.decision_sealed is None or self.decision_sealed(d[:D_SEAL], d[D_SEAL])
        )

    def _decision(self, a: tuple[Any, ...], d: tuple[Any, ...], policy: Policy | None, role: str) -> bool:
        """Report what is wrong with one decision; True when it is an approval that counts."""
        tool, approval_id = a[A_TOOL], a[A_ID]
        if self.decision_sealed is not None and not self.decision_sealed(d[:D_SEAL], d[D_SEAL]):
            self.add(
                "decision_forged",
                tool,
                f"decision {d[D_ID]} by {d[D_APPROVER]}: seal does not verify",
                approval_id,
            )
            return False
        if d[D_DECISION] != "approve" or d[D_VERSION] != a[A_VERSION]:
            # An earlier version's was decided for its own role and proposer, which the row no longer
            # holds (an amendment can escalate one, and change the other): it counts for no run.
            return False
        ok = True
        if policy is not None and not policy.role_satisfies(d[D_ROLE], a[A_ROLE]):
            detail = f"{d[D_APPROVER]} approved as {d[D_ROLE]}; {a[A_ROLE]} needed"
            self.add("wrong_role", tool, detail, approval_id)
            ok = False
        if not (policy is not None and policy.self_approval) and person(d[D_APPROVER]) == person(a[A_USER]):
            self.add("self_approved", tool, f"{d[D_APPROVER]} approved their own call", approval_id)
            ok = False
        return ok and (policy is None or policy.role_satisfies(d[D_ROLE], role))

    # -- executions

    def executed(self, ex: tuple[Any, ...], runs: dict[str, int], bar: Bar | None = None) -> None:
        """Count one execution, and check it if it ran (`execution`)."""
        status = ex[E_STATUS]
        if status == "succeeded":
            self.succeeded += 1
        if ran(status):  # a status the gate never writes too: edited in, checked as a run
            self.execution(ex, runs, bar)

    def execution(self, ex: tuple[Any, ...], runs: dict[str, int], bar: Bar | None) -> None:
        """Check one execution against the bar of its approval (None: it has no approval record,
        or none is needed) and against the recorded table row it names, counting its runs of that
        approval in `runs`."""
        ex_id, approval_id, tool, args = ex[E_ID], ex[E_APPROVAL], ex[E_TOOL], ex[E_ARGS]
        if is_redacted(args):
            self.redaction(("eg_executions", str(ex_id)), tool, args, ex[E_HASH], approval_id, ex_id)
        elif (
            # the same tool and argument text as the approval's hash the same: recomputed once
            bar.recomputed
            if bar is not None and bar.recomputed is not None and tool == bar.tool and args == bar.args_json
            else stored_args_hash(tool, args)
        ) != ex[E_HASH]:
            detail = "the executed arguments do not hash to the recorded hash"
            self.add("args_tampered", tool, detail, approval_id, ex_id)
        fingerprint = ex[E_POLICY_FP]
        policy = self.policies.get(fingerprint) if fingerprint else None
        if policy is None and fingerprint:
            policy = self.policy(fingerprint, tool, approval_id)
            if policy is not None:
                self.policies[fingerprint] = policy
        if bar is not None and ex[E_ROW_FP] == bar.row_fingerprint:
            # its approval's row: checked (and reported if not recorded) with the approval
            if bar.shadow:
                self.add("shadow_executed", tool, "ran a call proposed in shadow mode", approval_id, ex_id)
            if ex[E_EFFECT] != bar.effect:
                self.add(
                    "reclassified",
                    tool,
                    f"recorded as {ex[E_EFFECT]}; its approval's row says {bar.effect}",
                    approval_id,
                    ex_id,
                )
        elif not self.named_row(ex, policy) and approval_id is None:
            if not fingerprint or (policy is not None and not self.rules.sealed(fingerprint, "policy")):
                why = UNSEALED if fingerprint else "not recorded"  # it alone let it run (the gate names one)
                self.add("rule_missing", tool, f"policy {fingerprint[:12] or '-'} is {why}", ex=ex_id)
            return  # ungated, as the row it names says (under a policy it can use)
        if bar is None:
            self.add("no_approval", tool, "gated execution with no approval record", approval_id, ex_id)
            return
        given = bar.approvers.get(ex[E_VERSION], 0) if ex[E_VERSION] is not None else 0
        if ex[E_VERSION] != bar.version or given < bar.required:
            self.add(
                "not_approved",
                tool,
                "the executed version was denied (a sealed deny decision): nothing of it may run"
                if ex[E_VERSION] in bar.denied
                else f"{given} of {bar.required} valid approvals in the round of its last grant",
                approval_id,
                ex_id,
            )
        elif (key := foreign_key(ex)) is not None:  # the run of another grant, named this one's
            self.add("not_approved", tool, f"ran under another grant's key {key}", approval_id, ex_id)
        if ex[E_HASH] != bar.args_hash or tool != bar.tool:  # the hash covers the tool (erased args)
            self.add(
                "hash_mismatch",
                tool,
                f"executed {ex[E_HASH][:12]}, approved {bar.args_hash[:12]}"
                if ex[E_HASH] != bar.args_hash
                else f"executed {tool}, approved {bar.tool}",
                approval_id,
                ex_id,
            )
        if ex[E_STATUS] != "needs_reconciliation":  # its settlement, if it ran, is a row of its own
            runs[approval_id] = runs.get(approval_id, 0) + 1
            if runs[approval_id] == 2:
                self.add("executed_twice", tool, "executed more than once", approval_id, ex_id)
        if ex[E_ROW_FP] != bar.row_fingerprint:
            detail = "the tool's row changed between approval and execution"
            self.add("reclassified", tool, detail, approval_id, ex_id)
        spec = self.table.get(tool) if self.table is not None else None
        if self.table is not None and (spec is None or spec.fingerprint != bar.row_fingerprint):
            now = (
                "is no longer in the table"
                if spec is None
                else f"is now {spec.effect}, role {spec.approver_role}"
            )
            self.add("reclassified", tool, f"approved as {bar.effect}; the tool {now}", approval_id, ex_id)

    def named_row(self, ex: tuple[Any, ...], policy: Policy | None) -> bool:
        """Check an execution against the recorded table row it names (not its approval's): its
        tool's, sealed (with a keyring), of the effect the execution says, not a shadow row. True
        when the execution needed an approval: the row's effect or its own is gated under its
        policy (or, without one, is send, money or destructive), or the row is not one it can use."""
        ex_id, approval_id, tool, fingerprint = ex[E_ID], ex[E_APPROVAL], ex[E_TOOL], ex[E_ROW_FP]
        row = self.rules.row(fingerprint)
        effect = EFFECTS.get(ex[E_EFFECT])
        if (named := row_problem(row, tool)) is not None or row is None:  # then it needed one
            self.add(
                "rule_missing", tool, f"table row {fingerprint[:12] or '-'} is {named}", approval_id, ex_id
            )
            row = None
        else:
            if row.shadow:
                self.add("shadow_executed", tool, "ran a call of a shadow row", approval_id, ex_id)
            if row.effect is not effect:
                self.add(
                    "reclassified",
                    tool,
                    f"recorded as {ex[E_EFFECT]}; the row it names ({fingerprint[:12]}) says {row.effect}",
                    approval_id,
                    ex_id,
                )
        gated = GATED_CLASSES.__contains__ if policy is None else policy.gates
        needed = row is None or gated(row.effect) or effect is None or gated(effect)
        if not needed and approval_id is None and self.table is not None:
            spec = self.table.get(tool)
            if spec is not None and spec.effect in GATED_CLASSES and spec.effect != effect:
                self.add(
                    "reclassified",
                    tool,
                    f"ran ungated as {ex[E_EFFECT]}; the table now says {spec.effect}",
                    ex=ex_id,
                )
        return needed
