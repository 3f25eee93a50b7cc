"""Running a claimed operation and settling its record: succeeded, failed or needs_reconciliation.

The second and third steps of an execution (`_execution.py` verifies the grant and claims the
key; a write claims its own): run the tool with the frozen arguments and a ToolContext carrying
the idempotency key, then store the result, mark the approval executed and append the execution
row in one commit. Only an exception the row declares definite fails a gated call (the approval
ends `failed`); every other exception is an unknown outcome (`needs_reconciliation`, the
approver notified), never re-run blindly. A definite failure and a run whose lease was lost are
recorded by `_failures.Failures`, an unknown outcome by `_unknown.store_unknown`.

Logged on "effectgate._execution" (one logger for the whole execution): a gated execution at
INFO, a write at DEBUG; an unknown outcome and a definite failure at WARNING with the
idempotency key and the reason. Never the arguments or the result.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from . import flow
from ._deps import Deps, Events, connection_lost
from ._failures import Failures, definite, log_outcome
from ._flowjobs import ran
from ._json import copied, parse, readable
from ._leases import LeaseKeeper
from ._logging import logger
from ._notice import Notices
from ._unknown import store_unknown
from .canonical import _SURROGATE
from .context import CallContext, ToolContext
from .errors import LeaseLost, NeedsReconciliation, OutcomeUnknown, describe, storable_text
from .outcomes import Executed
from .stores.base import IdempotencyRecord, to_json
from .stores.records import ApprovalRow
from .table import ToolSpec

log = logger("effectgate._execution")


class Settlement:
    """Runs claimed operations and settles their records; see the module docstring."""

    def __init__(self, deps: Deps, events: Events, notices: Notices) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.clock = deps.clock
        self.events = events
        self.notices = notices
        self.leases = LeaseKeeper(deps.store, deps.policy.lease_seconds)
        self.failures = Failures(deps, events, notices)  # a definite failure, a lost lease

    def run_claimed(
        self,
        spec: ToolSpec,
        args: Mapping[str, Any],
        frozen: str,
        ctx: CallContext,
        *,
        key: str,
        owner: str,
        tool_context: ToolContext,
        row: ApprovalRow | None,
        args_text: str,
    ) -> flow.Flow[Executed]:
        """Run a claimed operation and settle its record: succeeded, failed or needs_reconciliation."""
        # the lease is renewed from the claim to the stored outcome, snapshots included
        self.leases.hold(key, owner)
        try:
            execution = {
                "approval_id": row.id if row else None,
                "version": row.version if row else None,
                "tool": spec.name,
                "effect": str(spec.effect),
                "args_hash": frozen,
                "args_json": args_text,
                "idempotency_key": key,
                "table_fingerprint": self.table.fingerprint,
                "row_fingerprint": spec.fingerprint,
                "policy_fingerprint": self.policy.fingerprint,
                # the call's identity (`ctx.as_record()` without the tool call id)
                "session_id": ctx.session_id,
                "origin_message_id": ctx.origin_message_id,
                "user_id": ctx.user_id,
                "agent_id": ctx.agent_id,
                "run_id": ctx.run_id,
                "model_id": ctx.model_id,
                "before_json": None,
            }
            try:
                before = spec.snapshot(copied(args)) if spec.snapshot else None  # nor its changes
                execution["before_json"] = before_json = to_json(before) if spec.snapshot else None
            except Exception as exc:  # nothing ran: a definite failure, recorded as one (a failed
                # execution: the grant presented is no outcome left unknown in the subject's history)
                self.leases.release(key, owner)  # the outcome is stored now (no renewal races it)
                failed = (spec, ctx, row, frozen, key, owner, execution, exc)
                self.failures.record_failure(*failed, attempt=tool_context.attempt, what="snapshot failed: ")
                raise
            refs: list[str] = []  # what the tool recorded with tool_context.set_provider_ref

            def on_ref(ref: str) -> None:
                refs.append(ref)  # the provider has seen the call: storing its reference failing
                try:  # (the database lost) is no definite failure of a write, but an unknown outcome
                    self.store.set_provider_ref(key, owner, ref)  # committed before the tool goes on
                except LeaseLost:
                    raise
                except Exception as lost:
                    why = f"its provider reference could not be stored: {describe(lost)}"
                    raise OutcomeUnknown(why, provider_ref=ref) from lost

            # `dataclasses.replace(tool_context, _on_provider_ref=on_ref)`, without its walk of fields()
            bound = ToolContext(**{**vars(tool_context), "_on_provider_ref": on_ref})
            try:
                ran_with = copied(args) if spec.snapshot else args  # its changes are not theirs
                result = yield flow.Invoke(spec.fn, ran_with, spec.context_params, bound)
                result = ran(result)  # work it returned but did not run: an unknown outcome
            except Exception as exc:
                self.leases.release(key, owner)
                if definite(spec, gated=row is not None, exc=exc):
                    failed = (spec, ctx, row, frozen, key, owner, execution, exc)
                    self.failures.record_failure(*failed, attempt=tool_context.attempt)
                    raise

                reason = describe(exc)
                ref = getattr(exc, "provider_ref", None)
                ref = storable_text(ref) if isinstance(ref, str) and ref else (refs[-1] if refs else None)
                try:  # once more on a fresh connection when the connection was lost (`_unknown`)
                    unknown = (spec, ctx, row, frozen, key, owner, execution, reason, ref)
                    store_unknown(self.store, self.events, unknown, exc)
                except LeaseLost as lost:
                    self.failures.record_lease_lost(spec, ctx, row, frozen, key, execution, None, exc, ref)
                    raise lost from exc
                log_outcome("needs_reconciliation (outcome unknown)", spec.name, row, key, reason)
                self.notices.unknown_outcome(row, key, reason, ref, tool=spec.name)
                raise NeedsReconciliation(key, reason, provider_ref=ref) from exc
            try:
                after = spec.snapshot(args) if spec.snapshot else None
            except Exception as exc:  # the effect happened: keep its result, note the missing snapshot
                after = {"snapshot_failed": describe(exc)}
            # The effect happened: what cannot be stored as JSON is stored as what it was, never lost
            # with the record left in flight (the outcome is known; see `storable`)
            result, result_json = storable(result, "result", spec.name, key)
            after, after_json = storable(after, "after snapshot", spec.name, key)
            execution["after_json"] = after_json if spec.snapshot else None
            settle = (spec, ctx, row, frozen, key, owner, execution, result, result_json)
            self.leases.release(key, owner)
            handled = sys.exc_info()[1]  # what the caller was handling: not this transaction's loss
            try:
                try:
                    record = self.store_success(*settle)
                except Exception as exc:
                    if not connection_lost(self.store, exc, handled):
                        raise
                    record = self.store_success_again(settle)
            except LeaseLost:
                self.failures.record_lease_lost(spec, ctx, row, frozen, key, execution, result_json)
                raise
            if row is not None:
                log.info(
                    "executed: approval=%s version=%d tool=%s key=%s", row.id, row.version, spec.name, key
                )
            else:
                log.debug("write executed: tool=%s key=%s", spec.name, key)
            return Executed(
                tool=spec.name,
                result=record.result,
                approval_id=row.id if row else None,
                version=row.version if row else None,
                idempotency_key=key,
                before=parse(before_json) if before_json is not None else None,
                after=parse(after_json) if spec.snapshot else None,
            )
        finally:
            self.leases.release(key, owner)

    def store_success(
        self,
        spec: ToolSpec,
        ctx: CallContext,
        row: ApprovalRow | None,
        frozen: str,
        key: str,
        owner: str,
        execution: dict[str, Any],
        result: Any,
        result_json: str,
    ) -> IdempotencyRecord:
        """Store the result, mark the approval executed and append the execution row: one commit."""
        with self.store.transaction() as conn:
            record = self.store.complete(key, owner, result, conn=conn)
            if row is not None:
                self.mark_executed(conn, row)
            self.store.append_execution(conn, status="succeeded", result_json=result_json, **execution)
            self.store.append_events(
                conn,
                [
                    self.events.event(
                        "executed" if row else "write",
                        spec=spec,
                        ctx=ctx,
                        row=row,
                        args_hash_=frozen,
                        key=key,
                    )
                ],
            )
        return record

    def store_success_again(self, settle: tuple[Any, ...]) -> IdempotencyRecord:
        """After the connection was lost while the result was stored (a failover, a dropped
        socket): the effect happened, and the commit may or may not have landed. The record says
        which (`landed`): settled by this run's commit, it is returned (its execution row and the
        approval's mark landed with it). Otherwise the same transaction runs once more on a fresh
        connection, a compare-and-set on this lease like the first; one that finds the record
        settled asks once more (the server finished the commit after the socket died). A second
        failure is raised, the record left in flight for `recover`."""
        key, owner = settle[4], settle[5]
        record = self.landed(key, owner)
        if record is not None:
            log.warning("connection lost after the result was stored (it was): key=%s", key)
            return record
        log.warning("connection lost while storing the result; storing it once more: key=%s", key)
        try:
            return self.store_success(*settle)
        except LeaseLost:
            if (record := self.landed(key, owner)) is None:
                raise
            return record

    def landed(self, key: str, owner: str) -> IdempotencyRecord | None:
        """The record of `key` if this run's own commit settled it: succeeded under its lease (a
        reconciliation that settles a record clears its lease owner), else None."""
        record = self.store.get(key)
        if record is not None and record.status == "succeeded" and record.lease_owner == owner:
            return record
        return None

    def mark_executed(self, conn: Any, row: ApprovalRow, **values: Any) -> None:
        """An approved call's approval becomes `executed` (with `values` too), in `conn`."""
        values = {"status": "executed", "updated_at": self.clock.now(), **values}
        self.store.update_approval(conn, row.id, expect_status=["approved"], values=values)


def storable(value: Any, what: str, tool: str, key: str) -> tuple[Any, str]:
    """`value` as its JSON text reads back (what the caller and every replay get: a model's JSON
    object, an iterator's list) and that text, when the store reads it back, else `{"unserializable":
    its type's name}` (and that text), logged at WARNING: a tool that returned (or a snapshot of)
    an object with no JSON form still ran, and its record must say so (succeeded, with the type),
    not stay in flight until a person is asked about an outcome that is known."""
    try:  # the value as its text reads back: one serialisation (an iterator is spent by one)
        return parse(text := readable(to_json(value))), text
    except Exception as exc:
        log.warning(
            "%s of %s has no JSON form (%s), stored as its type name: key=%s",
            what,
            tool,
            type(exc).__name__,
            key,
        )
        stored = {"unserializable": type(value).__name__}
        return stored, to_json(stored)


def check_settle(by: object, provider_ref: object) -> None:
    """A person's settlement, before anything is read: who settles (`by`, recorded) and the provider's
    reference (or None) are text (TypeError), not blank, with no lone surrogate (ValueError)."""
    named = (("by", by), ("provider_ref", provider_ref)) if provider_ref is not None else (("by", by),)
    for name, value in named:
        if not isinstance(value, str):
            raise TypeError(f"settle: {name} must be text (got {type(value).__name__})")
        if not value.strip() or _SURROGATE.search(value):
            raise ValueError(f"settle: {name} must be text that is not blank, without a lone surrogate")
