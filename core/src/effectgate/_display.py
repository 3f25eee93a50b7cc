"""How stored values are shown to a person (web card, webhook, notebook card): one place, so
every surface prints the same arguments, times and countdowns."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._execution import EXEC_PREFIX
from ._json import parse
from ._seal import approval_verifies, decision_intact, foreign_key, mismatch
from ._standing import said_status
from .chain import check_keyring
from .errors import ForeignSeal, StoreError, TamperedRecord, TokenError
from .outcomes import TAMPERED_WARNING, Card, json_value

if TYPE_CHECKING:
    from .gate import EffectGate

FOLD = 2000  # characters of one value shown before folding (the rest is one click away, never cut)


def pretty(value: Any) -> str:
    """`value` as indented JSON; its repr when JSON cannot hold it (an application's value with
    keys that are not text or do not sort together, or that contains itself)."""
    return _json_or_repr(value, indent=2, sort_keys=True, ensure_ascii=False)


def json_line(value: Any) -> str:
    """`value` as one line of JSON; its repr when JSON cannot hold it (as `pretty`)."""
    return _json_or_repr(value)


def _json_or_repr(value: Any, **options: Any) -> str:
    try:
        return json.dumps(value, default=str, **options)
    except (TypeError, ValueError):
        return repr(value)


def fold(value: Any) -> list[dict[str, Any]]:
    """Each top-level argument as (name, text, folded?): long values are folded with their size."""
    items = value.items() if isinstance(value, dict) else [("", value)]
    out = []
    for name, v in items:
        text = pretty(v)
        out.append({"name": name, "text": text, "folded": len(text) > FOLD, "size": len(text)})
    return out


def stored_json(text: str | None) -> Any:
    """A JSON column's value; the text itself when it is not JSON (inserted or edited in the
    database, or nested deeper than Python parses), so that one row cannot take a page down for
    the others."""
    try:
        return None if text is None else parse(text)
    except (ValueError, RecursionError):
        return text


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    try:
        return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):  # a stored time no calendar holds (edited)
        return f"{epoch!r} (not a date)"


def remaining(seconds: float) -> str:
    """A countdown: "in 4m 10s", "in 2h 0m 5s", "in 3d 1h 20m", or "expired"."""
    if seconds <= 0:
        return "expired"
    if not math.isfinite(seconds):  # a stored time no clock reaches (edited)
        return f"{seconds!r} (not a time)"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    parts += [f"{hours}h"] if hours or days else []
    parts += [f"{minutes}m", f"{s}s"] if not days else [f"{minutes}m"]
    return "in " + " ".join(parts)


def countdown(expires_at: Any, now: float) -> str:
    """`remaining` until `expires_at`; the stored value itself when an edit in the database left
    something else than a number in the column (SQLite keeps text written into it)."""
    if isinstance(expires_at, int | float):
        return remaining(expires_at - now)
    return f"{expires_at!r} (not a time)"


def duration(seconds: float) -> str:
    """A length of time: "0s", "45s", "12m 30s", "2h 0m 5s", "3d 1h 20m"."""
    return "0s" if seconds < 1 else remaining(seconds).removeprefix("in ")


def reconciliation_queue(gate: EffectGate, role: str) -> list[dict[str, Any]]:
    """The unknown outcomes, each with the approval behind it (None for a write), whether that
    record verifies (`intact`: else the gate refuses to settle it), and whether `role` may settle
    it (`yours`). A record edited outside effectgate raises the store's error naming it."""
    out = []
    for record in gate.store.idempotency_records(status="needs_reconciliation"):
        executes = record.key.startswith(EXEC_PREFIX)
        approval_id = record.key[len(EXEC_PREFIX) :].rpartition("_v")[0] if executes else None
        row = gate.store.get_approval(approval_id) if approval_id else None
        intact = row is not None and approval_verifies(gate.keyring, row)
        yours = row is not None and intact and gate.policy.role_satisfies(role, row.approver_role)
        out.append({"record": record, "approval": row, "yours": yours, "intact": intact})
    return out


def keyring_warnings(gate: EffectGate, cards: list[Card]) -> list[Card]:
    """`cards` with the "does not verify" warning of a record sealed under a key this keyring does
    not hold replaced by the keyring mismatch it most likely is, when this keyring is not the
    ledger's (`_foreign_keyring`): a `ForeignSeal` (its `key_id`) whose text names the key and
    says to use the ledger's keyring. The store is read only when a card is flagged."""
    flagged = [c.approval_id for c in cards if TAMPERED_WARNING in c.warnings]
    if not flagged:
        return cards
    with gate.store.reading() as conn:
        if not _foreign_keyring(gate, conn):
            return cards  # the ledger's newest seals verify: an unknown key id was written in
        seals = {i: gate.store.approval(conn, i) for i in flagged}
    fixed = []
    for card in cards:
        row = seals.get(card.approval_id)
        kid = foreign_key(gate.keyring, row.seal) if row is not None else None
        if kid is not None:
            seal = ForeignSeal(kid, mismatch(kid))
            warnings = tuple(seal if w == TAMPERED_WARNING else w for w in card.warnings)
            card = dataclasses.replace(card, warnings=warnings)
        fixed.append(card)
    return fixed


def _foreign_keyring(gate: EffectGate, conn: Any) -> bool:
    """Whether the gate's keyring is not the ledger's (`chain.check_keyring`: none of the newest
    seals and checkpoints verifies under it). A key id is the row's own text: with the ledger's
    keyring in use, a seal naming an unknown key is an edit, never shown as a mismatch."""
    try:
        check_keyring(gate.store, conn, gate.keyring)
    except TokenError:
        return True
    return False


def tampered_refusal(gate: EffectGate, exc: TamperedRecord) -> tuple[str, str]:
    """The title and message of the inbox's refusal of a record that does not verify: a keyring
    mismatch only when this keyring is not the ledger's (`_foreign_keyring`)."""
    if exc.foreign_key:
        with gate.store.reading() as conn:
            if _foreign_keyring(gate, conn):
                return "Keyring mismatch", f"{exc}."
        return "Record does not verify", (
            "Its seal names a key the ledger's keyring never held: it was edited outside effectgate. "
            "Nothing was changed or run."
        )
    return "Record does not verify", f"{exc}."


def card_status(gate: EffectGate, approval_id: str) -> tuple[str, str] | None:
    """The status column of `approval_id` and what its card shows as its status (`said_status`:
    what the executions and a sealed denial say), read together (a call that ran since the card
    was read is no edit); None when it is gone."""
    store = gate.store
    with store.reading() as conn:
        row = store.approval(conn, approval_id)
        if row is None:
            return None
        ran = store.execution_outcomes(conn, [row.id]).get(row.id)
        denied = any(
            d.decision == "deny" and decision_intact(gate.keyring, d)
            for d in store.decisions(conn, row.id, row.version)
        )
    return row.status, said_status(row, ran, denied, approval_verifies(gate.keyring, row))


def card_view(gate: EffectGate, approval_id: str) -> dict[str, Any]:
    """Everything a reviewer's card shows, read from the store: the card, its arguments folded,
    the subject's history and balance, other decisions in flight on the subject, the decisions
    taken, the result once executed, and the countdown; the status column (`column`) and the status
    the card shows (`shown`, see `card_status`); `intact`, whether the record verifies (a
    record sealed under a key this keyring lacks does not: its card shows the keyring mismatch, see
    `keyring_warnings`). Raises UnknownApproval."""
    checked = gate.card(approval_id)
    [card] = keyring_warnings(gate, [checked])
    view = gate.subject_view(approval_id)
    with gate.store.reading() as conn:  # only the decisions whose seal verifies are the card's
        decisions = [d for d in gate.store.decisions(conn, approval_id) if decision_intact(gate.keyring, d)]
    column, shown = card_status(gate, card.approval_id) or (card.status, card.status)
    try:  # what ran is read from the executions, whatever the status column says
        result = gate.result(approval_id) if shown == "executed" else None
    except StoreError as exc:  # its stored result edited outside effectgate: the card says so
        result, card = None, dataclasses.replace(card, warnings=(*card.warnings, str(exc)))
    return {
        "card": card,
        "column": column,
        "shown": shown,
        "intact": TAMPERED_WARNING not in checked.warnings,
        "args": fold(json_value(card.args)),  # edited in the database: any JSON
        "view": view,
        "in_flight": [e for e in view.history if e.status in ("pending", "approved")],
        "decisions": decisions,
        "result": result,
        "expires": countdown(card.expires_at, gate.clock.now()),
    }
