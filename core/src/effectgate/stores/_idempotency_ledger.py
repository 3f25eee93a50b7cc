"""The idempotency store's protocol: exactly-once execution keyed by an operation key.

`base.IdempotencyStore` owns the rules and `SQLStore` implements them; `protocol.Store` composes
this protocol with the others, and `protocol` (where to import it from) states what every method
may raise and how `conn` is used.
"""

from __future__ import annotations

from typing import Any, Protocol

from .._clock import Clock
from .base import Claimed, ExpiredLease, IdempotencyRecord, Stored


class IdempotencyLedger(Protocol):
    """Exactly-once execution keyed by an operation key (`base.IdempotencyStore` owns the rules)."""

    clock: Clock

    def claim(
        self,
        key: str,
        payload_hash: str,
        *,
        owner: str | None = None,
        lease_seconds: float = 60.0,
        on_expired_lease: ExpiredLease = "reconcile",
        conn: Any = None,
        user_id: str | None = None,
    ) -> Claimed | Stored:
        """Take the lease on `key` or return its stored result. Raises `IdempotencyConflict`
        (same key, other payload), `InProgress` (a live lease), `NeedsReconciliation`.
        `user_id`: the user the call is made for, kept with a new record (a redaction of the
        user is refused while it is in flight)."""

    def complete(
        self, key: str, owner: str, result: Any, *, provider_ref: str | None = None, conn: Any = None
    ) -> IdempotencyRecord:
        """Store the result (the lease owner only). Raises `LeaseLost`."""

    def fail(self, key: str, owner: str, error: str, *, conn: Any = None) -> None:
        """A definite failure (the lease owner only). Raises `LeaseLost`."""

    def lost_connection(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by one of this store's transactions, is its connection lost (the
        transaction did not commit, or its commit's outcome is unknown)."""

    def renew_lease(self, key: str, owner: str, *, lease_seconds: float) -> bool:
        """Extend a running operation's lease to `lease_seconds` from now (the lease owner only,
        in flight only; its own transaction). False when the lease is lost."""

    def set_provider_ref(self, key: str, owner: str, provider_ref: str) -> None:
        """Persist the provider's reference while the call is in flight (its own transaction,
        committed before it returns; the lease owner only). Raises `LeaseLost`."""

    def mark_needs_reconciliation(
        self, key: str, owner: str, reason: str, *, provider_ref: str | None = None, conn: Any = None
    ) -> None:
        """Park an unknown outcome (the lease owner only). Raises `LeaseLost`."""

    def expire_lease(self, key: str, *, now: float, reason: str, conn: Any = None) -> bool:
        """An in-flight record whose lease ran out before `now` becomes needs_reconciliation;
        True if this call changed it (False: not in flight, or its lease is live)."""

    def resolve(
        self, key: str, result: Any, *, provider_ref: str | None = None, conn: Any = None
    ) -> IdempotencyRecord:
        """Reconciliation found the effect: succeeded. Raises `StoreError` if not awaiting it."""

    def release(self, key: str, reason: str, *, conn: Any = None) -> None:
        """Reconciliation found no effect: failed. Raises `StoreError` if not awaiting it."""

    def reopen(self, key: str, reason: str, *, conn: Any = None) -> bool:
        """A `failed` record back to needs_reconciliation (a run that lost its lease returned after
        the record was released or failed); True if it changed."""

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key` (its own transaction), or None."""

    def load(self, conn: Any, key: str) -> IdempotencyRecord | None:
        """The record of `key` inside `conn`'s transaction, or None."""

    def awaiting(self, conn: Any, key: str) -> IdempotencyRecord | None:
        """The record of `key` if it awaits reconciliation, locked until `conn`'s transaction ends."""

    def idempotency_records(
        self, *, status: str | None = None, unreadable: list[str] | None = None
    ) -> list[IdempotencyRecord]:
        """Every record (of one status), oldest first; with `unreadable`, one edited so that it
        cannot be read (StoreError) is left out and its key put there instead of raising."""
