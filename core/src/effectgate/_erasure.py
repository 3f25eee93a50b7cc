"""How an erasure pass writes (`effectgate.redact`'s `redact` and `retain`, and a late run's
records: `_late_erasure`): the marker that replaces a personal value and the facts it keeps, the
sealed `eg_redacted` entry that records each erased value, and the checks a pass makes before it
writes anything (its `keep`, the stored arguments' hashes, which calls are open)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._commitments import commitment
from ._deadline import for_erasure
from ._holds import RedactionError
from ._seal import stored_args_hash
from .canonical import canonical_json
from .effects import Policy
from .errors import TokenError
from .stores._dialect import is_redacted
from .stores._redaction import Target, is_open
from .stores.protocol import Store
from .stores.records import RedactedRow
from .tokens import Keyring

#: What an erased event detail keeps: the approval chain it records (who edited or approved a
#: call, in what role, and the args hash an amendment replaced), kept as decisions keep it; and
#: where an adapter's pause was answered (a LangGraph interrupt's id and answer slot: the task's
#: later answers are matched by them once the calls it showed are closed and erased).
EVENT_FACTS = ("approver", "edited_by", "previous_hash", "role", "interrupt_id", "slot")
MARK = "$redacted"
ENTRY = "redaction"  # the keyring purpose of an eg_redacted entry's seal


def marker(redaction_id: str, facts: Mapping[str, Any] | None = None) -> str:
    """The text that replaces an erased value (compact, so it starts with `REDACTED_PREFIX`)."""
    return json.dumps({MARK: redaction_id, **dict(sorted((facts or {}).items()))}, separators=(",", ":"))


def facts_of(args_json: str, keep: Sequence[str]) -> dict[str, Any]:
    """The top-level arguments named in `keep` (a marker's own facts when already redacted: text
    that starts like one, not any object with a `$redacted` key, whose other values would stay)."""
    try:
        args = json.loads(args_json)
    except ValueError:
        return {}
    if not isinstance(args, dict):
        return {}
    if MARK in args and is_redacted(args_json):
        return {k: v for k, v in args.items() if k != MARK}
    return {k: args[k] for k in keep if k in args}


def _entry_body(e: Mapping[str, Any]) -> bytes:
    return canonical_json(
        [
            e["redaction_id"],
            e["table_name"],
            e["row_key"],
            e["column_name"],
            e["commitment"],
            e["args_hash"],
            e["kept_json"],
        ]
    )


def entry_sealed(keyring: Keyring, entry: RedactedRow) -> bool:
    """The entry's seal verifies (it was written by `redact` with this keyring)."""
    try:
        keyring.verify_signature(ENTRY, _entry_body(entry.model_dump()), entry.seal)
    except (TokenError, ValueError):  # or a value canonical JSON has none for (an edit): no seal
        return False
    return True


_GATE_WRITTEN = ("args_json", "detail_json")
#: The tables whose stored arguments the gate hashed when it wrote them (`args_hash`).
_HASHED = ("eg_approvals", "eg_executions")


def _check_arguments(targets: Sequence[Target]) -> None:
    """Refuse the whole erasure if a row's stored arguments do not hash to its recorded args hash
    (edited in the database: the audit's `args_tampered`). Erasing them would seal the edited
    text's facts in a redaction entry under the true hash, and the audit would stop seeing it."""
    for t in targets:
        text = t.values.get("args_json")
        if t.table not in _HASHED or text is None or is_redacted(text):
            continue
        if t.tool is None or stored_args_hash(t.tool, text) != t.args_hash:
            raise RedactionError(
                f"{t.table} row {t.key} ({t.tool or 'no tool'}): its stored arguments do not hash to "
                "its recorded args hash (edited in the database; `effectgate audit` reports it as "
                "args_tampered): nothing was erased"
            )


def _erase(
    store: Store,
    conn: Any,
    keyring: Keyring,
    targets: Sequence[Target],
    rid: str,
    keep: Sequence[str],
    at: float,
    erased: set[tuple[str, str, str]],
) -> tuple[int, int]:
    """Erase the targets' values. `erased`: the (table, row key, column) of every entry, read
    once per pass in its transaction (`_entered`); the entries written here join it when done."""
    _check_arguments(targets)  # before anything is written: a refusal changes nothing
    rows = values_erased = 0
    written: list[tuple[str, str, str]] = []
    # Erased already: a marker with its entry. Arguments and event details never start like one
    # (the gate refuses such arguments and writes details itself): a marker there that no
    # redaction wrote is tampering, left to the audit. Elsewhere (a tool result echoing model
    # text) it is a value like any other, and erased.
    for t in targets:
        values: dict[str, str] = {}
        entries: list[dict[str, Any]] = []
        for column, text in t.values.items():
            if text is None or (
                is_redacted(text) and (column in _GATE_WRITTEN or (t.table, t.key, column) in erased)
            ):
                continue
            if column == "args_json":
                facts: dict[str, Any] | None = facts_of(text, keep)
            else:  # an event's detail (only events have one) keeps its approval chain
                facts = (facts_of(text, EVENT_FACTS) or None) if column == "detail_json" else None
            values[column] = marker(rid, facts)
            entry = {
                "redaction_id": rid,
                "table_name": t.table,
                "row_key": t.key,
                "column_name": column,
                "commitment": commitment(keyring, text),
                "args_hash": t.args_hash if column == "args_json" else None,
                "kept_json": json.dumps(facts, sort_keys=True) if facts is not None else None,
                "at": at,
            }
            entry["seal"] = keyring.sign(ENTRY, _entry_body(entry))
            entries.append(entry)
        if values:
            store.overwrite_personal(conn, t.table, t.key, values)
            store.append_redacted(conn, entries)
            written.extend((t.table, t.key, column) for column in values)
            rows += 1
            values_erased += len(values)
    erased.update(written)  # as a fresh read would now find them (not before: same results)
    return rows, values_erased


def _keep(keep: Sequence[str]) -> tuple[str, ...]:
    """The argument names to keep as facts: a sequence of names (one string is refused, it would
    be read letter by letter and keep nothing; so is none, as `--keep ""` is: the facts would go)."""
    names = tuple(keep) if isinstance(keep, Iterable) and not isinstance(keep, str) else ()  # read once
    if isinstance(keep, str) or not names or not all(isinstance(k, str) and k for k in names):
        raise RedactionError(
            f"keep must be a sequence of argument names, e.g. ('amount', 'currency'), not {keep!r}: "
            "nothing was erased"
        )
    return names


def _opener(
    store: Store, targets: Sequence[Target], at: float, policy: Policy | None
) -> Callable[[Target], bool]:
    """`is_open` of `targets`' rows at `at`, or the ledger's clock when `at` is later (a grant the
    gate still honours is a call that may run, whatever time the pass was given), by the deadlines
    the gate derives (`_deadline.for_erasure`), never by the unsealed `expires_at` column."""
    live, until = min(at, store.clock.now()), for_erasure(targets, policy)
    return lambda t: is_open(t, live, until)


def _entered(store: Store, conn: Any) -> set[tuple[str, str, str]]:
    """The (table, row key, column) of every redaction entry, read in the pass's transaction
    (under `ERASURE_LOCK`): never kept across transactions, another process may add entries."""
    return {(e.table_name, e.row_key, e.column_name) for e in store.redacted(conn)}
