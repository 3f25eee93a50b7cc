"""A late run's records after an erasure: erased as the call's other records were.

A run that lost its lease (`_failures.Failures.record_lease_lost`) may come back after its call ended (settled
"did not happen") and `redact` or `retain` erased it. Its execution, event and reopened record
carry the arguments, result and error in clear: written as they are, they would put the erased
personal values back into the ledger. `erase_late` erases them in the same transaction, with the
redaction that erased the call (its id, its facts) and a sealed entry per value, as `redact` does."""

from __future__ import annotations

import json
from typing import Any

from ._erasure import MARK, _check_arguments, _erase, entry_sealed
from ._holds import RedactionError, _event
from .stores._dialect import is_redacted
from .stores._redaction import call_id
from .stores.protocol import Store
from .tokens import Keyring


def erase_late(store: Store, conn: Any, keyring: Keyring, *, user_id: str, call: str, at: float) -> int:
    """Erase the values of call `call` (an approval id, or a write's idempotency key) written since
    its arguments were erased, recording a `redacted` event; the number of values erased (0 when
    the call was never erased). The caller holds the erasure lock (`chain.ERASURE_LOCK`) from the
    start of its transaction, as `redact` does: taken after its writes, it could deadlock with one."""
    rows = [t for t in store.redaction_targets(conn, user_id=user_id) if call_id(t) == call]
    entries = {(e.table_name, e.row_key, e.column_name): e for e in store.redacted(conn)}
    for t in rows:  # the call's erased arguments, as their sealed entry says (a forged one decides nothing)
        text, entry = t.values.get("args_json"), entries.get((t.table, t.key, "args_json"))
        if is_redacted(text) and entry is not None and entry_sealed(keyring, entry):
            try:  # the entry's seal holds, the marker text is the row's: parsed with care
                facts = json.loads(str(text))
            except (ValueError, RecursionError):
                continue
            if isinstance(facts, dict) and facts.pop(MARK, None) == entry.redaction_id:
                break
    else:  # a write settled "did not happen" recorded no arguments: its record's values were erased
        own = (t for t in rows if t.table in ("eg_idempotency", "eg_executions"))  # not a note listing it
        sealed = (entries.get((t.table, t.key, c)) for t in own for c in t.values)
        if (entry := next((e for e in sealed if e is not None and entry_sealed(keyring, e)), None)) is None:
            return 0
        facts = {}  # no facts of its arguments were kept: none are
    keep, fit = tuple(facts), []
    for t in rows:  # one whose arguments were edited is left to the audit: the run is recorded all the same
        try:
            _check_arguments([t])
        except RedactionError:
            continue
        fit.append(t)
    done, values = _erase(store, conn, keyring, fit, entry.redaction_id, keep, at, set(entries))
    if values:
        reason = "a run that lost its lease returned after its call was erased"
        detail = {
            "redaction_id": entry.redaction_id,
            "user_id": user_id,
            "by": "effectgate",
            "reason": reason,
        }
        store.append_events(
            conn, [_event("redacted", at, rows=done, values=values, keep=list(keep), **detail)]
        )
    return values
