"""An approved call whose run's outcome is unknown is settled, never asked for again.

The core answers a call whose approval is "approved" with `Pending` (a grant waits to run), also
once that grant was presented and the run's outcome is unknown (its record `needs_reconciliation`:
the tool raised, or its lease lapsed and `recover()` found it). A step re-run from its first line
(a sibling's answer, a fork or replay from the paused checkpoint) would then list the call as
waiting again: a reviewer is asked to decide a call that may have run, a deny is refused (the
approval is executing), a HITL answer by position is refused because its pause showed other
calls, and the step never settles. The store's record for the approval's version says how the run
ended; an unknown one is settled here as the `NeedsReconciliation` the run raised, so the model is
told what it was told when the call ran: the outcome is unknown, a person will reconcile it.
"""

from __future__ import annotations

from collections.abc import Sequence

from effectgate import EffectGate, Outcome, Pending
from effectgate._execution import exec_key
from effectgate.errors import NeedsReconciliation


def settle_unknown(gate: EffectGate, outcomes: Sequence[Outcome]) -> list[Outcome | BaseException]:
    """`outcomes` with each approved call whose run needs reconciliation replaced by its
    `NeedsReconciliation` (store work: run it in a flow step, `flow.done`)."""
    settled: list[Outcome | BaseException] = []
    for outcome in outcomes:
        settled.append(_unknown(gate, outcome) or outcome)
    return settled


def _unknown(gate: EffectGate, outcome: Outcome) -> NeedsReconciliation | None:
    if not isinstance(outcome, Pending) or outcome.status != "approved":
        return None
    row = gate.store.get_approval(outcome.approval_id)
    if row is None or row.version != outcome.version:
        return None
    record = gate.store.get(exec_key(row))
    if record is None or record.status != "needs_reconciliation" or record.payload_hash != row.args_hash:
        return None
    reason = record.error or "the outcome of its run is unknown"
    return NeedsReconciliation(record.key, reason, provider_ref=record.provider_ref)
