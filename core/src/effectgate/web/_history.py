"""The decided history page's records: the last 200 decided approvals, each with its decisions
and its run, every one verified against the keyring before it is shown as anyone's.

The status column is not sealed: what a row shows as its status is what the append-only
executions and the sealed denials say (as in a subject's history, `Ledger.history`), and a
call that ran or was denied stays listed even when its column was edited back to 'pending'
(the inbox does not offer it either: it would be on no page). Such a row is flagged."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .._display import stored_json
from .._ledger import RAN_STATUS
from .._seal import approval_verifies, decision_intact
from ..gate import EffectGate

DECIDED = ["executed", "failed", "denied", "expired", "rejected", "approved"]
# what the executions (and a grant presented) say an approval's status is, whatever its column says
_RAN = {**RAN_STATUS, "failed": "failed"}


def history_context(gate: EffectGate) -> dict[str, Any]:
    store = gate.store
    rows = store.approvals(status=DECIDED, limit=200)
    by_approval: dict[str, list[Any]] = defaultdict(list)
    for d in store.all_decisions():
        if decision_intact(gate.keyring, d):  # a row inserted in the database is no one's decision
            by_approval[d.approval_id].append(d)
    denied = {(d.approval_id, d.version) for ds in by_approval.values() for d in ds if d.decision == "deny"}
    waiting = store.approvals(status="pending")
    with store.reading() as conn:
        ran = store.execution_outcomes(conn, [r.id for r in (*rows, *waiting)])
    rows = [r for r in waiting if r.id in ran or (r.id, r.version) in denied] + rows
    status = {
        r.id: _RAN.get(ran.get(r.id, ""), "denied" if (r.id, r.version) in denied else r.status) for r in rows
    }
    results = {
        e.approval_id: {"status": e.status, "result": stored_json(e.result_json)}
        for e in store.executions()
        if e.approval_id
    }
    # flagged, as on their cards
    unverified = {r.id for r in rows if not approval_verifies(gate.keyring, r)}
    edited = {r.id for r in rows if status[r.id] != r.status}
    return {
        "rows": rows,
        "shown_status": status,
        "edited": edited,
        "decisions": by_approval,
        "results": results,
        "unverified": unverified,
    }
