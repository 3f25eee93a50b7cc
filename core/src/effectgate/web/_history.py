"""The decided history page's records: the last 200 decided approvals, each with its decisions
and its run, every one verified against the keyring before it is shown as anyone's. A render
reads those approvals' decisions and executions through their approval indexes (and the open
approvals), never a whole table: the page costs the same over a ledger of a million records.

The status column is not sealed: what a row shows as its status is what the append-only
executions and the sealed denials say (as in a subject's history, `Ledger.history`), and a
call that ran or was denied stays listed even when its column was edited back to 'pending', or
to a word that is no status (the inbox does not offer it either: it would be on no page). Such
a row is flagged, and so is one whose column claims a run or a denial (executed, failed,
denied) that neither the executions nor a sealed denial record: it is shown as what it is
(pending, or approved once granted). A card shows its status the same way
(`_display.card_status`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .._display import stored_json
from .._person import person
from .._seal import approval_verifies, decision_intact
from .._standing import said_status
from ..gate import EffectGate

DECIDED = ["executed", "failed", "denied", "expired", "rejected", "approved"]


def history_context(gate: EffectGate) -> dict[str, Any]:
    store = gate.store
    rows = store.approvals(status=DECIDED, limit=200)
    # pending, or a column edited to no status at all ('on_hold', ''): open work, not the history
    waiting = store.approvals(status_not=DECIDED)
    by_approval: dict[str, list[Any]] = defaultdict(list)
    with store.reading() as conn:  # the listed approvals' decisions and runs, not the whole ledger's
        ids = [r.id for r in (*rows, *waiting)]
        for d in store.decisions_of(conn, ids):
            if decision_intact(gate.keyring, d):  # a row inserted in the database is no one's decision
                by_approval[d.approval_id].append(d)
        ran = store.execution_outcomes(conn, ids)
        runs = store.executions_of(conn, ids)
    denied = {(d.approval_id, d.version) for ds in by_approval.values() for d in ds if d.decision == "deny"}
    rows = [r for r in waiting if r.id in ran or (r.id, r.version) in denied] + rows
    # flagged, as on their cards
    unverified = {r.id for r in rows if not approval_verifies(gate.keyring, r)}
    status = {
        r.id: said_status(r, ran.get(r.id), (r.id, r.version) in denied, r.id not in unverified) for r in rows
    }
    results = {e.approval_id: {"status": e.status, "result": stored_json(e.result_json)} for e in runs}
    edited = {r.id for r in rows if status[r.id] != r.status}
    return {
        "rows": rows,
        "shown_status": status,
        "edited": edited,
        "decisions": by_approval,
        "results": results,
        "unverified": unverified,
    }


def withheld(gate: EffectGate, approver_id: str, context: dict[str, Any]) -> str | None:
    """Why the gate refuses `approver_id` an approval of the pending card in `context` (from
    `_display.card_view`) whatever their role: "own-call" (they made the call and the policy does not
    allow self-approval) or "approved-already" (they approved this version: a second approver
    must be distinct); None when it does not. The card then offers only Deny, and says why."""
    card = context["card"]
    if person(approver_id) == person(card.user_id) and not gate.policy.self_approval:
        return "own-call"
    # as the gate counts them: this version's approvals in its first grant round (a pending version
    # was never granted) by a role that may decide it
    counted = gate.policy.role_satisfies
    me = person(approver_id)
    mine = [d for d in context["decisions"] if person(d.approver_id) == me and d.version == card.version]
    approved = [d for d in mine if d.decision == "approve" and d.grant_round == 0]
    return "approved-already" if any(counted(d.role, card.approver_role) for d in approved) else None
