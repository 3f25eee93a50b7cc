"""What the audit holds against the sealed record (`_audit_scan.py`): the redaction entry that backs
each erased value, and the entries anyone with write access inserted beside it (`backing`); an
approval's status column, which no seal covers, against its sealed count of grants and its sealed
denial (`status_tampered`); decisions whose approval row is gone (`orphaned`). The export commits
to the same entries (`export.decision_records`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._audit_rows import A_GRANTS, A_ID, A_STATUS, A_TOOL, D_APPROVAL, D_SEAL, Finding
from .redact import entry_sealed
from .stores.protocol import Store
from .stores.records import RedactedRow
from .tokens import Keyring

Backing = tuple[dict[tuple[str, str, str], RedactedRow], list[RedactedRow]]

#: The statuses of an approval no grant was minted for (none is before it is approved; a scope
#: refusal is never approved).
UNGRANTED = frozenset({"pending", "expired", "rejected"})


def entries(store: Store) -> Sequence[RedactedRow]:
    """Every redaction entry, in order, read in a transaction of its own (for `backing`)."""
    with store.reading() as conn:
        return store.redacted(conn)


def sealed_entries(store: Store, keyring: Keyring | None) -> dict[tuple[str, str, str], RedactedRow]:
    """The redaction entries by (table, row key, column), the last of a key's; with `keyring` only
    those whose seal verifies (one inserted in the database after a sealed one would hide it): what
    replay and `redact --export` go by."""
    return {
        (e.table_name, e.row_key, e.column_name): e
        for e in entries(store)
        if keyring is None or entry_sealed(keyring, e)
    }


def backing(rows: Sequence[RedactedRow], keyring: Keyring | None) -> Backing:
    """The redaction entry that backs each erased value, by (table, row key, column), and the
    entries it hides, in order. A redaction writes one entry a value; of several (one inserted in
    the database since), the last whose seal verifies under `keyring` backs it (none does, or no
    keyring: the last), and each other one whose seal does not verify is hidden (a finding: looked
    up by the last entry, it would hide the sealed one). One entry a value costs no seal check here
    (the marker's check verifies it)."""
    by_value: dict[tuple[str, str, str], list[RedactedRow]] = defaultdict(list)
    for e in rows:
        by_value[(e.table_name, e.row_key, e.column_name)].append(e)
    backs: dict[tuple[str, str, str], RedactedRow] = {}
    hidden: list[RedactedRow] = []
    for value, found in by_value.items():
        sealed = (
            [e for e in found if entry_sealed(keyring, e)] if keyring is not None and len(found) > 1 else []
        )
        backs[value] = (sealed or found)[-1]
        hidden += [e for e in found if e is not backs[value] and all(e is not s for s in sealed)]
    return backs, sorted(hidden, key=lambda e: e.id or 0)


def hidden_entry(entry: RedactedRow) -> Finding:
    """The finding of an entry `backing` found hidden: named by its id and redaction."""
    table, key = entry.table_name, entry.row_key
    detail = (
        f"{entry.column_name} of {table} {key}: redaction entry {entry.id} ({entry.redaction_id}) "
        "does not verify and is not the one that backs the value (inserted in the database)"
    )
    ex = int(key) if table == "eg_executions" and key.isdigit() else None
    return Finding("redaction_forged", "", detail, key if table == "eg_approvals" else None, ex)


def status_tampered(a: tuple[Any, ...], approved: bool, denied: bool, shadow: bool) -> list[Finding]:
    """How an approval's status (no seal covers it) contradicts its sealed record, as the gate
    refuses it: approved, run or failed (`approved`) with no grant minted (but a shadow call's: it
    mints none), pending, expired or rejected with one, anything but denied for a version sealed
    denied (`denied`: a denial is final), or denied with no sealed denial (the gate seals its deny
    decision with the status). One finding, or none."""
    status, grants = a[A_STATUS], a[A_GRANTS]
    granted = type(grants) is int and grants > 0
    if denied is (status != "denied"):
        wrong = (
            "the version was denied (a sealed deny decision)" if denied else "no sealed denial of the version"
        )
    elif approved and not granted and not shadow:
        wrong = f"no grant was minted (its sealed count of grants is {grants})"
    elif status in UNGRANTED and granted:
        wrong = f"a grant was minted (its sealed count of grants is {grants})"
    else:
        return []
    return [Finding("status_tampered", a[A_TOOL], f"status {status}, but {wrong}", a[A_ID])]


Row = tuple[Any, ...]


def orphaned(
    first: Row, rest: Iterator[Row], sealed: Callable[[Row, Any], bool] | None, out: list[Finding]
) -> Row | None:
    """Add to `out` the finding of the decisions that name an approval no row holds (`first` and
    those after it in `rest` naming the same id); the decision after them. The gate never deletes
    an approval: its row was deleted (a decision's seal verifies under the keyring, or none is
    given), or the decisions were inserted (`decision_forged`: none verifies)."""
    approval_id, count, verified = first[D_APPROVAL], 0, sealed is None
    d: Row | None = first
    while d is not None and d[D_APPROVAL] == approval_id:
        count, verified = count + 1, verified or (sealed is not None and sealed(d[:D_SEAL], d[D_SEAL]))
        d = next(rest, None)
    if verified:
        detail = f"{count} decision(s) name approval {approval_id}, which no row holds (deleted)"
        out.append(Finding("no_approval", "", detail, approval_id))
    else:
        detail = f"{count} decision(s) name approval {approval_id}, which no row holds; no seal verifies"
        out.append(Finding("decision_forged", "", detail, approval_id))
    return d
