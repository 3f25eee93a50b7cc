"""The ledger's own hash chain: the audit finds a row deleted, added or edited in the database.

    made = seal_chain(store, keyring)          # checkpoint what is new (export_chain does this)
    breaks = verify_chain(store, keyring)     # [] when every checkpointed row is as it was

The append-only tables that hold the decision records (`eg_decisions`, `eg_executions`,
`eg_events`) are each chained in id order: a row's link is sha256 of the previous link and the
row's values (compact JSON, in column order), where each personal value (`records.PERSONAL`)
enters as its keyed hash, the same commitment a redaction keeps, so an erasure leaves the chain
whole. `seal_chain` appends a signed checkpoint per table (`eg_chain`: first and last id, count,
start, head, key id; HMAC with the keyring) over the rows not yet checkpointed, in id order, up
to the last one older than `settle` seconds. Younger rows after it wait for the next checkpoint: a
row still uncommitted took its id after every row settled since (its transaction commits within
`settle` seconds), so it is never skipped. A younger or future-dated row before it is seen, hence
committed, and is covered with it, so one row with a wrong clock cannot hold back every row after
it. `verify_chain` recomputes every checkpointed range and checks each signature and that each
checkpoint continues the one before: a row deleted, inserted or changed after its
checkpoint, or a forged or missing checkpoint, is named with its table and id range.

Why checkpoints and not a link written with each row: a link per insert would serialise every
writer on the chain's head (one lock across processes and hosts); checkpoints cost the hot path
nothing. Rows newer than the last checkpoint are covered by the next one; the export seals first.
A checkpoint made under a key the keyring no longer holds cannot be checked (rotate keys by
adding, not replacing).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._commitments import COMMIT, commitment_part, keyed_hash
from ._seal import approval_sealed, decision_intact, rule_sealed, seals_by_rule
from .canonical import ENCODE, canonical_json
from .errors import EffectGateError, TokenError
from .stores._chain import CHAINED, columns
from .stores._dialect import is_redacted
from .stores.protocol import Store
from .stores.records import PERSONAL, ChainRow, RedactedRow
from .tokens import Keyring

PURPOSE = "ledger-chain"
GENESIS = "0" * 64
SETTLE_S = 60.0
#: The lock a redaction and a seal both take (`Store.lock`), so a seal reads the redaction
#: entries and the rows they erased as of one moment (PostgreSQL reads each statement afresh).
ERASURE_LOCK = "ledger-erasure"


class ChainError(EffectGateError):
    """The chain cannot be extended: its last checkpoint does not verify, or a row to cover holds a
    value no gate writes (a blob or a text time SQLite kept from an edit). Nothing was written."""


@dataclass(frozen=True)
class ChainBreak:
    """One checkpointed range that no longer holds: the table, the ids, and why."""

    table: str
    first_id: int | None
    last_id: int | None
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Links:
    """Computes one table's links under one key (personal values as their keyed hashes)."""

    def __init__(self, keyring: Keyring, table: str, kid: str, erased: Mapping[Any, RedactedRow]) -> None:
        self.table = table
        self.kid = kid
        self.key = keyring.derived_key(COMMIT, kid)
        names = columns(table)
        self.id_at = names.index("id")
        self.personal = [(i, n) for i, n in enumerate(names) if n in PERSONAL.get(table, ())]
        self.erased = erased
        self.seen: dict[str, str] = {}

    def value(self, row_id: Any, column: str, text: Any) -> Any:
        if type(text) is not str:  # None, or a blob SQLite kept from an edit: `link` refuses it
            return text  # (its keyed hash would be that of its repr, a text a row may also hold)
        if is_redacted(text):
            entry = self.erased.get((self.table, str(row_id), column))
            part = commitment_part(entry.commitment, self.kid) if entry is not None else None
            return part if part is not None else text  # a marker no redaction wrote: breaks the link
        known = self.seen.get(text)  # read records share a few detail texts: hash each once
        if known is None:
            known = keyed_hash(self.key, str(text))
            if len(text) < 256 and len(self.seen) < 4096:
                self.seen[text] = known
        return known

    def link(self, prev: str, row: tuple[Any, ...]) -> str:
        values = list(row)
        for i, name in self.personal:
            values[i] = self.value(row[self.id_at], name, row[i])
        try:
            body = ENCODE([self.table, *values]).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):  # a blob or NaN that SQLite keeps: edited in the database
            raise ChainError(
                f"row {row[self.id_at]} of {self.table} holds a value no gate writes (edited in the "
                "database): nothing was checkpointed"
            ) from None
        return hashlib.sha256(prev.encode() + b"\n" + body).hexdigest()


def _body(c: Mapping[str, Any]) -> bytes:
    return canonical_json(
        [
            c["table_name"],
            c["first_id"],
            c["last_id"],
            c["count"],
            c["start"],
            c["head"],
            c["key_id"],
            c["at"],
        ]
    )


def _signed(keyring: Keyring, c: ChainRow) -> bool:
    if not _well_formed(c):
        return False
    try:
        keyring.verify_signature(PURPOSE, _body(c.model_dump()), c.signature)
    except TokenError:
        return False
    return c.signature.startswith(f"{c.key_id}.")


def _well_formed(c: ChainRow) -> bool:
    """The checkpoint's fields hold what a seal writes: SQLite keeps whatever an edit stored (text
    in an id, a blob in the head), which no comparison or signature check may see."""
    ints, texts = (c.first_id, c.last_id, c.count), (c.table_name, c.start, c.head, c.key_id, c.signature)
    return (
        all(type(v) is int and abs(v) < 2**53 for v in ints)  # what the signed JSON body holds
        and all(isinstance(v, str) for v in texts)
        and type(c.at) in (int, float)
        and math.isfinite(c.at)
    )


def _erased(store: Store, conn: Any) -> dict[tuple[str, str, str], RedactedRow]:
    return {(e.table_name, e.row_key, e.column_name): e for e in store.redacted(conn)}


def check_keyring(
    store: Store,
    conn: Any,
    keyring: Keyring,
    *,
    every_checkpoint: bool = False,
    points: Sequence[ChainRow] | None = None,
) -> None:
    """Raise TokenError("keyring_mismatch") unless `keyring` is the ledger's: of the newest
    signed records (each chained table's last checkpoint, the newest approvals' and decisions'
    seals; with none of them, the rules' seals: a ledger of writes and reads has no other, and its
    first checkpoint must not be made under another keyring) at least one must verify under it
    (a ledger with none passes).
    `every_checkpoint` (an erasure): it must also hold the key of every checkpoint, since an erased
    value enters the chain as its commitment under the checkpoint's key. `points`: the checkpoints,
    when the caller read them in this same transaction (else read here). Reads only, in the
    caller's transaction."""
    points = list(store.checkpoints(conn)) if points is None else points
    if every_checkpoint:
        missing = sorted({str(c.key_id) for c in points if not keyring.holds(c.key_id)})  # a blob: named
        if missing:
            raise _mismatch(keyring, f"the ledger's chain is signed with key(s) {', '.join(missing)}")
    newest = {c.table_name: c for c in points}
    approvals, decisions = store.sealed_sample(conn)
    checks = [
        *(_signed(keyring, c) for c in newest.values()),
        *(approval_sealed(keyring, a) for a in approvals),
        *(decision_intact(keyring, d) for d in decisions),
    ]
    if not checks:  # a ledger of writes and reads: its rules' seals are all it has signed
        rules, verifies = {r.fingerprint: r for r in store.rule_rows(conn)}, keyring.verifier("rule")
        by_rule = seals_by_rule(rules).items()
        checks = [
            rule_sealed(verifies, seals, str(rules[fp].kind), fp) for fp, seals in by_rule if fp in rules
        ]
    if checks and not any(checks):
        raise _mismatch(keyring, "none of the ledger's newest seals and checkpoints verifies under it")


def _mismatch(keyring: Keyring, why: str) -> TokenError:
    return TokenError(
        "keyring_mismatch",
        f"this keyring (keys: {', '.join(keyring.kids)}) is not the ledger's: {why}. Nothing was "
        "changed. Use the keyring the ledger was sealed with: set EFFECTGATE_KEYRING, or use the "
        "database's key file (DB.keys beside a SQLite database)",
    )


def seal_chain(
    store: Store, keyring: Keyring, *, now: float | None = None, settle: float = SETTLE_S
) -> list[ChainRow]:
    """Checkpoint each chained table's rows not yet covered, up to the last one (in id order)
    older than `settle` seconds (module docstring). Raises, writing nothing,
    TokenError("keyring_mismatch") when the ledger was sealed with another keyring
    (`check_keyring`) or a table's last checkpoint under a key it does not hold, and ChainError
    when a table's last checkpoint does not verify or a row holds a value no gate writes. The
    redaction entries and the rows are read in one transaction, under the lock every redaction
    takes, so a redaction committing meanwhile cannot leave a marker sealed as text. ValueError,
    nothing read, for a `settle` that is not a finite number >= 0 or a `now` that is not finite
    (NaN would checkpoint and export nothing, silently)."""
    for name, value, low in (("settle", settle, 0.0), ("now", 0.0 if now is None else now, -math.inf)):
        if type(value) not in (int, float) or not math.isfinite(value) or value < low:
            raise ValueError(f"{name} must be a finite number{' >= 0' if low == 0 else ''}, not {value!r}")
    cutoff = (time.time() if now is None else now) - settle
    made: list[ChainRow] = []
    with store.transaction() as conn:
        store.lock(conn, ERASURE_LOCK)  # no redaction commits between these reads (one moment)
        points = list(store.checkpoints(conn))  # read once: only a seal appends, under this lock
        check_keyring(store, conn, keyring, points=points)  # refused before anything is written
        erased = _erased(store, conn)
        last: dict[str, ChainRow] = {c.table_name: c for c in points}
        for table in CHAINED:
            before = last.get(table)
            if before is not None and _well_formed(before) and not keyring.holds(before.key_id):
                why = f"the last checkpoint of {table} is signed with key {before.key_id!r}"
                raise _mismatch(keyring, f"{why}, which it does not hold (rotate keys by adding them)")
            if before is not None and not _signed(keyring, before):
                raise ChainError(
                    f"the last checkpoint of {table} does not verify: run `effectgate audit --chain`"
                )
            links = _Links(keyring, table, keyring.current, erased)
            at_index = columns(table).index("at")
            running = head = before.head if before is not None else GENESIS
            first = last_id = None
            seen = count = 0
            for row in store.chain_rows(conn, table, after_id=before.last_id if before else None):
                running, seen = links.link(running, row), seen + 1
                if type(row[at_index]) not in (int, float) or not math.isfinite(row[at_index]):
                    raise ChainError(
                        f"row {row[links.id_at]} of {table} holds a time no gate writes (edited in the "
                        "database): nothing was checkpointed"
                    )
                first = row[links.id_at] if first is None else first
                if row[at_index] < cutoff:  # settled: it and every row before it are covered
                    head, last_id, count = running, row[links.id_at], seen
            if count == 0 or first is None or last_id is None:
                continue
            values: dict[str, Any] = {
                "table_name": table,
                "first_id": int(first),
                "last_id": int(last_id),
                "count": count,
                "start": before.head if before is not None else GENESIS,
                "head": head,
                "key_id": keyring.current,
                "at": cutoff + settle,
            }
            values["signature"] = keyring.sign(PURPOSE, _body(values))
            store.append_checkpoint(conn, values)
            made.append(ChainRow(**values))
    return made


def verify_chain(
    store: Store, keyring: Keyring, *, erased: Mapping[Any, RedactedRow] | None = None
) -> list[ChainBreak]:
    """Every checkpointed range of every chained table, recomputed (module docstring). `erased`:
    the redaction entries (`redact.entries`) when the caller has read them already (else they are
    read in the same transaction as the rows)."""
    breaks: list[ChainBreak] = []
    with store.reading() as conn:
        erased = _erased(store, conn) if erased is None else erased
        by_table: dict[str, list[ChainRow]] = {t: [] for t in CHAINED}
        for c in store.checkpoints(conn):
            if not _well_formed(c):  # a break of its own; the next checkpoint no longer continues
                why = "a checkpoint whose fields hold what no seal writes (edited)"
                breaks.append(ChainBreak(str(c.table_name), None, None, why))
                continue
            if c.table_name not in by_table:
                breaks.append(
                    ChainBreak(c.table_name, c.first_id, c.last_id, "a checkpoint of no chained table")
                )
                continue
            by_table[c.table_name].append(c)
        for table, points in by_table.items():
            if not points:
                continue
            breaks.extend(_verify_table(store, conn, keyring, table, points, erased))
    return breaks


def _verify_table(
    store: Store,
    conn: Any,
    keyring: Keyring,
    table: str,
    points: list[ChainRow],
    erased: Mapping[Any, RedactedRow],
) -> list[ChainBreak]:
    found: list[ChainBreak] = []
    # from the first row, whatever its id: one inserted at id 0 or below is in the first range
    rows = store.chain_rows(conn, table, after_id=None, upto_id=points[-1].last_id)
    pending: tuple[Any, ...] | None = next(rows, None)
    prev_head = GENESIS
    prev_last: int | None = None  # no range before the first
    id_at = columns(table).index("id")
    for c in points:
        where = (table, c.first_id, c.last_id)
        if keyring.holds(c.key_id) and not _signed(keyring, c):  # an unheld key is named below
            found.append(ChainBreak(*where, "the checkpoint's signature does not verify (forged or edited)"))
        if c.start != prev_head or (prev_last is not None and c.first_id <= prev_last):
            found.append(
                ChainBreak(*where, "the checkpoint does not continue the one before (one was removed)")
            )
        try:
            links = _Links(keyring, table, c.key_id, erased)
        except TokenError:
            found.append(
                ChainBreak(*where, f"signed with key {c.key_id!r}, which this keyring does not hold")
            )
            links = None
        head, count = c.start, 0
        while pending is not None and pending[id_at] <= c.last_id:
            if links is not None:
                try:
                    head = links.link(head, pending)
                except ChainError:  # no link: the range's head cannot match (reported below)
                    head = "edited"
            count += 1
            pending = next(rows, None)
        if links is not None and (count != c.count or head != c.head):
            found.append(
                ChainBreak(
                    *where,
                    f"{count} row(s) now where {c.count} were checkpointed, or one changed: rows with ids "
                    f"{c.first_id}..{c.last_id} were deleted, inserted or edited",
                )
            )
        prev_head, prev_last = c.head, c.last_id
    return found


__all__ = [
    "ERASURE_LOCK",
    "GENESIS",
    "ChainBreak",
    "ChainError",
    "check_keyring",
    "seal_chain",
    "verify_chain",
]
