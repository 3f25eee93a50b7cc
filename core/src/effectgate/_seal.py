"""Seals: the gate's MAC over what decides, on every approval and decision row it writes.

A database row is read back before it decides anything (who may approve, how many must, what
runs). Anyone with write access to the database could edit a column on the way; the seal makes
that edit visible. It is an HMAC with the gate's keyring (domain-separated from grant tokens,
with a key id, so keys rotate), over the canonical JSON of the fields below. Mutable state that
the gate itself changes (status, token hash, times) is not sealed: what it may change is bounded
by the sealed fields and the signed grant token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .canonical import ENCODE, digest, hash_of_text, sha256_hex
from .errors import ForeignSeal
from .stores._dialect import REDACTED_PREFIX
from .stores.records import ApprovalRow, DecisionRow
from .tokens import Keyring

if TYPE_CHECKING:
    from .stores.protocol import Store

APPROVAL_FIELDS = (
    "id",
    "version",
    "grants",
    "session_id",
    "origin_message_id",
    "user_id",
    "agent_id",
    "tool",
    "effect",
    "subject_key",
    "args_hash",
    "approver_role",
    "approvals_required",
    "row_fingerprint",
    "policy_fingerprint",
)
DECISION_FIELDS = ("approval_id", "version", "grant_round", "approver_id", "role", "decision")
# a row's sealed fields as a tuple, in order, in one C call
_APPROVAL_VALUES = attrgetter(*APPROVAL_FIELDS)
_DECISION_VALUES = attrgetter(*DECISION_FIELDS)
_APPROVAL_INDEX = {f: i for i, f in enumerate(APPROVAL_FIELDS)}


def _body(values: Sequence[Any]) -> bytes:
    # The sealed fields are text and integers: their JSON array, compact and in order, is one
    # C-level encode (a value of another type still encodes, the same way on both sides).
    return ENCODE(values).encode("utf-8", "surrogatepass")


def seal_approval(keyring: Keyring, row: ApprovalRow, update: Mapping[str, Any] | None = None) -> str:
    """The seal of `row`, or of `row` as `update` (the values a write changes) leaves it."""
    values: Sequence[Any] = _APPROVAL_VALUES(row)
    if update and (changed := update.keys() & _APPROVAL_INDEX):  # most of a write is not sealed
        patched = list(values)
        for field in changed:
            patched[_APPROVAL_INDEX[field]] = update[field]
        values = patched
    return keyring.sign("approval", _body(values))


def approval_sealed(keyring: Keyring, row: ApprovalRow) -> bool:
    """The seal verifies over the row's sealed fields."""
    return _verifies(keyring, "approval", _APPROVAL_VALUES(row), row.seal)


def approval_intact(keyring: Keyring, row: ApprovalRow) -> bool:
    """The seal verifies and the stored arguments still hash to the sealed args hash."""
    return approval_sealed(keyring, row) and stored_args_hash(row.tool, row.args_json) == row.args_hash


def approval_verifies(keyring: Keyring, row: ApprovalRow) -> bool:
    """Whether the row's seal verifies and, unless `redact` erased them (they cannot be hashed
    again; the audit checks the redaction's own sealed entry), its arguments hash to it. A
    marker that is not JSON was never written by `redact`: an edit, as any other."""
    if row.args_json.startswith(REDACTED_PREFIX):
        return approval_sealed(keyring, row) and _json_text(row.args_json)
    return approval_intact(keyring, row)


def _json_text(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def seal_decision(keyring: Keyring, values: dict[str, Any]) -> str:
    return keyring.sign("decision", _body([values[f] for f in DECISION_FIELDS]))


def decision_intact(keyring: Keyring, row: DecisionRow) -> bool:
    return _verifies(keyring, "decision", _DECISION_VALUES(row), row.seal)


#: The decision that gives a grant back unpresented (`gate.release`, a cancelled `aapprove`): its
#: grant round is the one that minted the grant, so the grant's stored expiry (no seal covers it)
#: is not all that voids it; a later grant (a new round) is not touched.
RELEASE = "release"


def grant_released(keyring: Keyring, decisions: Sequence[DecisionRow], row: ApprovalRow) -> bool:
    """Whether the row's current grant (its version, the round that minted it) was given back:
    a sealed `release` decision among the version's `decisions` says so."""
    return any(
        d.decision == RELEASE
        and d.version == row.version
        and d.grant_round == row.grants - 1
        and decision_intact(keyring, d)
        for d in decisions
    )


def stored_args_hash(tool: str, args_json: str) -> str | None:
    """The args hash recomputed from the stored canonical text (the ledger stores arguments as
    their RFC 8785 text, so a stored row is hashed without parsing it; any other text, even the
    same JSON written differently, hashes differently: the row was not written by the gate)."""
    try:
        return hash_of_text(tool, args_json)
    except (ValueError, TypeError):
        return None


def seal_checker(keyring: Keyring, purpose: str) -> Callable[[Sequence[Any], Any], bool]:
    """A function of (values, seal): whether `seal` is the keyring's seal of `values` (the fields
    of `APPROVAL_FIELDS` or `DECISION_FIELDS`, in order) for `purpose`, "approval" or "decision":
    what the audit checks on every approval and decision it streams as tuples."""

    verifies = keyring.verifier(purpose)

    def sealed(values: Sequence[Any], seal: Any) -> bool:
        if not seal:
            return False
        try:
            return verifies(_body(values), seal)
        except (ValueError, TypeError):  # a value that does not encode
            return False

    return sealed


#: A recorded rule's seal row in `eg_rules` (kind "seal"): this prefix, the rule's fingerprint,
#: ":" and 16 hex digits of the seal's own hash, so a row inserted first (under a key the gate
#: cannot predict) never takes the place of the gate's seal, and seals of other keys fit beside it.
RULE_SEAL = "seal:"


def rule_seal(keyring: Keyring, kind: str, fingerprint: str) -> tuple[str, str, str]:
    """The seal row of the rule `fingerprint` of `kind` ("row" or "policy"), as `add_rules` takes
    it: the keyring's MAC of both, so the audit tells the gate's rules from rows inserted in the
    database (content addressing alone holds for any body)."""
    seal = keyring.sign("rule", f"{kind}|{fingerprint}".encode())
    return (f"{RULE_SEAL}{fingerprint}:{sha256_hex(seal.encode())[:16]}", "seal", seal)


def rule_sealed(verifies: Callable[[bytes, str], bool], seals: Sequence[str], kind: str, fp: str) -> bool:
    """Whether any of `seals` (the bodies of a rule's seal rows) is a seal of rule `fp` of `kind`
    under the keyring whose `verifier("rule")` is `verifies`."""
    return any(verifies(f"{kind}|{fp}".encode(), seal) for seal in seals)


def seals_by_rule(rows: Mapping[str, Any]) -> dict[str, list[str]]:
    """The seal rows of `store.rules()`, by the fingerprint of the rule each names."""
    out: dict[str, list[str]] = {}
    for key, row in rows.items():
        if row.kind == "seal" and key.startswith(RULE_SEAL):
            out.setdefault(key[len(RULE_SEAL) :].partition(":")[0], []).append(row.body_json)
    return out


def _verifies(keyring: Keyring, purpose: str, values: Sequence[Any], seal: str) -> bool:
    if not seal:
        return False
    try:
        return keyring.verifies(purpose, _body(values), seal)
    except (ValueError, TypeError):  # a value that does not encode
        return False


def foreign_key(keyring: Keyring, seal: str | None) -> str | None:
    """The key id a seal names when this keyring does not hold it (a keyring mismatch rather
    than an edited row), else None."""
    kid = seal.partition(".")[0] if isinstance(seal, str) else ""  # a blob an edit stored: none
    return kid if kid and not keyring.holds(kid) else None


def broken(keyring: Keyring, row: ApprovalRow, *, granted: bool = False) -> str:
    """Why a row does not verify, for the error: a keyring mismatch (a `ForeignSeal`), or an edit
    (a seal that fails under a key this keyring holds); `granted`: the row verifies but says
    pending while its sealed count of grants says it was granted (its status was edited)."""
    if granted and approval_intact(keyring, row):
        return f"its status says pending while its sealed count of grants is {row.grants}"
    kid = foreign_key(keyring, row.seal)
    if kid is not None:
        return ForeignSeal(kid, mismatch(kid))
    return "its seal or arguments hash does not verify"


def mismatch(kid: str) -> str:
    """What a record sealed under key `kid`, which this keyring does not hold, means and what to do."""
    return (
        f"keyring mismatch: the record is sealed with key {kid!r}, which this keyring does not hold, "
        "so it cannot be checked (most likely another keyring; a key id edited in the database "
        "looks the same, and `effectgate audit` with the ledger's keyring tells them apart). Use "
        "the ledger's keyring: set EFFECTGATE_KEYRING to it, or use the database's key file"
    )


def seal_rules(store: Store, keyring: Keyring, *, by: str, now: float | None = None) -> list[str]:
    """Seal the rule rows recorded without a seal (by a release before rule seals, for tools no
    gate of this one has used since), each as it stands, and record who did (a `rules_sealed`
    event): for an operator who has checked the ledger, since a seal vouches for what it covers.
    Only rows whose body hashes to their fingerprint are sealed. Returns their fingerprints."""
    if not isinstance(by, str) or not by.strip():
        raise ValueError("seal_rules needs `by`: who vouches for the rule rows (recorded)")
    rows, verifies = store.rules(), keyring.verifier("rule")
    seals = seals_by_rule(rows)
    unsealed = [
        (fp, row.kind)
        for fp, row in sorted(rows.items())
        if row.kind in ("row", "policy")
        and not rule_sealed(verifies, seals.get(fp, ()), row.kind, fp)
        and _body_digest(row.body_json) == fp
    ]
    if unsealed:
        with store.transaction() as conn:
            store.add_rules(conn, [rule_seal(keyring, kind, fp) for fp, kind in unsealed])
            detail = {"by": by, "fingerprints": [fp for fp, _ in unsealed]}
            store.append_events(
                conn,
                [{"at": time.time() if now is None else now, "kind": "rules_sealed", "detail_json": detail}],
            )
    return [fp for fp, _ in unsealed]


def _body_digest(text: str) -> str | None:
    try:
        return digest(json.loads(text))
    except (ValueError, TypeError, RecursionError):
        return None
