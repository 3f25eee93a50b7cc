"""An approved call whose run's outcome is unknown is settled, never asked for again.

The core answers a call whose approved run's outcome is unknown (its record `needs_reconciliation`:
the tool raised, or its lease lapsed and `recover()` found it) with `Refused("needs_reconciliation")`
(until round 17 it answered `Pending`, as if the grant still waited to run, and a step re-run from
its first line, by a sibling's answer or a fork or replay from the paused checkpoint, listed the
call as waiting again). Such a step's outcome is settled here as the `NeedsReconciliation` the run
raised, from the store's record for the approval's version, so the model is told what it was told
when the call ran (the outcome is unknown, a person will reconcile it) in the same message.
"""

from __future__ import annotations

from collections.abc import Sequence

from effectgate import EffectGate, Outcome, Refused
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
    if not isinstance(outcome, Refused) or outcome.code != "needs_reconciliation" or not outcome.approval_id:
        return None
    row = gate.store.get_approval(outcome.approval_id)
    if row is None:
        return None
    record = gate.store.get(exec_key(row))
    if record is None or record.status != "needs_reconciliation" or record.payload_hash != row.args_hash:
        return None
    reason = record.error or "the outcome of its run is unknown"
    return NeedsReconciliation(record.key, reason, provider_ref=record.provider_ref)
