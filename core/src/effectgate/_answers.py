"""What a proposal answers beyond its record: the agent's answer in shadow mode, and the INFO
line for a gated call's outcome (logged on "effectgate._proposals")."""

from __future__ import annotations

from ._logging import logger
from .context import CallContext
from .outcomes import Outcome, Pending, Refused
from .stores.base import IdempotencyRecord
from .stores.records import ApprovalRow
from .table import ToolSpec

log = logger("effectgate._proposals")

#: On the card of every call proposed in shadow mode.
SHADOW_NOTE = "shadow mode: recorded for review; this call never runs, whatever is decided"


def shadowed(spec: ToolSpec, outcome: Outcome) -> Outcome:
    """What the agent is told for a call in shadow mode: recorded for review, not executed, and
    never paused for, whatever the reviewers decide (a refusal other than a decision stands)."""
    if isinstance(outcome, Refused) and outcome.code not in ("denied", "expired"):
        return outcome
    approval_id = getattr(outcome, "approval_id", None)
    return Refused(
        code="shadow",
        message=(
            f"{spec.name} is in shadow mode: the call was recorded for review (approval "
            f"{approval_id}) and has not run; it will not run. Do not call it again for this request."
        ),
        tool=spec.name,
        approval_id=approval_id,
    )


def log_outcome(outcome: Outcome, spec: ToolSpec, ctx: CallContext, edited_by: str | None) -> None:
    """One INFO line for a gated call's outcome (its record is in the ledger); never its arguments."""
    pending = outcome if isinstance(outcome, Pending) else None
    if isinstance(outcome, Refused):
        what = f"refused ({outcome.code})"
    elif pending is not None:
        what = "replayed" if pending.replay else "proposed" if pending.version == 1 else "amended"
    else:
        what = "replayed (executed)"
    role = f" role={pending.card.approver_role} status={pending.status}" if pending else ""
    editor = f" edited_by={edited_by!r}" if edited_by and pending and not pending.replay else ""
    log.info(
        "gated call %s: approval=%s version=%s tool=%s%s agent=%r session=%r%s",
        what,
        getattr(outcome, "approval_id", None),
        getattr(outcome, "version", None),
        spec.name,
        role,
        ctx.agent_id,
        ctx.session_id,
        editor,
    )


def unknown_outcome(row: ApprovalRow, record: IdempotencyRecord | None) -> Refused | None:
    """What a call of `row` is answered once its grant ran and the run's outcome is unknown (the
    execution `record` of its version needs reconciliation): never `Pending` (it may have run),
    never a plain refusal (`for_model` words it "Outcome unknown"). None otherwise."""
    if record is None or record.status != "needs_reconciliation" or record.payload_hash != row.args_hash:
        return None
    message = f"{row.tool} needs reconciliation: its outcome is unknown ({record.error}), so it may "
    message += "have happened; a person will reconcile it. Do not call it again."
    return Refused(code="needs_reconciliation", message=message, tool=row.tool, approval_id=row.id)
