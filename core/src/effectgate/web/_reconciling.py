"""What the inbox says after a reconcile that settled nothing (`gate.reconcile` returned None).

None means one of two things, told apart by the record read back: the provider could not tell
(the record still awaits reconciliation: it stays in the queue), or the provider never saw the key
and the record was released (a write runs again when its call is made again; an approval that had
ended before a late run reopened its record never runs again). Either way nothing is left to do
for the second one, and the page must not say it stays in the queue."""

from __future__ import annotations

from .._execution import exec_key
from ..gate import EffectGate

STILL_UNKNOWN = "The provider could not say; the record stays in the queue."
WRITE_RELEASED = (
    "The provider never saw it: the record was released and left the queue. The write runs again, "
    "under the same key, when its call is made again."
)
ENDED_RELEASED = (
    "The provider never saw it, and its approval had ended: the record was released and left the "
    "queue, and it never runs again."
)


def unsettled_message(gate: EffectGate, target: str) -> str:
    """The page's message for `target` (an approval id, or a write's idempotency key) when its
    reconcile returned None."""
    row = gate.store.get_approval(target)
    record = gate.store.get(exec_key(row) if row is not None else target)
    if record is not None and record.status == "needs_reconciliation":
        return STILL_UNKNOWN
    return WRITE_RELEASED if row is None else ENDED_RELEASED
