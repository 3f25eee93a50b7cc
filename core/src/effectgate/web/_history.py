"""The decided history page's records: the last 200 decided approvals, each with its decisions
and its run, every one verified against the keyring before it is shown as anyone's."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .._display import stored_json
from .._seal import approval_verifies, decision_intact
from ..gate import EffectGate


def history_context(gate: EffectGate) -> dict[str, Any]:
    decided = ["executed", "failed", "denied", "expired", "rejected", "approved"]
    rows = gate.store.approvals(status=decided, limit=200)
    by_approval: dict[str, list[Any]] = defaultdict(list)
    for d in gate.store.all_decisions():
        if decision_intact(gate.keyring, d):  # a row inserted in the database is no one's decision
            by_approval[d.approval_id].append(d)
    results = {
        e.approval_id: {"status": e.status, "result": stored_json(e.result_json)}
        for e in gate.store.executions()
        if e.approval_id
    }
    # flagged, as on their cards
    unverified = {r.id for r in rows if not approval_verifies(gate.keyring, r)}
    return {"rows": rows, "decisions": by_approval, "results": results, "unverified": unverified}
