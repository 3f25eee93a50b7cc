"""Legal holds (`effectgate.redact.hold`, `release`, `holds`): while a user is held, no redaction
or retention pass erases their records. A hold and its release take the erasure lock
(`chain.ERASURE_LOCK`), so neither commits under a running erasure: one already running read the
holds before it, and one that starts after sees it."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from .chain import ERASURE_LOCK
from .context import _storable
from .errors import EffectGateError
from .stores._dialect import is_redacted
from .stores.protocol import Store
from .stores.records import HoldRow


class RedactionError(EffectGateError):
    """A redaction, retention pass or hold was refused; nothing was changed."""


class UnknownFact(RedactionError, ValueError):
    """A name in `keep` that no record could hold (a typo would keep nothing, erasing the fact it
    meant: `amout` for amount); nothing was erased."""


def _names(text: str | None, schema: bool = False) -> set[str]:
    """The top-level argument names of stored arguments (`schema`: of a rule row's schema)."""
    try:
        value = json.loads(text or "null")
        value = value.get("schema", {}).get("properties") if schema else value
    except (ValueError, TypeError, AttributeError, RecursionError):  # no gate wrote it: no names
        return set()
    marked = isinstance(text, str) and is_redacted(text)
    return set(value) if isinstance(value, dict) and not marked else set()


def known_names(store: Store, keep: Sequence[str], facts: Sequence[str]) -> set[str]:
    """The facts, and when `keep` names others, the arguments of every tool the ledger recorded a
    rule row for (its schema's properties): read before the erasure's transaction."""
    if not set(keep) - set(facts):
        return set(facts)
    rows = store.rules().values()
    return {*facts, *(n for r in rows if r.kind == "row" for n in _names(r.body_json, schema=True))}


def check_keep(keep: Sequence[str], known: set[str], targets: Iterable[Any]) -> None:
    """Refuse a name in `keep` that is not `known` (the facts, the recorded tools' arguments) and
    that no target's stored arguments hold."""
    unknown = set(keep) - known
    for t in targets if unknown else ():
        unknown -= _names(t.values.get("args_json"))
    if unknown:
        raise UnknownFact(
            f"keep names {', '.join(sorted(unknown))}: no argument of a recorded tool or of a record "
            "being erased (a typo?); nothing was erased"
        )


def _event(kind: str, at: float, **detail: Any) -> dict[str, Any]:
    return {"at": at, "kind": kind, "detail_json": detail}


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RedactionError(f"{name} must be a non-empty string")
    if not _storable(value):  # no database stores (or matches) it
        raise RedactionError(f"{name} holds a NUL character or a lone surrogate: nothing was changed")
    return value


def _at(now: float | None, store: Store) -> float:
    """The time of an erasure or hold: `now`, which must be finite (NaN or infinity would make a
    retention cut-off every record on PostgreSQL), or the store's clock, which stamps its rows (a
    retention age measured by another clock would erase records younger than the rule)."""
    if now is None:
        return float(store.clock.now())
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise RedactionError(f"now must be a finite number of seconds (got {now!r}): nothing was changed")
    return float(now)


def hold(store: Store, *, user_id: str, by: str, reason: str, now: float | None = None) -> HoldRow:
    """Place a legal hold on `user_id`'s records: no redaction or retention erases them until
    the hold is released. It takes the erasure lock (`ERASURE_LOCK`), so it waits for a
    redaction or retention pass already running (which read the holds before it) and one that
    starts after it sees it."""
    user_id = _text("user_id", user_id)
    if user_id != user_id.strip() or not user_id.isprintable():  # as `effectgate hold` refuses it
        raise RedactionError(
            f"user_id {user_id!r} has leading or trailing whitespace, or a control or invisible "
            "character: it is not the id the calls recorded, and its hold would hold nothing; nothing "
            "was placed"
        )
    placed = HoldRow(
        id=f"h-{secrets.token_hex(8)}",
        user_id=user_id,
        reason=_text("reason", reason),
        placed_by=_text("by", by),
        at=_at(now, store),
    )
    with store.transaction() as conn:
        store.lock(conn, ERASURE_LOCK)  # never committed under a running erasure (see above)
        store.add_hold(conn, placed)
        store.append_events(conn, [_event("hold", placed.at, hold_id=placed.id, user_id=user_id, by=by)])
    return placed


def release(
    store: Store, hold_id: str, *, by: str, reason: str | None = None, now: float | None = None
) -> None:
    """Release a hold; RedactionError if no active hold has that id. Who released it (`by`) is
    recorded on the hold, and with why (`reason`; `effectgate hold --release` requires one) in
    its `hold_released` event. Under the erasure lock, as `hold`: a running erasure's refusal of
    a held user stands until it ends."""
    at, by = _at(now, store), _text("by", by)
    _text("hold_id", hold_id)
    why = {} if reason is None else {"reason": _text("reason", reason)}
    with store.transaction() as conn:
        store.lock(conn, ERASURE_LOCK)
        if hold_id not in {h.id for h in store.holds(conn)}:  # the row, or its events: see `holds`
            raise RedactionError(f"no active legal hold {hold_id!r}")
        store.release_hold(conn, hold_id, by=by, at=at)
        store.append_events(conn, [_event("hold_released", at, hold_id=hold_id, by=by, **why)])


def refuse_held(store: Store, conn: Any, user_id: str, done: str) -> None:
    """RedactionError ("... under a legal hold: `done`") for a user under an active hold; read in
    `conn`, or in a transaction of its own when None."""
    active = store.holds(conn) if conn is not None else holds(store)
    if any(h.user_id == user_id for h in active):
        raise RedactionError(f"user {user_id!r} is under a legal hold: {done}")


def holds(store: Store, *, active: bool = True) -> list[HoldRow]:
    """The legal holds (only active ones, by default)."""
    with store.transaction() as conn:
        return list(store.holds(conn, active=active))
