"""The seals behind the report's mode split. The "decisions" aggregate groups approvals by their
row fingerprint as stored; a column anyone with write access to the database could edit. With the
ledger's keyring, the report streams every approval's sealed fields (`Store.audit_rows`, the
audit's stream) and checks each seal (`_seal.seal_checker`, built for streaming: one HMAC per
row); an approval whose seal does not verify is moved out of its group into mode "unverified"
(its fingerprint given as None), so it never counts as shadow or live. So is one whose status (no
seal covers it) its sealed count of grants contradicts: decided, run or failed with no grant minted
(unless its recorded row is shadow: a shadow call's approval mints none), or pending or expired with
one (the gate calls that row tampered); so is one whose status its sealed denial contradicts (denied
with no sealed deny decision of its version, anything else with one) or that is no status the gate
writes, as the audit reports it (`status_tampered`). Without the keyring no seal is checked, and
the report says so (`NOT_CHECKED`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .._audit_rows import (
    A_CREATED,
    A_DECIDED,
    A_GRANTS,
    A_ID,
    A_ROLE,
    A_ROW_FP,
    A_SEAL,
    A_TOOL,
    A_VERSION,
    D_APPROVAL,
    D_DECISION,
    D_SEAL,
    D_VERSION,
    status_at,
)
from .._seal import seal_checker
from ..redact import entry_sealed
from ..stores.protocol import Store
from ..stores.records import RedactedRow
from ..tokens import Keyring

NOT_CHECKED = (
    "figures unverified: no keyring was given, so no approval's seal was checked and the shadow/live "
    "split trusts the row fingerprints as stored; run `effectgate audit` (with the ledger's keyring) "
    "to verify the records"
)

#: (approval id, tool, approver role, row fingerprint, status, finite latency 0/1): the columns of
#: the "decisions" aggregate an approval whose seal does not verify was counted under.
Unsealed = tuple[str, Any, Any, Any, Any, int]
#: What `unsealed` finds: the approvals set apart, and those set apart unless their row is shadow.
Found = tuple[list[Unsealed], list[Unsealed]]
_LARGEST = sys.float_info.max
_GRANTED = frozenset({"approved", "executing", "executed", "failed", "needs_reconciliation"})
_STATUSES = _GRANTED | {"pending", "expired", "denied", "rejected"}  # what the gate writes


def bounds(since: float | None, until: float | None) -> dict[str, float | None]:
    """The report's window as the queries take it: each bound None (open) or a finite number of
    seconds, as a float (an integer past 64 bits is no SQLite integer); ValueError otherwise (NaN
    would compare with nothing and count nothing, text fails on PostgreSQL with the driver's error)."""
    out: dict[str, float | None] = {}
    for name, value in (("since", since), ("until", until)):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and abs(value) <= _LARGEST):  # NaN, inf; 10**400 (no float)
            raise ValueError(f"the report's {name} is {value!r}: not a finite number of seconds")
        out[name] = None if value is None else float(value)
    return out


def unsealed(
    store: Store, conn: Any, keyring: Keyring, *, since: float | None, until: float | None, now: float
) -> Found:
    """The approvals proposed in [since, until) whose seal does not verify under `keyring`, or
    whose status contradicts their sealed grants (see the module docstring), each with its status
    at `now` (as the "decisions" aggregate read at `now` counts it); second, those approved with no
    grant minted (set apart unless their row is shadow: `standing`)."""
    sealed = seal_checker(keyring, "approval")
    low = -math.inf if since is None else since
    high = math.inf if until is None else until
    denials = _denials(store, conn, keyring)
    out: Found = ([], [])
    for a in store.audit_rows(conn, "approvals"):
        created = a[A_CREATED]  # the window first: an approval outside it costs no HMAC
        if not (isinstance(created, int | float) and low <= created < high):
            continue
        status, granted = status_at(a, now), type(a[A_GRANTS]) is int and a[A_GRANTS] > 0
        intact = sealed(a[:A_SEAL], a[A_SEAL])
        # as the audit's `status_tampered`: denied exactly when a sealed denial says so
        sound = status in _STATUSES and ((a[A_ID], a[A_VERSION]) in denials) == (status == "denied")
        if intact and sound and ((status in _GRANTED) == granted or status in ("denied", "rejected")):
            continue
        decided = 1 if _finite(a[A_DECIDED], created) else 0
        found = (a[A_ID], a[A_TOOL], a[A_ROLE], a[A_ROW_FP], status, decided)
        out[1 if intact and sound and status in _GRANTED else 0].append(found)
    return out


def backlog(store: Store, conn: Any, keyring: Keyring | None) -> tuple[list[tuple[Any, int]], int]:
    """The reconciliation backlog as (day number, records) rows, and apart from it the number of
    records erased with their call (a late run: nothing settles them). With the ledger's `keyring`
    a record counts as erased only when a redaction entry of its error verifies: one whose entries
    were inserted in the database is an open item, in the backlog."""
    days: dict[Any, int] = {}
    erased = 0
    for day, was_erased, n in store.report_rows(conn, "backlog_by_day"):
        if was_erased:
            erased += int(n)
        else:
            days[day] = days.get(day, 0) + int(n)
    if erased and keyring is not None:
        sealed: dict[Any, bool] = {}
        of: dict[Any, Any] = {}
        for rid, table, key, column, commitment, args_hash, kept, seal, day in store.report_rows(
            conn, "erased_backlog"
        ):
            entry = RedactedRow(
                redaction_id=rid,
                table_name=table,
                row_key=key,
                column_name=column,
                commitment=commitment,
                args_hash=args_hash,
                kept_json=kept,
                at=0.0,  # not sealed
                seal=seal,
            )
            sealed[key] = sealed.get(key, False) or entry_sealed(keyring, entry)
            of[key] = day
        for key in (k for k, ok in sealed.items() if not ok):
            days[of[key]] = days.get(of[key], 0) + 1
            erased -= 1
    return list(days.items()), erased


def _denials(store: Store, conn: Any, keyring: Keyring) -> set[tuple[Any, Any]]:
    """(approval id, version) of every deny decision whose seal verifies (one HMAC per denial)."""
    sealed = seal_checker(keyring, "decision")
    return {
        (d[D_APPROVAL], d[D_VERSION])
        for d in store.audit_rows(conn, "decisions")
        if d[D_DECISION] == "deny" and sealed(d[:D_SEAL], d[D_SEAL])
    }


def standing(found: Found | None, mode_of: Mapping[str, str]) -> list[Unsealed] | None:
    """What `unsealed` found to set apart, now that the modes are read (after the aggregate)."""
    if found is None:
        return None
    return [*found[0], *(f for f in found[1] if mode_of.get(f[3]) != "shadow")]


def _finite(decided: Any, created: float) -> bool:
    """As the "decisions" aggregate flags it: a decision time that is a number (not text or a blob
    SQLite kept in the column) whose latency is finite."""
    return isinstance(decided, int | float) and math.isfinite(decided - created)


def set_apart(
    rows: Sequence[tuple[Any, ...]], broken: Sequence[Unsealed], edited: Collection[str]
) -> list[tuple[Any, ...]]:
    """The "decisions" aggregate `rows` with each of the `broken` approvals moved out of the group
    it was counted in into one whose row fingerprint is None (mode "unverified"). `edited`: the
    approvals a reviewer edited, read after the aggregate; when an edit landed in between, the
    approval is taken from its group with the other flag. An approval the aggregate did not count
    (a window column the database compares otherwise) moves nothing: no count ever goes below 0."""
    counts: dict[tuple[Any, ...], int] = {}
    for tool, role, fingerprint, status, was_edited, decided, n in rows:
        key = (tool, role, fingerprint, status, int(was_edited), int(decided))
        counts[key] = counts.get(key, 0) + int(n)
    for approval_id, tool, role, fingerprint, status, decided in broken:
        flag = 1 if approval_id in edited else 0
        for e in (flag, 1 - flag):
            key = (tool, role, fingerprint, status, e, decided)
            if counts.get(key, 0) > 0:
                counts[key] -= 1
                moved = (tool, role, None, status, e, decided)
                counts[moved] = counts.get(moved, 0) + 1
                break
    return [(*key, n) for key, n in counts.items() if n]
