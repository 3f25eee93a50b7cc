"""What every framework adapter needs, defined once: the errors an application meets, the "is this
call gated" test, the check that binds a decision to the approval it was paused on, and signed
paused state.

An adapter wraps a framework's tool or node and translates payloads; the rules live here and in
the gate. Each adapter calls these functions, so a decision is bound the same way in LangGraph,
the OpenAI Agents SDK and smolagents:

- `bind_decision(gate, paused, token)`: the grant must be for the approval the decision is filed
  under, at the version and args hash the run paused on, and that approval must still be at that
  version and hash. Anything else is a `DecisionMismatch` and nothing runs.
- `sign_state` / `verify_state`: anything an adapter keeps outside the process to decide or to
  build identity on resume (a paused-run record, a run context's identity, an interrupt payload)
  is signed with the gate's keyring, and refused (`TamperedState`) when it comes back changed.
- `native_approver` / `rejecting_approver`: who a framework's own approve or reject (OpenAI's
  `state.approve/reject`, langchain's HITL decisions) is recorded as: the approver the
  application configured (never the model or stored state), and for a reject without one whose
  role may decide, a system identity holding the row's role (a reject raises no privileges).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._answers import unknown_outcome
from ._decisions import check_denial_reason
from ._execution import exec_key
from .canonical import canonical_json
from .context import Approver
from .errors import EffectGateError, TokenError, UnknownApproval
from .gate import EffectGate
from .outcomes import Pending, Refused
from .tokens import Keyring, TokenClaims

#: What a wrapper does with a tool the effect table has no row for (or the agent may not call):
#: "raise" when wrapping (the default), or "refuse" every call of it at call time.
Unknown = Literal["raise", "refuse"]


class UnknownTool(EffectGateError, LookupError):
    """A tool to wrap has no row in the effect table, or the agent may not call it."""


class MissingIdentity(EffectGateError, LookupError):
    """A run was started without something the gate keys on (session, user message, user).
    The application's fault, not the model's: the run stops instead of guessing."""


class DecisionMismatch(EffectGateError, ValueError):
    """A decision does not belong to the approval it is filed under (a grant for another approval
    or version), or the approval moved on since the run paused. Nothing ran."""

    def __init__(self, approval_id: str, message: str) -> None:
        self.approval_id = approval_id
        super().__init__(message)


class TamperedState(EffectGateError):
    """Paused state read back from outside the process (a saved record, a run snapshot's
    identity, an interrupt payload) does not verify against the gate's keyring. Nothing ran."""


def is_gated(gate: EffectGate, name: str) -> bool:
    """True when the table has a row for `name` of a class the gate's policy gates."""
    spec = gate.table.get(name)
    return spec is not None and gate.policy.gates(spec.effect)


def check_wrappable(gate: EffectGate, *, agent_id: str, name: str, unknown: Unknown) -> bool:
    """Whether `name` is a row `agent_id` may call. A tool that is not raises `UnknownTool`
    unless `unknown="refuse"` (then every call of it is refused and recorded by the gate)."""
    if unknown not in ("raise", "refuse"):
        raise ValueError(f"unknown must be 'raise' or 'refuse', not {unknown!r}")
    spec = gate.table.get(name)
    known = spec is not None and gate.table.allowed(agent_id, name)
    if not known and unknown == "raise":
        why = "is not in the effect table" if spec is None else f"is not allowed for {agent_id!r}"
        raise UnknownTool(
            f"tool {name!r} {why}: add a row for it, or wrap with unknown='refuse' to have the "
            "model told at call time"
        )
    return known


def missing_identity(name: str, where: str) -> MissingIdentity:
    """The error for one missing identity value, saying exactly where to put it."""
    return MissingIdentity(
        f"the run has no {name}: {where}. The gate keys every call on the session, the id of the "
        "user message the run answers, and the user; only the application knows them"
    )


@dataclass(frozen=True)
class Paused:
    """What a run paused on for one gated call: the approval, its version and args hash."""

    approval_id: str
    version: int
    args_hash: str

    @classmethod
    def of(cls, pending: Pending) -> Paused:
        return cls(pending.approval_id, pending.version, pending.card.args_hash)

    def to_dict(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "version": self.version, "args_hash": self.args_hash}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Paused:
        return cls(str(data["approval_id"]), int(data["version"]), str(data["args_hash"]))


def bind_token(paused: Paused, token: str) -> TokenClaims:
    """Check that `token` is a grant for the approval and version the run paused on (read from
    the token, before anything is looked up). Raises `DecisionMismatch` otherwise."""
    try:
        claims = Keyring.read(token)
    except TokenError as exc:
        raise DecisionMismatch(paused.approval_id, f"the grant was refused: {exc}") from exc
    if claims.approval_id != paused.approval_id:
        raise DecisionMismatch(
            paused.approval_id,
            f"the grant is for approval {claims.approval_id}, not {paused.approval_id}: "
            "a decision runs only the call it is filed under",
        )
    if claims.version != paused.version:
        raise DecisionMismatch(
            paused.approval_id,
            f"the grant is for version {claims.version}; the run paused on version {paused.version}",
        )
    return claims


def bind_decision(gate: EffectGate, paused: Paused, token: str) -> TokenClaims:
    """Check that `token` is a grant for exactly what the run paused on (`bind_token`), and that
    the approval is still there: same id, same version, same args hash. Raises
    `DecisionMismatch` (nothing runs) otherwise; the gate checks the token itself when it runs."""
    claims = bind_token(paused, token)
    try:
        card = gate.card(paused.approval_id)
    except UnknownApproval as exc:
        raise DecisionMismatch(paused.approval_id, str(exc)) from exc
    if card.version != paused.version or card.args_hash != paused.args_hash:
        raise DecisionMismatch(
            paused.approval_id,
            f"approval {paused.approval_id} is at version {card.version} now; the run paused on "
            f"version {paused.version} with other arguments: decide the current card again",
        )
    return claims


def _body(data: Mapping[str, Any]) -> bytes:
    return canonical_json(dict(data))


def sign_state(gate: EffectGate, purpose: str, data: Mapping[str, Any]) -> str:
    """The keyring's MAC over canonical `data` for one purpose (e.g. "smolagents.awaiting")."""
    return gate.keyring.sign(f"adapter.{purpose}", _body(data))


def verify_state(gate: EffectGate, purpose: str, data: Mapping[str, Any], signature: object) -> None:
    """Raise `TamperedState` unless `signature` is `sign_state(gate, purpose, data)`."""
    if not isinstance(signature, str) or not signature:
        raise TamperedState(f"the {purpose} record carries no signature: it was not saved by effectgate")
    try:
        gate.keyring.verify_signature(f"adapter.{purpose}", _body(data), signature)
    except (TokenError, ValueError, TypeError) as exc:
        raise TamperedState(
            f"the {purpose} record does not verify: it was changed after it was saved "
            "(or saved under another keyring). Nothing ran"
        ) from exc


#: Who a framework's own approve comes from: a fixed approver, or a function of the run (the
#: adapter says which arguments: OpenAI's run context; LangGraph's config and runtime context).
NativeApprover = Approver | Callable[..., Approver | None]


def native_approver(setting: NativeApprover | None, *run: Any) -> Approver | None:
    """The application's approver for this run (None when none is configured); TypeError when
    the configured function answers something else."""
    if setting is None or isinstance(setting, Approver):
        return setting
    chosen = setting(*run)
    if chosen is not None and not isinstance(chosen, Approver):
        raise TypeError(f"native_approver must return an Approver or None, not {type(chosen).__name__}")
    return chosen


def rejecting_approver(gate: EffectGate, chosen: Approver | None, role: str, *, system: str) -> Approver:
    """Who a framework's own reject is recorded as: `chosen` when their role may decide a call
    needing `role`, else the system identity `system` holding `role`."""
    if chosen is not None and gate.policy.role_satisfies(chosen.role, role):
        return chosen
    return Approver(system, role)


def unknown_outcome_of(gate: EffectGate, approval_id: str) -> Refused | None:
    """The answer to a call of `approval_id` whose grant ran and whose run's outcome is unknown
    (`Refused("needs_reconciliation")`, as a replay of its message is answered), else None: what
    an adapter tells the model of a call another resume presented first. Blocking (reads the store)."""
    row = gate.store.get_approval(approval_id)
    return unknown_outcome(row, gate.store.get(exec_key(row))) if row is not None else None


__all__ = [
    "DecisionMismatch",
    "MissingIdentity",
    "NativeApprover",
    "Paused",
    "TamperedState",
    "Unknown",
    "UnknownTool",
    "bind_decision",
    "bind_token",
    "check_denial_reason",
    "check_wrappable",
    "is_gated",
    "missing_identity",
    "native_approver",
    "rejecting_approver",
    "sign_state",
    "unknown_outcome_of",
    "verify_state",
]
