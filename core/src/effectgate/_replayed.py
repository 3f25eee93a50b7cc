"""How an approved intent ended in the ledger, for `effectgate.replay`: one that never ran and
never can is not run in the sandbox (it would count in a later intent's `confirm` check), and one
still to run whose table row or policy changed would have its grant refused (`reclassified`)."""

from __future__ import annotations

from ._ledger import grant_live, past
from .effects import Policy
from .redact import entry_sealed
from .stores.protocol import Store
from .stores.records import ApprovalRow, RedactedRow
from .table import EffectTable
from .tokens import Keyring


def erasures(store: Store, keyring: Keyring | None) -> dict[tuple[str, str, str], RedactedRow]:
    """The redaction entries by (table, row key, column), the last of a key's; with `keyring`
    only those whose seal verifies (one inserted in the database after a sealed one would hide
    it, and the erased approval would read as tampered)."""
    with store.reading() as conn:  # the ledger is only read
        rows = store.redacted(conn)
    return {
        (e.table_name, e.row_key, e.column_name): e
        for e in rows
        if keyring is None or entry_sealed(keyring, e)
    }


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
