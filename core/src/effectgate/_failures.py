"""A claimed run that did not succeed, recorded (`_settle.Settlement.run_claimed` runs it).

Whether a tool's exception is a definite failure (`definite`); a definite failure stored (the
record `failed`, a gated approval ended `failed`, the failed execution row and its event, in one
commit, once more on a fresh connection when the connection was lost and that commit did not
land); a run whose lease was lost, recorded as needing reconciliation and announced; and the
WARNING every execution that did not succeed is logged with (`log_outcome`). An unknown outcome
is stored by `_unknown.store_unknown`.

Logged on "effectgate._execution" (one logger for the whole execution), never the arguments or
the result.
"""

from __future__ import annotations

from typing import Any

from . import flow
from ._deps import Deps, Events, connection_lost
from ._late_erasure import erase_late
from ._logging import logger, one_line
from ._notice import Notices
from .chain import ERASURE_LOCK
from .context import CallContext
from .errors import LeaseLost, OutcomeUnknown, describe
from .stores.records import ApprovalRow
from .table import ToolSpec

log = logger("effectgate._execution")


def definite(spec: ToolSpec, *, gated: bool, exc: Exception) -> bool:
    """Whether a tool's exception is a definite failure (nothing happened downstream).

    A gated call (send, money, destructive) fails definitely only with an exception type its row
    lists in `definite_failures` (e.g. a provider's 4xx "card declined"); anything else, a
    connection reset or an HTTP client's timeout included, is an unknown outcome. A write fails
    definitely unless the exception is `OutcomeUnknown`, a `TimeoutError` or one its row lists in
    `unknown_outcome`. A coroutine closed before it started (`flow.NotStarted`) did nothing."""
    if isinstance(exc, flow.NotStarted):
        return True
    if isinstance(exc, (OutcomeUnknown, TimeoutError, *spec.unknown_outcome)):
        return False
    if gated:
        return isinstance(exc, spec.definite_failures)
    return True


def log_outcome(what: str, tool: str, row: ApprovalRow | None, key: str, reason: str) -> None:
    """A WARNING for an execution (gated, `row`) or a write that did not succeed: an unknown
    outcome or a definite failure, with the idempotency key and the reason."""
    kind, approval = ("execution", f" approval={row.id} version={row.version}") if row else ("write", "")
    log.warning("%s %s: tool=%s%s key=%s reason=%s", kind, what, tool, approval, key, one_line(reason))


class Failures:
    """Records runs that did not succeed; see the module docstring."""

    def __init__(self, deps: Deps, events: Events, notices: Notices) -> None:
        self.store = deps.store
        self.clock = deps.clock
        self.keyring = deps.keyring
        self.events = events
        self.notices = notices

    def record_lease_lost(
        self,
        spec: ToolSpec,
        ctx: CallContext,
        row: ApprovalRow | None,
        frozen: str,
        key: str,
        execution: dict[str, Any],
        result_json: str | None,
        exc: Exception | None = None,
        ref: str | None = None,
    ) -> None:
        """The tool returned (or raised `exc`), but its lease was gone: another worker took the
        operation over (`recover` found the lease expired while the tool still ran, and a reconcile
        may have run it again under the same key). This run is recorded, never dropped: an
        execution row with its result or error, needing reconciliation (it may have happened
        twice; only a provider that refuses a repeated key prevents that), and the approver role
        is notified. The caller raises LeaseLost (from `exc`: the tool's error is kept)."""
        error = describe(exc) if exc is not None else None
        what = f"{'raised' if error else 'returned'} after its lease was lost"
        reason = f"the tool {what} (another worker took the operation over)" + (f": {error}" if error else "")
        detail = {"reason": reason, "error": error} if error else {"reason": reason}
        with self.store.transaction() as conn:
            self.store.lock(conn, ERASURE_LOCK)  # before any write: see `erase_late`
            self.store.reopen(key, reason, conn=conn)  # released meanwhile: not claimed afresh
            self.store.append_execution(
                conn, status="needs_reconciliation", error=reason, result_json=result_json, **execution
            )
            self.store.append_events(
                conn,
                [
                    self.events.event(
                        "lease_lost", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, **detail
                    )
                ],
            )
            call = row.id if row is not None else key  # its call erased meanwhile: these values too
            at = self.clock.now()
            if erase_late(self.store, conn, self.keyring, user_id=ctx.user_id, call=call, at=at):
                reason = f"the tool {what} after its call was erased, with its values"  # none is paged
        log_outcome(what, spec.name, row, key, reason)
        self.notices.unknown_outcome(row, key, reason, ref, tool=spec.name)

    def record_failure(
        self,
        spec: ToolSpec,
        ctx: CallContext,
        row: ApprovalRow | None,
        frozen: str,
        key: str,
        owner: str,
        execution: dict[str, Any],
        exc: Exception,
        *,
        attempt: int,
        what: str = "",
    ) -> None:
        """A definite failure: the record is `failed`; a gated approval ends `failed` (terminal).
        Raises LeaseLost (from `exc`) when the lease was lost: see `record_lease_lost`."""
        error = what + describe(exc)
        failure = (spec, ctx, row, frozen, key, owner, execution, error)
        try:
            try:
                self.store_failure(failure)
            except Exception as lost:  # the connection lost: stored once more, unless it landed
                if isinstance(lost, LeaseLost) or not connection_lost(self.store, lost, exc):
                    raise
                if not self.failure_landed(key, owner, attempt):
                    self.store_failure(failure)
        except LeaseLost as lost:  # another worker took the operation over: its run is recorded
            self.record_lease_lost(spec, ctx, row, frozen, key, execution, None, exc)
            raise lost from exc
        log_outcome("failed (definite)", spec.name, row, key, error)

    def failure_landed(self, key: str, owner: str, attempt: int) -> bool:
        """Whether this attempt's failure, its COMMIT's reply lost, is settled: failed under its
        lease (it landed), or the key held by another attempt (claimed afresh since: a failed write
        runs again under its key), whose record is never stored over nor reopened."""
        if (record := self.store.get(key)) is None:
            return False
        if record.lease_owner == owner and record.attempts == attempt:
            return record.status == "failed"
        if other := record.attempts != attempt or record.lease_owner not in (owner, None):
            log.warning("connection lost while storing a failure; another attempt holds key=%s", key)
        return other

    def store_failure(self, failure: tuple[Any, ...]) -> None:
        """Fail the record and a gated approval, and append the failed execution: one commit."""
        spec, ctx, row, frozen, key, owner, execution, error = failure
        with self.store.transaction() as conn:
            self.store.fail(key, owner, error, conn=conn)
            self.fail_approval(conn, row, error)
            self.store.append_execution(conn, status="failed", error=error, **execution)
            failed = {"spec": spec, "ctx": ctx, "row": row, "args_hash_": frozen, "key": key, "error": error}
            self.store.append_events(conn, [self.events.event("failed", **failed)])

    def fail_approval(self, conn: Any, row: ApprovalRow | None, error: str) -> None:
        """End a gated approval in `failed`: the subject is free, the card shows why, and a new
        attempt is a new proposal (the grant was spent when execution started)."""
        if row is not None:
            values = {"status": "failed", "reason": error, "updated_at": self.clock.now()}
            self.store.update_approval(conn, row.id, expect_status=["approved"], values=values)
