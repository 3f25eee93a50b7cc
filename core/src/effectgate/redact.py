"""GDPR erasure, retention rules and legal holds, keeping the financial facts and every chain.

    done = redact(store, keyring, user_id="u1", by="dpo@shop", reason="erasure request #77")
    done = retain(store, keyring, {"read": 30, "write": 365}, by="nightly")   # days per kind
    hold(store, user_id="u2", by="legal@shop", reason="case 2026-14")          # erase nothing of u2

What is personal is named per table (`stores.records.PERSONAL`): the arguments, results,
snapshots, errors, subjects, notes and free-text reasons of every record. A redaction overwrites
each such value with a marker, `{"$redacted":"<redaction id>", ...facts}`, where the facts are the
top-level arguments named in `keep` (by default `amount` and `currency`), and appends one sealed
`eg_redacted` entry per value: the table, row and column, the value's commitment (the keyring's
MAC of the erased text, a salted hash only the keyring's holder can compute: nobody can confirm a
guess without the key), the args hash the arguments had and the facts kept. What is kept: ids
(users and sessions are the application's pseudonyms), the approval chain (who approved, in what
role, when; in an event's erased detail, `EVENT_FACTS`: who approved or edited the call, in what
role, and the hash an amendment replaced), hashes, fingerprints, times, statuses, and the facts.

The database lets a personal column take a redaction marker and nothing else (the append-only
triggers); the audit accepts a redacted record only with a sealed entry that matches it (its
args hash and facts), so a marker written without `redact` is a finding. Exports carry personal
values outside their hash chain, committed to by the same commitments, so `redact_export` erases
them from an export file while it still verifies (see `effectgate.export`).

Refused, changing nothing: a keyring that is not the ledger's (`chain.check_keyring`: its
commitments would be unverifiable and break the chain), a `keep` name that is no fact, no
argument of a recorded tool nor of a record erased (a typo, `_holds.check_keep`: it would erase
the fact meant), a user under a legal hold, and a user with a call that may still run or is
being decided (pending, approved, executing, needs_reconciliation; not an approved shadow call,
one pending past its deadline, nor one whose grant lapsed after it: those can never run,
`stores._redaction.is_open`, by the deadline the gate derives: `_deadline.for_erasure`): decide
or reconcile it first. Refused too, by `redact` and `retain` alike, when an approval's or
execution's stored arguments no longer hash to its recorded args hash (edited in the database):
erasing them would seal the edited facts and hide the tampering from the audit. A retention
pass skips held users and every row of an open call
(its approval, executions, events, decisions and idempotency records; and a note listing it in
its detail's `approval_ids`). Each redaction is itself an event (`redacted`, with who ran it
and why, and no personal value). A hold is placed and released under the erasure lock, so it
never commits under a running redaction or retention pass. A redaction whose `subject` matches
no record of the user is `SubjectNotFound`.

Redaction selects by the user a call acted for (and, with `subject`, one subject of theirs, e.g.
an order: the calls of its approvals, by subject key, and the writes whose arguments hold every
field of the subject with that value; a read records no arguments, so only a redaction of the
user reaches it); personal data of someone else that a call carried in its arguments is found
only through the user it was made for. Events name the call's user (a notifier's too); one that
names only its approval is reached through that approval.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import _holds
from ._commitments import commitment, commitment_holds, commitment_part, keyed_hash
from ._erasure import MARK as MARK  # re-exported: its home was here
from ._erasure import _entered, _erase, _keep, _opener, entry_sealed, facts_of, marker
from ._holds import RedactionError, _at, _event, _text, check_keep, hold, holds, known_names, release
from .canonical import canonical_json, digest
from .chain import ERASURE_LOCK, check_keyring
from .effects import Effect, Policy
from .stores._dialect import is_redacted
from .stores._redaction import UNCLASSIFIED, call_id
from .stores._target_calls import of_subject
from .stores.protocol import Store
from .stores.records import RedactedRow
from .table import _as_set
from .tokens import Keyring

FACTS = ("amount", "currency")
DAY = 86400.0


class SubjectNotFound(RedactionError, LookupError):
    """A redaction's subject matches no record of the user (values compare as JSON: "1042" is
    not 1042); nothing was erased and no redaction recorded."""


@dataclass(frozen=True)
class Redaction:
    """What one redaction or retention pass erased: its id, how many rows and values, the facts
    it kept, and (retention) the held users it left alone."""

    id: str
    rows: int
    values: int
    keep: tuple[str, ...]
    held: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "keep": list(self.keep), "held": list(self.held)}


def subject_keys(subject: Mapping[str, Any]) -> list[str]:
    """The ledger's subject keys for a subject (live and shadow proposals); a list names a set,
    as the gate keys it (`ToolSpec.subject_of`: recipients in any order, or one twice)."""
    key = digest({"subject": {k: _as_set(v) for k, v in subject.items()}})
    return [key, f"shadow:{key}"]


def redact(
    store: Store,
    keyring: Keyring,
    *,
    user_id: str,
    by: str,
    reason: str,
    subject: Mapping[str, Any] | None = None,
    keep: Sequence[str] = FACTS,
    now: float | None = None,
    policy: Policy | None = None,
) -> Redaction:
    """Erase the personal values of every record of `user_id` (of one `subject` of theirs, when
    given), keeping the facts named in `keep`; `policy`: the gate's (its `pending_ttl` says when a
    pending call whose proposal recorded none lapsed: `_deadline.for_erasure`). Refused, changing
    nothing, while the user is held or has a call that may still run (module docstring), and for
    an empty `subject` (`{}` would match every write of the user: leave `subject` out to erase them
    all); `SubjectNotFound` when no record of the user matches `subject`."""
    for name, value in (("user_id", user_id), ("by", by), ("reason", reason)):
        _text(name, value)
    if subject is not None and (not isinstance(subject, Mapping) or not subject):  # {}: every write
        raise RedactionError(
            "subject must name at least one field (e.g. {'order_id': '1042'}); to erase all of the "
            "user's records, give no subject: nothing was redacted"
        )
    keep = _keep(keep)
    at, known = _at(now, store), known_names(store, keep, FACTS)
    rid = f"r-{secrets.token_hex(8)}"
    with store.transaction() as conn:
        store.lock(conn, ERASURE_LOCK)  # a seal never reads a redaction half-way (`chain`)
        check_keyring(store, conn, keyring, every_checkpoint=True)
        _holds.refuse_held(store, conn, user_id, "nothing was redacted")
        keys = subject_keys(subject) if subject is not None else []
        targets = store.redaction_targets(conn, user_id=user_id)
        opened = _opener(store, targets, at, policy)
        if subject is not None:  # its approvals' calls, and the writes whose arguments name it
            targets = of_subject(targets, keys, subject)
            # a note shared with another subject's open call stays, as retention leaves it (`Call.named`)
            targets = [t for t in targets if not (t.call and t.call.named and opened(t))]
            if not targets:  # a typo (1042 for "1042") must not read as a redaction done
                raise SubjectNotFound(
                    f"no record of user {user_id!r} matches subject {canonical_json(dict(subject)).decode()} "
                    '(values compare as JSON: "1042" is not 1042; a write already erased no longer '
                    "shows its arguments): nothing was redacted"
                )
        open_ = sorted({call_id(t) for t in targets if opened(t)})
        if open_:
            raise RedactionError(
                f"user {user_id!r} has {len(open_)} call(s) that may still run or are being decided "
                f"({', '.join(open_[:5])}): deny, execute or reconcile them first; nothing was redacted"
            )
        check_keep(keep, known, targets)  # a typo would erase the fact it meant to keep
        rows, values = _erase(store, conn, keyring, targets, rid, keep, at, _entered(store, conn))
        detail: dict[str, Any] = {"redaction_id": rid, "user_id": user_id, "by": by, "reason": reason}
        if keys:
            detail["subject_key"] = keys[0]
        store.append_events(
            conn, [_event("redacted", at, rows=rows, values=values, keep=list(keep), **detail)]
        )
    return Redaction(rid, rows, values, keep)


def retain(
    store: Store,
    keyring: Keyring,
    rules: Mapping[str, float],
    *,
    by: str,
    keep: Sequence[str] = FACTS,
    now: float | None = None,
    policy: Policy | None = None,
) -> Redaction:
    """Apply retention rules: for each record kind named in `rules`, an effect class (read,
    write, send, money, destructive) or `unclassified` (the events that name none: refusals of
    tools absent from the table), erase the personal values of its records older than that many
    days, keeping the facts. Held users and calls that may still run are left alone (`policy`:
    as for `redact`)."""
    _text("by", by)
    if not isinstance(rules, Mapping):  # a list of pairs, None: no rule read as none, nor a raw error
        raise RedactionError(f"rules must map record kinds to days, e.g. {{'read': 30}}, not {rules!r:.60}")
    known = {str(e) for e in Effect} | {UNCLASSIFIED}
    for effect, days in rules.items():
        if effect not in known:
            raise RedactionError(f"unknown record kind {effect!r}: use one of {', '.join(sorted(known))}")
        # NaN and infinity fail the range; so does an integer no float holds (OverflowError below)
        if isinstance(days, bool) or not isinstance(days, int | float) or not 0 <= days <= sys.float_info.max:
            raise RedactionError(f"retention for {effect} must be a number of days >= 0 (got {days!r})")
    keep = _keep(keep)
    at, known = _at(now, store), known_names(store, keep, FACTS)
    rid = f"r-{secrets.token_hex(8)}"
    rows = values = 0
    with store.transaction() as conn:
        store.lock(conn, ERASURE_LOCK)
        check_keyring(store, conn, keyring, every_checkpoint=True)
        held = sorted({h.user_id for h in store.holds(conn)})
        erased = _entered(store, conn) if rules else set()  # once per pass, kept current by `_erase`
        if set(keep) - known:  # checked against every target first: a typo erases nothing
            ages = [(e, at - d * DAY) for e, d in rules.items()]
            found = [store.redaction_targets(conn, effect=e, before=b, held=held) for e, b in ages]
            check_keep(keep, known, [t for ts in found for t in ts])
        for effect, days in sorted(rules.items()):
            reached = store.redaction_targets(conn, effect=effect, before=at - days * DAY, held=held)
            opened = _opener(store, reached, at, policy)
            targets = [t for t in reached if not opened(t)]
            r, v = _erase(store, conn, keyring, targets, rid, keep, at, erased)
            rows, values = rows + r, values + v
        store.append_events(
            conn,
            [
                _event(
                    "redacted",
                    at,
                    redaction_id=rid,
                    retention={k: rules[k] for k in sorted(rules)},
                    by=by,
                    rows=rows,
                    values=values,
                    keep=list(keep),
                    held=held,
                )
            ],
        )
    return Redaction(rid, rows, values, keep, tuple(held))


def entries(store: Store) -> dict[tuple[str, str, str], RedactedRow]:
    """Every redaction entry, by (table, row key, column)."""
    with store.transaction() as conn:
        return {(e.table_name, e.row_key, e.column_name): e for e in store.redacted(conn)}


__all__ = [
    "FACTS",
    "Redaction",
    "RedactionError",
    "SubjectNotFound",
    "commitment",
    "commitment_holds",
    "commitment_part",
    "entries",
    "entry_sealed",
    "facts_of",
    "hold",
    "holds",
    "is_redacted",
    "keyed_hash",
    "marker",
    "redact",
    "release",
    "retain",
]
