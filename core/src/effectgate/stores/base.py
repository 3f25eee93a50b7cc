"""The idempotency store's semantics. Backends implement four small atomic primitives.

A record moves through:

    (absent) --claim--> in_progress --complete(owner)--> succeeded
                              |  \\--fail(owner)--------> failed --claim--> in_progress (retry)
                              |  \\--unknown outcome----> needs_reconciliation
                              \\--lease expired, claimed again--> needs_reconciliation (default)

- Same key and payload after success: the stored result, nothing runs (`Stored`).
- Same key, different payload: `IdempotencyConflict`. A live lease: `InProgress`.
- Completing needs the lease owner (fencing): a worker whose lease was taken over gets `LeaseLost`.
- An unknown outcome is never `failed` and never re-run silently; it waits for `resolve`
  (the provider says it happened) or `release` (the provider says it never saw the key).
- A record is never deleted when the wrapped function raises: the next retry would repeat it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from numbers import Real
from typing import Any, Literal

import pydantic_core
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .._clock import SYSTEM_CLOCK, Clock, uuid4_hex
from .._json import parse
from ..errors import IdempotencyConflict, InProgress, LeaseLost, NeedsReconciliation, StoreError
from ._dialect import REDACTED_PREFIX

Status = Literal["in_progress", "succeeded", "failed", "needs_reconciliation"]


def to_json(value: Any) -> str:
    """JSON text of a result; pydantic models, dataclasses and datetimes included. A value whose
    text would start like an erasure marker (a tool echoing model-written data) is stored with a
    leading space: the same JSON, but only `redact` writes a stored value that starts like one."""
    return unmarked(pydantic_core.to_json(value).decode())


def unmarked(text: str) -> str:
    """JSON `text` as stored where only `redact` writes what starts like an erasure marker: one
    that would (a result echoing model text, an event's detail) gets a leading space."""
    return " " + text if text.startswith(REDACTED_PREFIX) else text


def from_json(text: str | None) -> Any:
    return None if text is None else parse(text)


def lease_of(seconds: object) -> float:
    """A lease's length: a positive, finite number (NaN is stored as NULL, a lease no claim or
    `recover` ever sees run out; zero or less is over before its tool starts)."""
    if not isinstance(seconds, Real) or not 0 < float(seconds) < float("inf"):
        raise ValueError(f"lease_seconds must be a positive, finite number of seconds (got {seconds!r})")
    return float(seconds)


@dataclass(frozen=True, kw_only=True)
class IdempotencyRecord:
    key: str
    payload_hash: str
    status: Status
    lease_owner: str | None
    lease_expires_at: float | None
    result: Any
    error: str | None
    provider_ref: str | None
    attempts: int
    created_at: float
    updated_at: float
    user_id: str | None = None  # the user the call is made for (None: not named, or schema < 5)


@dataclass(frozen=True)
class Claimed:
    """This worker holds the lease: run, then `complete` or `fail` with `owner`."""

    key: str
    owner: str
    attempt: int


@dataclass(frozen=True)
class Stored:
    """The operation already succeeded; here is its stored result. Nothing ran."""

    record: IdempotencyRecord

    @property
    def result(self) -> Any:
        return self.record.result


ExpiredLease = Literal["reconcile", "reclaim"]


class IdempotencyStore(ABC):
    """Exactly-once execution keyed by an operation key. Usable on its own."""

    clock: Clock = SYSTEM_CLOCK

    # -- primitives a backend implements (each one statement, inside the caller's transaction)

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Connection]:
        """A write transaction; commits on success, rolls back on error."""

    @abstractmethod
    def _insert_claim(self, conn: Connection, values: dict[str, Any]) -> bool:
        """Insert the in_progress record unless the key exists; True if this call inserted it."""

    @abstractmethod
    def _load(self, conn: Connection, key: str) -> IdempotencyRecord | None: ...

    @abstractmethod
    def _transition(
        self,
        conn: Connection,
        key: str,
        *,
        from_status: tuple[Status, ...],
        owner: str | None = None,
        lease_expired_before: float | None = None,
        values: dict[str, Any],
    ) -> IdempotencyRecord | None:
        """Update the record only if it is in one of `from_status` (and held by `owner`, and its
        lease expired before the given time, when given); the updated record, or None."""

    # -- semantics

    def _tx(self, conn: Connection | None) -> AbstractContextManager[Connection]:
        return _Reuse(conn) if conn is not None else self.transaction()

    def _single(self) -> AbstractContextManager[Connection]:
        """A connection for one statement that commits by itself. By default a transaction; a
        backend with autocommit overrides it (no BEGIN and COMMIT around one atomic statement:
        on a server database those are two more round trips)."""
        return self.transaction()

    def _one(self, conn: Connection | None) -> AbstractContextManager[Connection]:
        """Where an operation that is one statement runs: the caller's transaction, or its own."""
        return _Reuse(conn) if conn is not None else self._single()

    def get(self, key: str) -> IdempotencyRecord | None:
        with self._single() as conn:
            return self._load(conn, key)

    def load(self, conn: Connection, key: str) -> IdempotencyRecord | None:
        """The record of `key` inside the caller's transaction, or None."""
        return self._load(conn, key)

    def expire_lease(self, key: str, *, now: float, reason: str, conn: Connection | None = None) -> bool:
        """An in-flight record whose lease ran out before `now` becomes needs_reconciliation (its
        outcome is unknown); True if this call changed it."""
        values = {"status": "needs_reconciliation", "error": reason, "updated_at": now}
        with self._one(conn) as c:
            changed = self._transition(
                c, key, from_status=("in_progress",), lease_expired_before=now, values=values
            )
        return changed is not None

    def claim(
        self,
        key: str,
        payload_hash: str,
        *,
        owner: str | None = None,
        lease_seconds: float = 60.0,
        on_expired_lease: ExpiredLease = "reconcile",
        conn: Connection | None = None,
        user_id: str | None = None,
    ) -> Claimed | Stored:
        """Take the lease on `key`, or return the stored result; see the module docstring.

        `on_expired_lease="reconcile"` (the default, for anything with effects): a lease that
        expired while in flight means the outcome is unknown, so the record becomes
        needs_reconciliation and `NeedsReconciliation` is raised. `"reclaim"`: take it over
        (only for operations that are safe to repeat).
        """
        owner, now = owner or uuid4_hex(), self.clock.now()
        lease = {"lease_owner": owner, "lease_expires_at": now + lease_of(lease_seconds), "updated_at": now}
        values = {
            "key": key,
            "payload_hash": payload_hash,
            "status": "in_progress",
            "attempts": 1,
            "created_at": now,
            "user_id": user_id,
            **lease,
        }
        if conn is None:  # a new key is one atomic statement; anything else is decided below
            with self._single() as c:
                if self._insert_claim(c, values):
                    return Claimed(key, owner, 1)
        with self._tx(conn) as c:
            if self._insert_claim(c, values):
                return Claimed(key, owner, 1)
            record = self._load(c, key)
            if record is None:  # pragma: no cover - a row that conflicted cannot vanish
                raise StoreError(f"idempotency record {key} vanished during the claim")
            if record.payload_hash != payload_hash:
                raise IdempotencyConflict(key)
            if record.status == "succeeded":
                return Stored(record)
            if record.status == "needs_reconciliation":
                raise NeedsReconciliation(
                    key, record.error or "outcome unknown", provider_ref=record.provider_ref
                )
            if type(record.attempts) is not int:  # edited outside effectgate (SQLite keeps any type)
                raise StoreError(
                    f"idempotency record {key}: its attempts are not a count (edited outside effectgate)"
                )
            # a new attempt: the earlier one's error and provider reference are not its own
            retry = {
                **lease,
                "status": "in_progress",
                "attempts": record.attempts + 1,
                "error": None,
                "provider_ref": None,
                "user_id": record.user_id or user_id,  # one schema 4 wrote names none: its retry does
            }
            if record.status == "failed":
                if self._transition(c, key, from_status=("failed",), values=retry):
                    return Claimed(key, owner, record.attempts + 1)
                raise InProgress(key, None)  # pragma: no cover - lost a race inside one tx
            # in_progress
            if record.lease_expires_at is not None and record.lease_expires_at > now:
                raise InProgress(key, record.lease_owner)
            if on_expired_lease == "reclaim":
                if self._transition(
                    c, key, from_status=("in_progress",), lease_expired_before=now, values=retry
                ):
                    return Claimed(key, owner, record.attempts + 1)
                raise InProgress(key, None)  # pragma: no cover
            reason = f"lease of {record.lease_owner} expired while in flight"
            if not self._transition(
                c,
                key,
                from_status=("in_progress",),
                lease_expired_before=now,
                values={"status": "needs_reconciliation", "error": reason, "updated_at": now},
            ):  # changed since it was read (PostgreSQL): its holder renewed or settled it
                current = self._load(c, key)
                if current is not None and current.status == "succeeded":
                    return Stored(current)
                if current is None or current.status != "needs_reconciliation":
                    raise InProgress(key, None if current is None else current.lease_owner)
                record, reason = current, current.error or reason
        expired = record.status == "in_progress"  # this claim made it so (not a race it lost)
        raise NeedsReconciliation(key, reason, provider_ref=record.provider_ref, expired=expired)

    def complete(
        self,
        key: str,
        owner: str,
        result: Any,
        *,
        provider_ref: str | None = None,
        conn: Connection | None = None,
    ) -> IdempotencyRecord:
        """Store the result; the lease owner only (also settles a reconciliation it caused)."""
        now = self.clock.now()
        values = {
            "status": "succeeded",
            "result_json": to_json(result),
            "updated_at": now,
            "lease_expires_at": None,
            "error": None,
        }
        if provider_ref is not None:
            values["provider_ref"] = provider_ref
        with self._one(conn) as c:
            record = self._transition(
                c, key, from_status=("in_progress", "needs_reconciliation"), owner=owner, values=values
            )
        if record is None:
            raise LeaseLost(key, owner)
        return record

    def fail(self, key: str, owner: str, error: str, *, conn: Connection | None = None) -> None:
        """A definite failure: nothing happened downstream; the same key may be claimed again."""
        now = self.clock.now()
        values = {"status": "failed", "error": error, "updated_at": now, "lease_expires_at": None}
        with self._one(conn) as c:
            if not self._transition(c, key, from_status=("in_progress",), owner=owner, values=values):
                raise LeaseLost(key, owner)

    def mark_needs_reconciliation(
        self,
        key: str,
        owner: str,
        reason: str,
        *,
        provider_ref: str | None = None,
        conn: Connection | None = None,
    ) -> None:
        """The outcome is unknown (timeout, lost reply): park it for reconciliation."""
        now = self.clock.now()
        values: dict[str, Any] = {"status": "needs_reconciliation", "error": reason, "updated_at": now}
        if provider_ref is not None:
            values["provider_ref"] = provider_ref
        with self._one(conn) as c:
            if not self._transition(c, key, from_status=("in_progress",), owner=owner, values=values):
                raise LeaseLost(key, owner)

    def awaiting(self, conn: Connection, key: str) -> IdempotencyRecord | None:
        """The record of `key` if it awaits reconciliation, read under its row lock in the caller's
        transaction (a compare-and-set of its `updated_at`): a settlement racing this one waits for
        its end, then finds the record settled or run again; None if it does not await it."""
        values = {"updated_at": self.clock.now()}
        return self._transition(conn, key, from_status=("needs_reconciliation",), values=values)

    def lost_connection(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by one of this store's transactions, is the database connection
        lost (the server went away, a failover): the transaction did not commit, or its COMMIT's
        outcome is unknown. The connection is already discarded from the pool."""
        return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)

    def renew_lease(self, key: str, owner: str, *, lease_seconds: float) -> bool:
        """Extend a running operation's lease to `lease_seconds` from now (the lease owner only,
        while in flight; its own statement). False when the record is no longer this owner's in
        flight (`recover` made it needs_reconciliation, or it settled): the lease is lost."""
        now = self.clock.now()
        values = {"lease_expires_at": now + lease_of(lease_seconds), "updated_at": now}
        with self._single() as c:
            return (
                self._transition(c, key, from_status=("in_progress",), owner=owner, values=values) is not None
            )

    def set_provider_ref(self, key: str, owner: str, provider_ref: str) -> None:
        """Persist the provider's reference (e.g. a 202 processing id) while still in flight."""
        values = {"provider_ref": provider_ref, "updated_at": self.clock.now()}
        with self._single() as c:
            if not self._transition(c, key, from_status=("in_progress",), owner=owner, values=values):
                raise LeaseLost(key, owner)

    def resolve(
        self, key: str, result: Any, *, provider_ref: str | None = None, conn: Connection | None = None
    ) -> IdempotencyRecord:
        """Reconciliation found the effect happened: the record succeeds with `result`, its lease
        owner cleared (the run that held it did not settle it: see `Settlement.landed`)."""
        now = self.clock.now()
        values = {
            "status": "succeeded",
            "result_json": to_json(result),
            "updated_at": now,
            "error": None,
            "lease_owner": None,
        }
        if provider_ref is not None:
            values["provider_ref"] = provider_ref
        with self._one(conn) as c:
            record = self._transition(c, key, from_status=("needs_reconciliation",), values=values)
        if record is None:
            raise StoreError(f"key {key} is not awaiting reconciliation")
        return record

    def release(self, key: str, reason: str, *, conn: Connection | None = None) -> None:
        """Reconciliation found the provider never saw the key: it may run again, same key."""
        values = {"status": "failed", "error": reason, "updated_at": self.clock.now()}
        with self._one(conn) as c:
            if not self._transition(c, key, from_status=("needs_reconciliation",), values=values):
                raise StoreError(f"key {key} is not awaiting reconciliation")

    def reopen(self, key: str, reason: str, *, conn: Connection | None = None) -> bool:
        """A run that lost its lease returned after its record was released or failed: its effect
        may have happened, so a `failed` record (no one holds it) needs reconciliation again, and
        is not claimed for a fresh run. True if this call changed it."""
        values = {"status": "needs_reconciliation", "error": reason, "updated_at": self.clock.now()}
        with self._one(conn) as c:
            return self._transition(c, key, from_status=("failed",), values=values) is not None

    def run(self, key: str, payload_hash: str, fn: Callable[[], Any], *, lease_seconds: float = 60.0) -> Any:
        """Run `fn` at most once for `key`: claim, run, complete; or return the stored result.
        A connection lost while the claim or the completion commits: see `_run`."""
        from ._run import run  # it imports this module

        return run(self, key, payload_hash, fn, lease_seconds)


class _Reuse(AbstractContextManager[Connection]):
    """Run inside a transaction the caller already opened."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def __enter__(self) -> Connection:
        return self._conn

    def __exit__(self, *exc: object) -> None:
        return None
