"""A resume's decisions: bound to the calls the run paused on, applied through the gate once, and
told to the model.

`bind` first binds every decision to the call it is filed under (`effectgate.adapter.bind_decision`):
a grant for another approval, or for a version the approval has moved past, raises
`DecisionMismatch` before anything runs. `apply_decisions` then records denials and executes
approved calls through the gate (once: a second resume gets the stored result; a denial that comes
after the call ran or closed gets how it ended, and the others still apply). `GatedAgent.resume`
continues the run with `agent.run(..., reset=False)`, its task the `continuation`: how each call
ended. A model that issues the approved call again is matched by the stable key (session, origin
message, tool, subject) and the args hash, and gets the stored result: one effect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from effectgate import Approver, EffectGate, Executed, Grant, Outcome, Pending, Refused
from effectgate._execution import exec_key
from effectgate.adapter import (
    DecisionMismatch,
    Paused,
    bind_decision,
    check_denial_reason,
    unknown_outcome_of,
    verify_state,
)
from effectgate.errors import (
    AlreadyDecided,
    ApprovalError,
    ApprovalExpired,
    LeaseLost,
    NeedsReconciliation,
    PolicyViolation,
    TokenError,
    WrongApprover,
)
from effectgate.flow import NotStarted
from effectgate.outcomes import TAMPERED_WARNING, Card, RefusalCode

from ._native import own_error
from ._outcomes import AWAITING, AwaitingApproval


@dataclass(frozen=True)
class Approve:
    """Run the approved call with this grant (from `gate.approve` or `effectgate approve`)."""

    grant: Grant | str


@dataclass(frozen=True)
class Deny:
    approver: Approver
    reason: str


Decision = Approve | Deny


def bind(gate: EffectGate, awaiting: AwaitingApproval, decisions: Mapping[str, Decision]) -> None:
    """Every decision must answer a call this run paused on, at the version and args hash it
    paused on; an approval carries a grant for exactly that call; a denial has a reason and
    an approver the call's role allows (`PolicyViolation`, `WrongApprover`, as `gate.deny`
    would raise), signed by the gate's keyring (`TokenError`: a corrupted or foreign grant is the
    caller's error, never told to the model as a denial). Checked for all decisions before any of
    them is applied: a mismatch raises `DecisionMismatch` and nothing runs."""
    verify_state(gate, AWAITING, checked(awaiting, decisions).signed_fields(), awaiting.signature)
    paused = {p.approval_id: p for p in awaiting.paused}
    for approval_id, decision in decisions.items():
        at = paused.get(approval_id)
        if at is None:
            raise DecisionMismatch(
                str(approval_id), f"this run did not pause on approval {approval_id!r}; nothing ran"
            )
        if isinstance(decision, Approve):  # a grant the keyring did not make: TokenError, not "denied"
            gate.keyring.verify(bind_decision(gate, at, _token(decision)), args_hash=at.args_hash)
        elif not isinstance(decision, Deny):
            raise DecisionMismatch(at.approval_id, f"a decision is Approve or Deny, not {decision!r}")
        else:
            _check_denial(decision)
            card = gate.card(at.approval_id)
            if card.status in ("pending", "approved") and (card.version, card.args_hash) != (
                at.version,
                at.args_hash,
            ):
                raise DecisionMismatch(
                    at.approval_id,
                    f"approval {at.approval_id} is at version {card.version} now; the run paused "
                    f"on version {at.version}: decide the current card again",
                )
            # what gate.deny checks, checked here too: a denial refused after an approved
            # sibling had run would leave the resume half applied
            if not decision.reason or not decision.reason.strip():
                raise PolicyViolation("a denial needs a reason the model can be told")
            if card.status in ("pending", "approved") and not gate.policy.role_satisfies(
                decision.approver.role, card.approver_role
            ):
                raise WrongApprover(
                    at.approval_id,
                    f"{card.tool} needs role {card.approver_role}; {decision.approver.id} holds "
                    f"{decision.approver.role}",
                )


def checked(awaiting: object, decisions: object) -> AwaitingApproval:
    """`awaiting`, or `TypeError` when it is not an `AwaitingApproval` (a stored `to_dict()`) or
    `decisions` is not a mapping: before anything is read or decided."""
    if not isinstance(awaiting, AwaitingApproval):
        raise TypeError(
            f"resume takes the AwaitingApproval the run returned (got {type(awaiting).__name__}); "
            "read a stored one back with AwaitingApproval.from_dict(data, gate)"
        )
    if not isinstance(decisions, Mapping):
        raise TypeError(
            f"decisions must be a mapping {{approval_id: Approve | Deny}}, not {type(decisions).__name__}"
        )
    return awaiting


def _check_denial(decision: Deny) -> None:
    """What `gate.deny` refuses before it reads a row, refused here for every denial before any
    is applied (a later one raising would leave the earlier ones recorded): `TypeError` for an
    approver or reason that is not one, `PolicyViolation` for a reason no record may hold."""
    if not isinstance(decision.approver, Approver):
        raise TypeError(f"Deny's approver must be an Approver (got {type(decision.approver).__name__})")
    if not isinstance(decision.reason, str):
        raise TypeError(f"a denial reason must be text (got {type(decision.reason).__name__})")
    check_denial_reason(decision.reason)  # as `gate.deny` checks it


def apply_decisions(
    gate: EffectGate,
    awaiting: AwaitingApproval,
    decisions: Mapping[str, Decision],
    *,
    agent_id: str | None = None,
) -> dict[str, Outcome]:
    """Apply decisions through the gate: execute approved calls (once), deny the rest named.
    Every decision is bound to its call first (see `bind`); denials are recorded before any
    approved call runs, so a denial the gate still refuses (it just expired) runs nothing. With
    `agent_id`, a record made by another gated agent (its signed `agent_id`) is refused first
    (`DecisionMismatch`): it is resumed with the agent it paused in."""
    if agent_id is not None and checked(awaiting, decisions).agent_id and awaiting.agent_id != agent_id:
        first = awaiting.paused[0].approval_id if awaiting.paused else ""
        raise DecisionMismatch(
            first,
            f"this run paused in agent {awaiting.agent_id!r}, not {agent_id!r}: resume it with the "
            "GatedAgent it paused in; nothing ran",
        )
    bind(gate, awaiting, decisions)
    paused = {p.approval_id: p for p in awaiting.paused}
    named = [(p, decisions[p.approval_id]) for p in awaiting.pending if p.approval_id in decisions]
    done: dict[str, Outcome] = {}
    for pending, decision in named:
        if isinstance(decision, Deny):
            done[pending.approval_id] = _deny(gate, paused[pending.approval_id], decision)
    for pending, decision in named:
        if isinstance(decision, Approve):
            done[pending.approval_id] = _execute(gate, pending, decision)
    return {p.approval_id: done[p.approval_id] for p, _ in named}


#: how a refused grant is reported (any other refusal: "denied")
_TOKEN_REFUSALS: dict[str, RefusalCode] = {"expired": "expired", "used": "failed"}


def _execute(gate: EffectGate, pending: Pending, decision: Approve) -> Outcome:
    stored = gate.result(pending.approval_id)
    if stored is not None:
        return stored
    tool, approval_id = pending.card.tool, pending.approval_id
    try:
        return gate.execute(_token(decision))
    except TokenError as exc:  # a denial only if it says so: not an expired grant, nor a spent one
        if exc.reason == "used":  # another resume ran it or runs it now, or it ran and failed
            ran = _ran(gate, approval_id, spent=True)
            if ran is not None:
                return ran
        code = _TOKEN_REFUSALS.get(exc.reason, "denied")
        return Refused(code=code, message=str(exc), tool=tool, approval_id=approval_id)
    except ApprovalError as exc:
        return Refused(code="denied", message=str(exc), tool=tool, approval_id=approval_id)
    except (NeedsReconciliation, LeaseLost) as exc:  # recorded; the resume goes on with the others
        message = f"the outcome is unknown ({exc}); a person will reconcile it"
        return Refused(code="needs_reconciliation", message=message, tool=tool, approval_id=approval_id)
    except Exception as exc:
        spec = gate.table.get(tool)
        if spec is None or not isinstance(exc, (NotStarted, *spec.definite_failures)):
            raise  # not the tool's definite failure (the store, say): the resume can be tried again
        own = own_error(exc)
        message = f"{tool} failed: {type(own).__name__}: {own}"  # nothing ran; the gate recorded it
        return Refused(code="failed", message=message, tool=tool, approval_id=approval_id)


def _ran(gate: EffectGate, approval_id: str, *, spent: bool) -> Outcome | None:
    """What the approval's execution record (not its status column, which no seal covers) says of
    a call that closed or whose grant was presented (`spent`): its stored result, its unknown
    outcome, or `Refused("in_progress")` while a run holds it or, spent, may be starting (it may
    have run); None when it failed (nothing happened) or, not spent, never started."""
    stored = gate.result(approval_id)
    if stored is not None:
        return stored
    unknown = unknown_outcome_of(gate, approval_id)
    if unknown is not None:
        return unknown
    row = gate.store.get_approval(approval_id)
    if row is None:
        return None
    record = gate.store.get(exec_key(row))  # a failed one (for these arguments): nothing happened
    failed = record is not None and record.status == "failed" and record.payload_hash == row.args_hash
    if failed or (record is None and not spent):
        return None
    message = f"{row.tool} was approved; another resume started it and it may be running now"
    return Refused(code="in_progress", message=message, tool=row.tool, approval_id=approval_id)


def _deny(gate: EffectGate, paused: Paused, decision: Deny) -> Outcome:
    """Record the denial; one that comes too late (denied before, ran, closed) is answered by
    `_closed` from the verified record and the stored result, never from the status column."""
    try:
        return gate.deny(
            paused.approval_id, approver=decision.approver, reason=decision.reason, version=paused.version
        )
    except AlreadyDecided as exc:  # the record verified: it ran, or closed, before this denial
        return _closed(gate, paused.approval_id, exc.status)
    except ApprovalExpired:
        return _closed(gate, paused.approval_id, "expired")


def _closed(gate: EffectGate, approval_id: str, status: str) -> Outcome:
    """How an approval a denial came too late for ended: its stored result if it ran, else a
    refusal saying where it stands. The resume's other decisions still apply; nothing runs."""
    ran = _ran(gate, approval_id, spent=False)
    if ran is not None:
        return ran
    card = gate.card(approval_id)
    if status == "denied":
        message = f"{card.tool} was denied: {card.reason}"
        return Refused(code="denied", message=message, tool=card.tool, approval_id=approval_id)
    if status == "expired":
        message = f"{card.tool} did not run: its approval expired"
        return Refused(code="expired", message=message, tool=card.tool, approval_id=approval_id)
    if status == "failed":
        message = f"{card.tool} did not run: it failed when it was approved"
        return Refused(code="failed", message=message, tool=card.tool, approval_id=approval_id)
    message = f"{card.tool} was approved and may have run ({status}); the denial came too late"
    return Refused(code="needs_reconciliation", message=message, tool=card.tool, approval_id=approval_id)


def _token(decision: Approve) -> str:
    return decision.grant.token if isinstance(decision.grant, Grant) else decision.grant


def _shown_args(card: Card) -> str:
    """A call's arguments for the model: withheld when its stored record does not verify (a
    column edited into something else: it is not what the call was, and must not stop the rest)."""
    if TAMPERED_WARNING in card.warnings or not isinstance(card.args, Mapping):
        return "arguments not shown: its stored record does not verify"
    return json.dumps(dict(card.args), sort_keys=True, default=str)


def continuation(awaiting: AwaitingApproval, done: Mapping[str, Outcome]) -> str:
    """The task text that continues a run: how each decided call ended, and what still waits."""
    lines = ["effectgate: the calls that waited for approval were decided."]
    for pending in awaiting.pending:
        card = pending.card
        call = f"{card.tool}({_shown_args(card)})"
        outcome = done.get(pending.approval_id)
        if isinstance(outcome, Executed):
            lines.append(
                f"- {call} was approved and has run; result: {outcome.for_model()}. Do not call it again."
            )
        elif isinstance(outcome, Refused) and outcome.code in ("needs_reconciliation", "in_progress"):
            lines.append(
                f"- {call} was approved; it may have run: {outcome.for_model()} Do not call it again."
            )
        elif outcome is not None:
            lines.append(
                f"- {call} did not run: {outcome.for_model()} Do not call it again for this request."
            )
        else:
            lines.append(f"- {call} is still waiting for approval (approval {pending.approval_id}).")
    lines.append("Continue with the user's request.")
    return "\n".join(lines)
