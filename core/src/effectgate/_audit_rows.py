"""The audit's row plumbing: the streamed rows' column positions, the recorded rules by
fingerprint, the bar an approval's execution is held to, the roles a rule can require, and what
is wrong with an erasure marker (`_audit_scan.py` holds the checks, `audit.py` merges the
streams)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._execution import EXEC_PREFIX
from ._json import same_json
from ._rules import possible_roles
from ._seal import rule_sealed, seals_by_rule
from .canonical import digest
from .effects import Effect, Policy
from .redact import MARK, entry_sealed
from .stores.records import RedactedRow, RuleRow
from .tokens import Keyring

if TYPE_CHECKING:
    from .table import EffectTable

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
    "shadow_executed",
    "redaction_forged",
    "chain_broken",
    "status_tampered",
    "approved_late",
]


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    tool: str
    detail: str
    approval_id: str | None = None
    execution_id: int | None = None

    def __post_init__(self) -> None:
        # A value SQLite kept as another type (a blob edited in) is named as text: the report is
        # JSON, and a finding must never be what stops it being written.
        if type(self.tool) is not str:
            object.__setattr__(self, "tool", str(self.tool))
        if self.approval_id is not None and type(self.approval_id) is not str:
            object.__setattr__(self, "approval_id", str(self.approval_id))


# Column positions of the streamed rows (stores/sql.py AUDIT_QUERIES, in this order).
A_ID, A_VERSION, A_GRANTS, A_SESSION, A_ORIGIN, A_USER, A_AGENT, A_TOOL, A_EFFECT = range(9)
A_SUBJECT, A_HASH, A_ROLE, A_REQUIRED, A_ROW_FP, A_POLICY_FP = range(9, 15)
A_SEAL, A_ARGS, A_STATUS, A_CREATED, A_DECIDED, A_EXPIRES, A_TOKEN_EXPIRES, A_PROPOSED = range(15, 23)
A_PROPOSED_DETAIL = 23  # the detail of the event that proposed the version: its `pending_ttl`
D_APPROVAL, D_VERSION, D_ROUND, D_APPROVER, D_ROLE, D_DECISION, D_SEAL, D_ID, D_AT = range(9)
E_ID, E_APPROVAL, E_VERSION, E_TOOL, E_EFFECT, E_HASH, E_ARGS, E_STATUS, E_ROW_FP, E_POLICY_FP = range(10)
E_KEY = 10  # the idempotency key it ran under (passed downstream): `_execution.exec_key` of its grant


EFFECTS = {e.value: e for e in Effect}  # Effect(text) without the enum's call, for every execution


@dataclass(frozen=True, slots=True)
class RecordedRow:
    """What the audit reads from a recorded table row an execution names."""

    tool: str
    effect: Effect
    shadow: bool
    sealed: bool  # its seal row verifies under the audit's keyring (True without one: unchecked)


class Rules:
    """The recorded rules by fingerprint, each verified against its fingerprint once, and with
    `keyring`, the seals of the rows (`_seal.rule_seal`; seal rows are not rules). `reread`: how to
    read them again, once, when one asked for is missing (recorded since: rules are never removed,
    and a call records its rules with its approval, so a scan that began later needs them)."""

    def __init__(
        self,
        rows: dict[str, RuleRow],
        keyring: Keyring | None = None,
        reread: Callable[[], dict[str, RuleRow]] | None = None,
    ) -> None:
        self._verifies = keyring.verifier("rule") if keyring is not None else None
        self._reread = reread
        self._load(rows)

    def _load(self, rows: dict[str, RuleRow]) -> None:
        self._rows = {fp: row for fp, row in rows.items() if row.kind != "seal"}
        self._seals = seals_by_rule(rows)
        self._parsed: dict[str, dict[str, Any] | None] = {}
        self._policies: dict[str, Policy | None] = {}
        self._by_tool: dict[str, list[tuple[float, str]]] | None = None
        self._table_rows: dict[str, RecordedRow | None] = {}
        self._sealed: dict[tuple[str, str], bool] = {}

    def get(self, fingerprint: str) -> dict[str, Any] | None:
        if fingerprint not in self._parsed:
            row = self._rows.get(fingerprint)
            if row is None and self._reread is not None:
                rows, self._reread = self._reread(), None
                self._load(rows)
                row = self._rows.get(fingerprint)
            body: dict[str, Any] | None = None
            if row is not None:
                try:
                    parsed = json.loads(row.body_json)
                    body = parsed if type(parsed) is dict and digest(parsed) == fingerprint else None
                except (ValueError, TypeError, RecursionError):
                    body = None
            self._parsed[fingerprint] = body
        return self._parsed[fingerprint]

    def row(self, fingerprint: str) -> RecordedRow | None:
        """The tool, effect, shadow mode and seal of the recorded table row `fingerprint`, or None
        when no verified table row has that fingerprint (none, a policy's, or not a row the gate
        writes)."""
        if fingerprint not in self._table_rows:
            body = self.get(fingerprint)
            tool, effect = (body.get("name"), body.get("effect")) if body is not None else (None, None)
            self._table_rows[fingerprint] = (
                RecordedRow(tool, EFFECTS[effect], body.get("shadow") is True, self.sealed(fingerprint))
                if body is not None
                and isinstance(tool, str)
                and isinstance(effect, str)
                and effect in EFFECTS
                else None
            )
        return self._table_rows[fingerprint]

    def table_row(self, fingerprint: str) -> dict[str, Any] | None:
        """The canonical form of the recorded table row `fingerprint`, or None when no table row
        can be read from the body recorded under it (another rule's, or one inserted in the
        database: its effect, role or escalation rules are not what the gate writes)."""
        body = self.get(fingerprint)
        if body is None or self.row(fingerprint) is None or type(body.get("approver_role")) is not str:
            return None
        try:
            possible_roles(body, {})
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return body

    def rows_of(self, tool: str) -> list[tuple[float, str]]:
        """(recorded at, fingerprint) of every verified row recorded for `tool`, oldest first."""
        if self._by_tool is None:
            self._by_tool = defaultdict(list)
            for fingerprint, row in sorted(self._rows.items(), key=lambda item: _time(item[1].at, math.inf)):
                body = self.get(fingerprint) if row.kind == "row" else None
                if body is not None and isinstance(body.get("name"), str):
                    self._by_tool[body["name"]].append((_time(row.at, math.inf), fingerprint))
        return self._by_tool.get(tool, [])

    def sealed(self, fingerprint: str, kind: str = "row") -> bool:
        """Whether the rule `fingerprint` of `kind` ("row" or "policy") has a seal row that verifies
        under the keyring (True without one: unchecked)."""
        key, verifies = (fingerprint, kind), self._verifies
        if key not in self._sealed:
            seals = self._seals.get(fingerprint, ())
            self._sealed[key] = verifies is None or rule_sealed(verifies, seals, kind, fingerprint)
        return self._sealed[key]

    def policy(self, fingerprint: str) -> Policy | None:
        if fingerprint not in self._policies:
            body = self.get(fingerprint)
            self._policies[fingerprint] = _policy(body) if body is not None else None
        return self._policies[fingerprint]


def _policy(body: Mapping[str, Any]) -> Policy | None:
    """The policy `body` describes, or None when no policy can be read from it (another rule's
    body, or one inserted in the database that no policy has: it decides nothing)."""
    try:
        return Policy.from_canonical(body)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def changed_since(rules: Rules, table: EffectTable | None, a: tuple[Any, ...], now: float) -> str | None:
    """What changed about an approved call's tool since the approval (a row of the same name
    recorded since, or, with `table`, the table's row now), or None: the reviewer approved
    another tool. With `table`, its row is the approval's: nothing changed (a change since was
    rolled back, and the gate runs the grant). A call proposed in shadow mode has no grant: a
    change of row is the switch to live. Nor is a change once the approval and its last grant
    both expired (`now`, or the row's time): no grant of it could run, or be made, any more."""
    tool, fingerprint = a[A_TOOL], a[A_ROW_FP]
    recorded = rules.get(fingerprint)
    if recorded is not None and recorded.get("shadow") is True:
        return None
    spec = table.get(tool) if table is not None else None
    if spec is not None and spec.fingerprint == fingerprint:
        return None  # the table given runs the grant: a row recorded since was rolled back
    # a time edited into another type (SQLite) or NaN: unknown (a row's: infinite), so any other
    # row may be since, while the approval could still run
    decided = _time(a[A_DECIDED] if a[A_DECIDED] is not None else a[A_CREATED], -math.inf)
    lapsed = max(_time(a[A_EXPIRES], math.inf), _time(a[A_TOKEN_EXPIRES], -math.inf))
    since = [
        f for at, f in rules.rows_of(tool) if f != fingerprint and (decided <= at < lapsed or at == math.inf)
    ]
    if since:
        return f"row {since[-1][:12]} was recorded after the approval"
    if table is None or now >= lapsed:
        return None
    return (
        "the tool is no longer in the table"
        if spec is None
        else f"the table's row is now {spec.fingerprint[:12]}"
    )


def status_at(a: tuple[Any, ...], now: float) -> Any:
    """The approval's status at `now`: one still pending past its expiry (not yet swept by the gate)
    is "expired", as the gate treats it and as the report's SQL counts it (`_queries._STATUS`)."""
    expires = a[A_EXPIRES]
    if a[A_STATUS] == "pending" and type(expires) in (int, float) and expires <= now:
        return "expired"
    return a[A_STATUS]


def _time(value: Any, unknown: float) -> float:
    """`value` if it is a time (a number, not NaN), else `unknown`."""
    return float(value) if type(value) in (int, float) and not math.isnan(value) else unknown


#: Why a recorded rule (a table row or a policy) cannot judge an execution alone, with the keyring.
UNSEALED = (
    "not sealed by this keyring (recorded by an earlier release that no gate of this one has used "
    "since, or inserted in the database)"
)


def row_problem(row: RecordedRow | None, tool: str) -> str | None:
    """Why the recorded row an execution of `tool` names cannot judge it (None: it can). An
    execution naming its approval's row never asks: the approval's seal covers that row."""
    if row is None:
        return "not a recorded table row"
    if row.tool != tool:
        return f"the row of {row.tool}"
    return None if row.sealed else UNSEALED


@dataclass(slots=True)
class Bar:
    """What an execution of one approval is held to (kept per approval, without its rows)."""

    version: int
    args_hash: str
    row_fingerprint: str
    effect: str
    role: str
    required: int
    approvers: dict[int, int]  # version -> distinct valid approvers of its last grant's round
    tool: str
    args_json: str  # the approval's stored arguments, and the hash recomputed from them (None:
    recomputed: str | None  # erased, or not a text the gate writes)
    shadow: bool  # proposed in shadow mode: nothing of it may ever run
    denied: frozenset[int] = frozenset()  # versions with a sealed denial (a revoked grant): never run


@dataclass(frozen=True, slots=True)
class Derived:
    """What one recorded (table row, policy) pair implies for every approval made under it."""

    row: dict[str, Any]
    policy: Policy
    effect: Effect
    needed: int  # distinct approvers the policy requires for the row's effect
    roles: frozenset[str] | None  # the roles the row can require; None: it escalates on the arguments
    shadow: bool  # a shadow row: its calls are recorded, never run


def is_shadow(row: Mapping[str, Any] | None, subject_key: str) -> bool:
    """Whether a call was proposed in shadow mode: its recorded row says so (`shadow: true` in its
    canonical form) or its subject key is a shadow one (`_proposals.py` prefixes it)."""
    return (row is not None and row.get("shadow") is True) or subject_key.startswith("shadow:")


def roles_of(rule: Derived, args_json: str, redacted: bool) -> set[str]:
    """The roles the rule can require for these arguments (any of its roles when they were
    erased: they cannot be evaluated)."""
    args: Any = {}
    if rule.row.get("escalate"):
        try:
            args = json.loads(args_json)
        except (ValueError, RecursionError):  # edited into text that is not JSON (or too deep)
            args = {}
    roles = possible_roles(rule.row, args if type(args) is dict else {})  # or JSON, not an object
    if redacted:
        roles |= {r["role"] for r in rule.row.get("escalate", ())}
    return roles


Entries = Mapping[tuple[str, str, str], RedactedRow]  # the redaction entries by (table, row key, column)


def foreign_key(ex: tuple[Any, ...]) -> str | None:
    """The idempotency key a gated execution ran under when it is not its own grant's (the gate
    writes each under `_execution.exec_key` of the approval version it names), else None."""
    key = ex[E_KEY]
    return None if key == f"{EXEC_PREFIX}{ex[E_APPROVAL]}_v{ex[E_VERSION]}" else str(key)


def ran(status: object) -> bool:
    """Whether an execution row is checked as one that ran (`Scan.execution`, its arguments' marker
    included): the gate writes succeeded, needs_reconciliation and failed (nothing happened); a
    status it never writes was edited in, and is never what hides a run from the audit."""
    return status != "failed"


def marker_problem(
    entry: RedactedRow | None, keyring: Keyring | None, text: str, args_hash: str | None
) -> str | None:
    """What is wrong with a stored value that starts like a redaction marker (None: nothing).
    Only `redact` writes one (the gate refuses such arguments and stores such results with a
    leading space), so it needs its sealed entry (`entry`: the one naming its table, row and
    column), the args hash the entry names (arguments: `args_hash`, the row's), the entry's
    redaction, and exactly the facts the entry kept (`kept_json`), each key once."""
    if entry is None:
        return "a redaction marker that no redaction wrote"
    if keyring is not None and not entry_sealed(keyring, entry):
        return "the redaction entry's seal does not verify"
    if args_hash is not None and entry.args_hash != args_hash:
        return "the redaction entry names another args hash"
    try:
        found = json.loads(text, object_pairs_hook=_once)
        kept = json.loads(entry.kept_json) if entry.kept_json else {}
    except (ValueError, RecursionError):
        return "a redaction marker that is not the text the redaction wrote"
    if not isinstance(found, dict) or found.get(MARK) != entry.redaction_id:
        return "the marker names another redaction"
    if not same_json({k: v for k, v in found.items() if k != MARK}, kept):
        return "the facts kept by the redaction were changed"
    return None


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each named once (a repeated key could show one value to a
    reader and another to a parser)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a repeated key")
    return obj
