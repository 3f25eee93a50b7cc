"""The kept facts of an erased approval, checked before a business check counts them: a marker
whose facts (amount, currency) no sealed redaction entry backs was edited in the database (the
audit's `redaction_forged`), and its row does not verify (`Ledger.history`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .stores._dialect import is_redacted
from .stores.protocol import Store
from .stores.records import ApprovalRow
from .tokens import Keyring


def forged(store: Store, conn: Any, keyring: Keyring, rows: Sequence[ApprovalRow]) -> set[str]:
    """The ids of `rows` whose erased arguments do not match their sealed redaction entry."""
    marked = [r for r in rows if is_redacted(r.args_json)]
    if not marked:
        return set()
    from ._audit_rows import marker_problem  # imports `redact`, which needs the gate's modules

    ids = {r.id for r in marked}
    erased = {
        e.row_key: e
        for e in store.redacted(conn)
        if e.table_name == "eg_approvals" and e.column_name == "args_json" and e.row_key in ids
    }
    return {r.id for r in marked if marker_problem(erased.get(r.id), keyring, r.args_json, r.args_hash)}
