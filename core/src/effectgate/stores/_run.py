"""`IdempotencyStore.run`: a function run at most once for a key, on the store on its own.

The connection lost while the claim or the completion commits (a failover, a dropped socket)
leaves its outcome unknown to the caller, not to the record: read back, a record in flight under
this run's lease was claimed by it (the function runs), and one succeeded under it was completed
by it. Otherwise the completion (or a failure, an unknown outcome: `_once_more`) runs once more
on a fresh connection, as the gate's settlement does: before, the driver's error was raised, and
the record stayed in flight (a retry was `InProgress`, then after the lease
`NeedsReconciliation`) for a function that never ran or whose outcome was known. A `TimeoutError`
is an unknown outcome, as `OutcomeUnknown` is (the gate's writes take it so): before, the record
ended `failed` and the next `run` of the key ran the function again. So is a coroutine or a
generator `fn` returned and did not run (an async function passed as `fn`): before, it was
stored as succeeded (`{"unserializable": "coroutine"}`) with nothing run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pydantic_core
from sqlalchemy.exc import DBAPIError

from .._clock import uuid4_hex
from .._flowjobs import ran
from ..errors import NeedsReconciliation, OutcomeUnknown, describe
from .base import Claimed, Stored

if TYPE_CHECKING:
    from .base import IdempotencyStore


def run(
    store: IdempotencyStore, key: str, payload_hash: str, fn: Callable[[], Any], lease_seconds: float
) -> Any:
    owner = uuid4_hex()
    try:
        claim = store.claim(key, payload_hash, owner=owner, lease_seconds=lease_seconds)
    except DBAPIError as exc:  # its commit may have landed: claimed if the record is in flight under it
        record = store.get(key) if store.lost_connection(exc) else None
        if record is None or (record.status, record.lease_owner, record.payload_hash) != (
            "in_progress",
            owner,
            payload_hash,
        ):
            raise
        claim = Claimed(key, owner, record.attempts)
    if isinstance(claim, Stored):
        return claim.result
    try:
        result = ran(fn())  # a coroutine or generator it returned unrun: an unknown outcome
    except (OutcomeUnknown, TimeoutError) as exc:  # a timeout may have landed, as the gate's writes say
        why, ref = str(exc) or describe(exc), getattr(exc, "provider_ref", None)
        _once_more(store, key, owner, why, ref, unknown=True)
        raise NeedsReconciliation(key, why, provider_ref=ref) from exc
    except Exception as exc:
        _once_more(store, key, owner, describe(exc), None, unknown=False)
        raise
    try:
        return _complete(store, key, owner, result)
    except pydantic_core.PydanticSerializationError:  # it ran: stored as the gate's `storable` does
        return _complete(store, key, owner, {"unserializable": type(result).__name__})


def _complete(store: IdempotencyStore, key: str, owner: str, result: Any) -> Any:
    try:
        return store.complete(key, owner, result).result
    except DBAPIError as exc:
        if not store.lost_connection(exc):
            raise
        record = store.get(key)
        if record is not None and record.status == "succeeded" and record.lease_owner == owner:
            return record.result  # its commit landed
        return store.complete(key, owner, result).result


def _once_more(
    store: IdempotencyStore, key: str, owner: str, why: str, ref: str | None, *, unknown: bool
) -> None:
    """The function's unknown outcome or definite failure stored; once more on a fresh connection
    after a lost one while the record, read back, is still in flight under this run's lease (else
    the lost commit landed, or another attempt holds the key: never stored over). Before, the
    driver's error replaced the function's, and the record stayed in flight."""
    for again in (False, True):
        try:
            if unknown:
                store.mark_needs_reconciliation(key, owner, why, provider_ref=ref)
            else:
                store.fail(key, owner, why)
            return
        except DBAPIError as exc:
            if again or not store.lost_connection(exc):
                raise
            record = store.get(key)
            if record is None or (record.status, record.lease_owner) != ("in_progress", owner):
                return
