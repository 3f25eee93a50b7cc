"""How an approved intent ended in the ledger, for `effectgate.replay`: one that never ran and
never can is not run in the sandbox (it would count in a later intent's `confirm` check), and one
still to run whose table row or policy changed would have its grant refused (`reclassified`)."""

from __future__ import annotations

from ._ledger import grant_live, past
from .effects import Policy
from .stores.protocol import Store
from .stores.records import ApprovalRow
from .table import EffectTable


def never_run(store: Store, rows: list[ApprovalRow], ran: set[str]) -> set[str]:
    """The approved intents that never ran and never can: approved, no grant presented nor
    execution recorded, the grant lapsed and the approval's deadline past (on the ledger's clock)."""
    now = store.clock.now()
    lapsed = [
        r
        for r in rows
        if r.status == "approved"
        and r.id not in ran
        and r.token_used_at is None
        and not grant_live(r.token_expires_at, now)
        and past(r.expires_at, now)
    ]
    if not lapsed:
        return set()
    with store.reading() as conn:  # the ledger is only read
        return {r.id for r in lapsed if not store.grant_spent(conn, r.id, r.version)}


def stale(row: ApprovalRow, table: EffectTable, policy: Policy) -> str | None:
    """Why the gate would now refuse the grant of an approved call still to run, as `execute`
    does (`Ledger.bar`): its table row or the policy changed since it was proposed (a refactor that
    moved the tool's function changes its row), or None."""
    spec = table.get(str(row.tool))
    if spec is not None and spec.fingerprint != row.row_fingerprint:
        return "reclassified: its table row changed since it was proposed; its grant would be refused"
    if spec is not None and policy.fingerprint != row.policy_fingerprint:
        return "reclassified: the policy changed since it was proposed; its grant would be refused"
    return None  # a tool gone from the table: the sandbox's proposal refuses it
