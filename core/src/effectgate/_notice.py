"""Notifications: the gate tells people when a decision waits, is about to lapse, or when an
operation's outcome is unknown. Delivery is someone else's job (`effectgate.notify`); the gate
only builds the notice from the stored record, hands it to the hook after its transaction has
committed, and records a hook that raises. A hook never blocks or breaks a call.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._deps import Deps, Events
from ._ledger import Ledger
from ._logging import logger
from .errors import ApprovalError, PolicyViolation, storable_text
from .outcomes import TAMPERED_WARNING, Card, ReconciliationNotice
from .stores.records import ApprovalRow
from .tokens import Keyring

log = logger("effectgate.notify")

NotificationKind = Literal["pending", "expiring", "needs_reconciliation"]
#: What a notice's `record` appends: a notifier's own events only. The gate reads its own kinds
#: back to decide (`token_used` spends a grant, `expiry_warning` silences a warning, `proposed`
#: names a version): a hook that could append one could void the approval it announces.
NOTIFIER_EVENT = re.compile(r"(notify|webhook)_[a-z0-9_]{1,48}")


def _no_record(kind: str, detail: Mapping[str, Any]) -> None:
    return None


def _sync_hook(hook: object, what: str) -> None:
    """Refuse (TypeError) an `async def` hook: the gate calls hooks synchronously after a
    commit, and a coroutine nobody awaits is a notice lost without a trace. So is one that is not
    callable at all (a set of notifiers, a generator, a webhook URL given as `notify=`, whose
    letters were taken for notifiers): every notice would fail."""
    if not callable(hook):
        raise TypeError(
            f"{what} must be callable (a function or a WebhookNotifier; several in a list or "
            f"tuple), not {type(hook).__name__}"
        )
    call = getattr(hook, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(call):
        raise TypeError(
            f"{what} is an async function, and the gate calls it synchronously after its commit "
            "(the notice would be a coroutine no one awaits): give a plain function, which may "
            "hand the notice to your event loop (asyncio.run_coroutine_threadsafe)"
        )


def _own_keys(hook: object, keyring: Keyring, what: str) -> None:
    """Refuse (ValueError) a hook that signs with the gate's grant keyring, found on the hook or
    on what it wraps (a bound method's object, a `functools.partial`'s function, a decorator's
    `__wrapped__`): whoever checks its signatures could mint grants."""
    seen: list[object] = []
    todo: list[object] = [hook]
    while todo and len(seen) < 16:
        item = todo.pop()
        if any(item is s for s in seen):
            continue
        seen.append(item)
        for name in ("keyring", "__self__", "func", "__wrapped__"):
            try:
                found = getattr(item, name, None)
            except Exception:  # noqa: S112 - an attribute that raises holds no keyring
                continue
            if isinstance(found, Keyring):
                if found.shares_key(keyring):
                    raise ValueError(
                        f"{what} must not sign with the gate's grant keyring: give it its own keys"
                    )
            elif found is not None and name != "keyring":
                todo.append(found)


def _failure(exc: Exception) -> str:
    """A hook's exception as its failure is recorded: its repr, as a database stores it (a lone
    surrogate escaped), or its type alone when its repr raises (which must not replace the
    outcome the hook was told of, e.g. a NeedsReconciliation, with its own error)."""
    try:
        return storable_text(repr(exc))
    except Exception:
        return f"{type(exc).__name__}(no text)"


def _own_card(card: Card) -> Card:
    """A copy of `card` no hook's edit reaches the caller's or another hook's through: its values
    are parsed JSON (dicts, lists, scalars), copied as such (`deepcopy` cost 3x, per propose)."""
    return replace(card, args=_plain(card.args), subject=_plain(card.subject), notes=_plain(card.notes))


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if kind is list else value


def _called(hook: Callable[[Any], Any], notice: Any) -> None:
    """`hook(notice)`; a result that is awaitable (a plain function returning a coroutine) is
    a notice no one will deliver: closed, and raised as the hook's failure."""
    result = hook(notice)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: no "never awaited" warning at its collection
        raise TypeError("the hook returned an awaitable, which the gate never awaits: nothing was sent")


@dataclass(frozen=True, kw_only=True)
class Notification:
    """One thing a person must look at, built from the stored record (never from model text).

    `kind`: "pending" (a new approval or a new version of one), "expiring" (a pending approval
    whose deadline is near; sent once per version), "needs_reconciliation" (the provider's
    outcome is unknown: page the role). `approver_role` is who should look: the approval's role
    after escalation, or the tool's owner for a write; for an approval record that does not
    verify, the table's approver role of its tool (never the role an edit wrote). `intact`:
    whether the approval record behind a notice without a card verifies (None: there is none, a
    write's unknown outcome); a card says it itself (`Card.warnings`). `record(kind, detail)`
    appends an event about this notice to the gate's log (how a notifier records its
    deliveries): a notifier's own kinds only, `notify_*` or `webhook_*` (ValueError otherwise:
    never one of the gate's, which decide). `nonce` tells apart two notices of one kind about one
    record: an unknown outcome carries its operation's attempt and when its record last changed, so
    a run again that ends unknown again, or a settled record its late run reopened, is a page of
    its own, while the same outcome told again (a grant presented once more) is the same page;
    None for "pending" and "expiring", which come once per version."""

    kind: NotificationKind
    tool: str
    approver_role: str | None
    at: float
    approval_id: str | None = None
    version: int | None = None
    card: Card | None = None
    reason: str | None = None
    key: str | None = None
    provider_ref: str | None = None
    intact: bool | None = None
    nonce: str | None = None
    record: Callable[[str, Mapping[str, Any]], None] = field(default=_no_record, repr=False, compare=False)


Notify = Callable[[Notification], None]


class Notices:
    """The gate's side of notifications: build, hand over, record failures; expiry warnings.
    `on_needs_reconciliation` is the older single hook for unknown outcomes (still supported)."""

    def __init__(
        self,
        deps: Deps,
        events: Events,
        ledger: Ledger,
        notifiers: Sequence[Notify],
        on_needs_reconciliation: Callable[[ReconciliationNotice], None] | None,
    ) -> None:
        self.table = deps.table
        self.store = deps.store
        self.clock = deps.clock
        self.events = events
        self.notifiers = tuple(notifiers)
        for hook in self.notifiers:
            _sync_hook(hook, "a notifier")
            _own_keys(hook, deps.keyring, "a notifier")
        if on_needs_reconciliation is not None:
            _sync_hook(on_needs_reconciliation, "on_needs_reconciliation")
            _own_keys(on_needs_reconciliation, deps.keyring, "on_needs_reconciliation")
        self.on_needs_reconciliation = on_needs_reconciliation
        self.ledger = ledger

    def _recorder(
        self, approval_id: str | None, version: int | None, tool: str, key: str | None = None
    ) -> Callable[..., None]:
        def record(kind: str, detail: Mapping[str, Any]) -> None:
            if not isinstance(kind, str) or not NOTIFIER_EVENT.fullmatch(kind):
                raise ValueError(
                    f"a notice records a notifier's own events (notify_*, webhook_*), not {kind!r}"
                )
            event = self.events.event(kind, tool=tool)
            event["detail_json"] = dict(detail)  # its keys are the notifier's, never the event's fields
            event.update(self._call_of(approval_id, key, tool))
            event.update(approval_id=approval_id, version=version)
            self.events.record(event)

        return record

    #: What an event about a call copies from the call's record: who it was for (so a redaction
    #: of the user, or a retention pass, reaches the event: its detail may quote personal values)
    _CALL_FIELDS = ("effect", "args_hash", "session_id", "origin_message_id", "user_id", "agent_id", "run_id")

    def _call_of(self, approval_id: str | None, key: str | None, tool: str) -> dict[str, Any]:
        """The call fields of a notice's event: from its approval, or (a write's unknown outcome)
        from the write's execution with that idempotency key; {} when neither is found."""
        found: Any = None
        if approval_id is not None:
            found = self.store.get_approval(approval_id)
        elif key is not None:  # rare (an unknown outcome of a write): read that tool's executions
            found = next(
                (x for x in reversed(self.store.executions(tool=tool)) if x.idempotency_key == key), None
            )
        if found is None:
            return {}
        return {name: getattr(found, name) for name in self._CALL_FIELDS} | {"model_id": found.model_id}

    def announce(
        self,
        kind: NotificationKind,
        *,
        tool: str,
        role: str | None,
        card: Card | None = None,
        approval_id: str | None = None,
        version: int | None = None,
        **extra: Any,
    ) -> None:
        """Hand one notice to every hook; call only after the transaction that caused it committed."""
        if not self.notifiers:
            return
        if card is not None:
            approval_id, version = card.approval_id, card.version
        notice = Notification(
            kind=kind,
            tool=tool,
            approver_role=role,
            at=self.clock.now(),
            approval_id=approval_id,
            version=version,
            card=card,
            record=self._recorder(approval_id, version, tool, extra.get("key")),
            **extra,
        )
        for hook in self.notifiers:
            try:
                # Each hook its own copy of the card: one that edits it (a notifier dropping a
                # value before it posts) changes neither the caller's card, which is what a
                # reviewer is shown (an adapter's interrupt), nor what the next hook sends.
                _called(hook, notice if card is None else replace(notice, card=_own_card(card)))
            except Exception as exc:  # a notifier must never break the gate; its failure is kept
                try:
                    notice.record("notify_failed", {"notification": kind, "error": _failure(exc)})
                except Exception:  # the store itself is down; the call's result stands
                    log.exception("could not record a failed %s notice for %s", kind, tool)

    def announce_card(self, kind: NotificationKind, card: Card) -> None:
        role = card.approver_role if TAMPERED_WARNING not in card.warnings else self._tables_role(card.tool)
        self.announce(kind, tool=card.tool, role=role, card=card)

    def _tables_role(self, tool: str) -> str | None:
        """Whom to tell about a record that does not verify: never the role its edit names, but
        the table's approver role of the tool (its owner for a write); None for no such tool."""
        spec = self.table.get(tool)
        return None if spec is None else spec.approver_role or spec.owner

    def unknown_outcome(
        self, row: ApprovalRow | None, key: str, reason: str, ref: str | None, *, tool: str | None = None
    ) -> None:
        """Page the approver role (or the tool's owner, for a write) about an unknown outcome; a
        failing hook is recorded and never breaks the gate. The approval row is verified first
        (it may have been read back raw, as `recover` does): a notice of a row that does not
        verify says so (`intact` False), and a notifier never presents it as effectgate's; nor
        one whose key names an approval that no row holds (deleted in the database): no write's."""
        from ._reconciled import approval_of_key  # it imports the executor, which imports this

        named = approval_of_key(key) if row is None else None
        intact = self.ledger.verifies(row) if row is not None else (False if named else None)
        role: str | None = None  # a write: its tool's owner (below)
        if row is not None:  # a row that does not verify: the table's role, never its edit's
            role = row.approver_role if intact else self._tables_role(tool or row.tool)
        notice = ReconciliationNotice(
            key=key,
            tool=row.tool if row else (tool or ""),
            reason=reason,
            approval_id=row.id if row else (named[0] if named else None),
            approver_role=role,
            provider_ref=ref,
            intact=intact,
        )
        if role is None and (spec := self.table.get(notice.tool)) is not None:
            role = spec.owner
        self.announce(
            "needs_reconciliation",
            tool=notice.tool,
            role=role,
            approval_id=notice.approval_id,
            version=row.version if row else (named[1] if named else None),
            reason=reason,
            key=key,
            provider_ref=ref,
            intact=intact,
            nonce=self._attempt(key),
        )
        hook = self.on_needs_reconciliation
        if hook is None:
            return
        event = self.events.event
        detail: dict[str, Any]
        try:
            _called(hook, notice)
            kind, detail = "notified", {"role": notice.approver_role}
        except Exception as exc:
            kind, detail = "notify_failed", {"error": _failure(exc)}
        try:
            told = event(kind, row=row, tool=notice.tool, key=key, **detail)
            if row is None and kind == "notify_failed":  # a write: name its user, as `_recorder` does
                told.update(self._call_of(None, key, notice.tool))
            self.events.record(told)
        except Exception:  # the store itself is down: the outcome stands, as in `announce`
            log.exception("could not record %s for key=%s", kind, key)

    def _attempt(self, key: str) -> str | None:
        """Which unknown outcome of the operation `key` a notice is about: its record's attempts and
        when it last changed (a record released, then reopened by its late run, is a new page at
        the same attempt; the same outcome told again, nothing changed since, is the same page)."""
        try:
            record = self.store.get(key)
        except Exception:  # a page is never lost to a failing read: without it, as before
            log.warning("unknown outcome: the attempt of key=%s could not be read", key, exc_info=True)
            return None
        return None if record is None else f"attempt-{record.attempts}@{record.updated_at!r}"

    def _grantable(self, row: ApprovalRow) -> bool:
        """False when nobody can approve `row` under this gate's table and policy: its tool was
        taken off its agent's allowlist, or its table row or the policy changed since it was
        proposed (`Ledger.bar` refuses it: `not_allowed`, `reclassified`), so no one is paged to
        decide it. A row that does not verify (its tool or fingerprints edited: `bar` would refuse
        it as changed), or that `bar` finds edited, is warned about as before: its card says that
        it does not verify."""
        if not self.ledger.verifies(row):
            return True
        try:
            self.ledger.bar(row)
        except PolicyViolation:
            return False
        except (ApprovalError, ValueError, TypeError, RecursionError):
            return True
        return True

    def warn_expiring(self, *, within: float) -> list[Card]:
        """Notify about every pending approval that lapses within `within` seconds, once per
        version (a second scan, from this or another process, sends nothing new); not one that
        no one can approve under this gate's table and policy (`_grantable`). Returns the cards
        warned about now. Run it periodically (a scheduler)."""
        if not within > 0:  # NaN too: PostgreSQL sorts it above every deadline
            raise ValueError("within must be a positive number of seconds")
        ledger = self.ledger
        ledger.expire()
        now = self.clock.now()
        with self.store.reading() as conn:
            candidates = self.store.approvals_expiring(conn, now, now + within)
        warned: list[Card] = []
        for candidate in candidates:
            with self.store.transaction() as conn:
                # Serialise warnings for one approval across workers: check and record together.
                self.store.lock(conn, f"expiry-warning:{candidate.id}")
                row = self.store.approval(conn, candidate.id)
                if row is None or row.status != "pending" or row.expires_at <= now:
                    continue
                if not self._grantable(row):
                    continue
                if self.store.has_event(conn, "expiry_warning", row.id, row.version):
                    continue
                remaining = row.expires_at - now
                self.store.append_events(
                    conn, [self.events.event("expiry_warning", row=row, seconds_left=round(remaining, 3))]
                )
                card = ledger.card_of(conn, row)
            warned.append(card)
            self.announce_card("expiring", card)
        return warned
