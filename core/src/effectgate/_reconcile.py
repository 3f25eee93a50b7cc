"""After the fact: stored results, reconciliation of unknown outcomes, and crash recovery.

An unknown outcome is settled through the tool's `reconcile(key)` hook (found: the record completes
with the provider's result; not found: it runs again under the same key, which the provider dedupes
on, unless its approval had ended `failed` (its append-only `failed` execution says so, not its
unsealed status) before a late run of its grant reopened the record: it is released and never runs
again) or by a person (`settle`: it
happened, with its result, or it did not, a definite failure that ends the approval `failed`). A
person reconciling must hold the approval's role. What happened is recorded under the table row the
approval was made under (a result with no JSON form as `{"unserializable": TYPE}`); only running it
again needs today's row and policy (as `execute`). A write is reconciled or settled by its idempotency key
(`NeedsReconciliation.key`); not found, or not happened, it is released and its next call runs it
again under that key. Anything not awaiting reconciliation is refused
(`PolicyViolation(code="not_reconcilable")`), nothing changed; so is a hook's answer that is not
None or a `Reconciled` with a bool `found` (TypeError). `recover()` turns in-flight records whose
lease expired into `needs_reconciliation`, each on its own (one that cannot be read is logged): a
reconciliation that raises is logged and recorded (`reconcile_failed`; not a run again whose failure
settled it); an expiry whose commit landed with its reply lost is announced too. A stored result is
read back only for the arguments it was recorded for (its payload hash), and only for an
approval whose seal and arguments verify (else StoreError).

Logged on "effectgate._reconcile": reconciliations and settlements at INFO (approval id, version,
key, who); a lease expired in flight, a reconciliation raised in `recover`, a tampered record at WARNING.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import _reconciled, flow
from ._deps import Deps, Events, claim_landed
from ._execution import exec_key, stored_replay
from ._ledger import Ledger, context_of
from ._logging import logger
from ._notice import Notices
from ._reconciled import answered, approval_of_key, erased, no_hook, not_reconcilable, tool_of_write_key
from ._seal import approval_intact, approval_verifies, broken
from ._settle import Settlement, check_settle, storable
from .context import Approver, ToolContext
from .errors import PolicyViolation, StoreError, TamperedRecord, UnknownApproval, WrongApprover, describe
from .outcomes import Executed
from .stores.base import Claimed, Stored
from .stores.records import ApprovalRow

log = logger(__name__)


#: a write's call, copied from its recorded run onto its settlement's event (naming its user, as a
#: write's events do: erasure reaches them) and, with what it ran under, onto its execution row
_WHO = ("session_id", "origin_message_id", "user_id", "agent_id", "run_id", "model_id")
_CALL_FIELDS = ("effect", "args_hash", *_WHO)
_RUN_FIELDS = (*_CALL_FIELDS, "tool", "args_json", "idempotency_key", "row_fingerprint", "policy_fingerprint")
_ENDED = "the provider never saw it, and its approval had ended: not run again"


class Reconciliation:
    """Stored results, reconcile, settle, recover; see the module docstring."""

    def __init__(
        self, deps: Deps, events: Events, ledger: Ledger, notices: Notices, settlement: Settlement
    ) -> None:
        self.table, self.store, self.policy = deps.table, deps.store, deps.policy
        self.keyring, self.clock = deps.keyring, deps.clock
        self.events, self.ledger, self.notices, self.settlement = events, ledger, notices, settlement

    def result(self, approval_id: str) -> Executed | None:
        """The stored result of an executed approval (None while it has not succeeded)."""
        row = self.store.get_approval(approval_id)
        if row is None:
            raise UnknownApproval(approval_id)
        record = self.store.get(exec_key(row))
        if record is None or record.status != "succeeded":
            return None
        if not approval_verifies(self.keyring, row):  # its arguments (and hash) edited: not answered from
            raise StoreError(f"the stored result of approval {row.id}: {broken(self.keyring, row)}")
        if record.payload_hash != row.args_hash:  # edited outside effectgate: never replayed
            raise StoreError(f"the stored result of approval {row.id} was recorded for other arguments")
        return stored_replay(row, record.result)  # `record` is the one under `exec_key(row)`

    def reconcile(self, approval_id: str, *, approver: Approver | None = None) -> Executed | None:
        """Settle a `needs_reconciliation` approval (or a write, by its idempotency key) through the
        tool's `reconcile(key)` hook (see the module docstring); unknown: it stays, returns None. A
        person passes `approver`, who must hold the approval's role (it can run the call again)."""
        return flow.drive(self.reconcile_flow(approval_id, approver))

    def target(self, approval_id: str, approver: Approver | None) -> ApprovalRow | str:
        """The approval to reconcile or settle, verified, and `approver` allowed to; or, when no
        approval has that id, a write's idempotency key that has a record (a write has no
        approval, so no role to hold)."""
        if approver is not None and not isinstance(approver, Approver):  # before anything is read
            raise TypeError(f"reconcile: approver must be an Approver (got {type(approver).__name__})")
        row = self.store.get_approval(approval_id)
        if row is None:
            if tool_of_write_key(approval_id) is not None and self.store.get(approval_id) is not None:
                return approval_id
            raise UnknownApproval(approval_id)
        if not approval_intact(self.keyring, row):
            if approval_verifies(self.keyring, row):  # erased by `redact`, which erases ended calls only
                raise erased(f"approval {approval_id}")
            error = TamperedRecord(approval_id, broken(self.keyring, row))
            log.warning("reconcile refused: tampered approval record: approval=%s: %s", approval_id, error)
            raise error
        if approver is not None and not self.policy.role_satisfies(approver.role, row.approver_role):
            raise WrongApprover(
                approval_id,
                f"reconciling {row.tool} needs role {row.approver_role}; {approver.id} holds {approver.role}",
            )
        return row

    @contextmanager
    def settling(
        self, key: str, what: str, row: ApprovalRow | None = None, attempts: int | None = None
    ) -> Iterator[Any]:
        """A transaction settling `key`'s record. PolicyViolation(not_reconcilable), nothing changed,
        unless it awaits reconciliation, also when it stopped meanwhile (another settlement won: the
        store's compare-and-set raised StoreError) or ran again since it had `attempts` (a provider's
        "not found" asked before is stale); TamperedRecord unless sealed decisions granted `row`."""
        try:
            with self.store.transaction() as conn:
                record = self.store.awaiting(conn, key)  # locked: a racing settlement waits
                if record is None:
                    raise not_reconcilable(what)
                if attempts is not None and record.attempts != attempts:
                    raise not_reconcilable(what, stale=True)
                if row is not None:
                    self.ledger.granted(conn, row)
                yield conn
        except StoreError as exc:
            record = self.store.get(key)
            if record is None or record.status != "needs_reconciliation":
                raise not_reconcilable(what) from exc
            raise

    def reconcile_flow(self, approval_id: str, approver: Approver | None) -> flow.Flow[Executed | None]:
        target = self.target(approval_id, approver)
        by = f"reconcile by {approver.id} ({approver.role})" if approver is not None else "reconcile"
        if isinstance(target, str):
            return (yield from self.reconcile_write(target, by))
        row = target
        key = exec_key(row)
        record = self.store.get(key)
        if record is None or record.status != "needs_reconciliation":
            raise not_reconcilable(f"approval {approval_id}")
        # the hook only looks the key up: the table's current one (running it again needs more)
        hook = self.table.get(row.tool)
        if hook is None or hook.reconcile is None:
            raise no_hook(row.tool)
        found = answered((yield flow.Invoke(hook.reconcile, {"key": key})), row.tool, key)
        if found is None:
            log.info("reconcile: still unknown at the provider: approval=%s key=%s", row.id, key)
            return None
        if found.found:
            return self.settle_found(row, key, found.result, found.provider_ref, by=by)
        try:
            spec = self.ledger.bar(row)[0]  # it runs again: today's row and policy, as `execute`
        except PolicyViolation as exc:
            raise PolicyViolation(
                f"approval {row.id}: the provider never saw {key}, and it cannot run again: {exc}; "
                "settle it with gate.settle(happened=False)",
                code=exc.code,
            ) from exc
        flow.refuse_async_on_loop(spec.fn)  # before the release and the claim, as `execute`
        attempts = record.attempts  # as the provider was asked: a run since makes its answer stale
        failed = _reconciled.ended(self.store, row)  # its `failed` execution, whatever its status says
        claim: Claimed | Stored | None = None
        try:
            with self.settling(key, f"approval {approval_id}", row, attempts) as conn:  # one commit: a
                self.store.release(key, "provider never saw the key", conn=conn)  # failed claim releases
                self.store.append_events(conn, [self.events.event("released", row=row, key=key, by=by)])
                ended = self.store.approval(conn, row.id)  # settled "did not happen", or its run failed,
                if failed or ended is None or ended.status != "approved":  # before a late run reopened it
                    self.append_settled(
                        conn, row, key, "failed", row.row_fingerprint, error=f"{by}: {_ENDED}"
                    )
                    log.info("reconcile: %s: approval=%s key=%s by=%r", _ENDED, row.id, key, by)
                    return None  # committed: its grant never runs again
                lease, user = self.policy.lease_seconds, row.user_id  # named on a record schema 4 wrote
                claim = self.store.claim(key, row.args_hash, lease_seconds=lease, conn=conn, user_id=user)
        except Exception as exc:  # its COMMIT landed, the reply lost (a failover): it runs now
            if not claim_landed(self.store, key, claim, row.args_hash, exc):
                raise
        what = f"approval={row.id} version={row.version} key={key} by={by!r}"
        log.info("reconcile: the provider never saw it, running again under the same key: %s", what)
        if not isinstance(claim, Claimed):  # pragma: no cover - released just above
            return None
        tool_context = ToolContext(
            idempotency_key=key,
            call=context_of(row),
            approval_id=row.id,
            version=row.version,
            attempt=claim.attempt,
        )
        result = yield from self.settlement.run_claimed(
            spec,
            json.loads(row.args_json),
            row.args_hash,
            context_of(row),
            key=key,
            owner=claim.owner,
            tool_context=tool_context,
            row=row,
            args_text=row.args_json,
        )
        return result

    def settle_found(self, row: ApprovalRow, key: str, result: Any, ref: str | None, *, by: str) -> Executed:
        """It happened: the record succeeds with `result` (or its type's name, when it has no JSON
        form), the approval is executed, under the row it was approved under."""
        result, result_json = storable(result, "reconciled result", row.tool, key)
        with self.settling(key, f"approval {row.id}", row) as conn:
            record = self.store.resolve(key, result, provider_ref=ref, conn=conn)
            self.settlement.mark_executed(conn, row)
            self.append_settled(
                conn,
                row,
                key,
                "succeeded",
                row.row_fingerprint,
                error=f"settled by {by}",
                result_json=result_json,
            )
            self.store.append_events(
                conn, [self.events.event("reconciled", row=row, key=key, by=by, provider_ref=ref)]
            )
        what = f"approval={row.id} version={row.version} key={key} by={by!r} provider_ref={ref!r}"
        log.info("reconciled (it happened): %s", what)
        return Executed(
            tool=row.tool, result=record.result, approval_id=row.id, version=row.version, idempotency_key=key
        )

    def append_settled(
        self, conn: Any, row: ApprovalRow, key: str, status: str, row_fingerprint: str, **values: Any
    ) -> None:
        """Record a settlement of the row's grant in the append-only executions (what the history
        of a subject reads: `Ledger.history`)."""
        self.store.append_execution(
            conn,
            approval_id=row.id,
            version=row.version,
            tool=row.tool,
            effect=row.effect,
            args_hash=row.args_hash,
            args_json=row.args_json,
            idempotency_key=key,
            status=status,
            table_fingerprint=self.table.fingerprint,
            row_fingerprint=row_fingerprint,
            policy_fingerprint=self.policy.fingerprint,
            **{k: v for k, v in context_of(row).as_record().items() if k != "tool_call_id"},
            **values,
        )

    def settle(
        self,
        approval_id: str,
        *,
        happened: bool,
        result: Any = None,
        by: str,
        provider_ref: str | None = None,
    ) -> Executed | None:
        """A person (`by`, recorded) settles a reconciliation: it happened (with its result), or it
        did not: a definite failure, so the record and the approval end `failed` and a `failed`
        execution is recorded (the subject is free; the spent grant never runs it again). A write's
        idempotency key settles a write: it happened (succeeds), or not (released: its call runs again)."""
        check_settle(by, provider_ref)  # before anything is read
        target = self.target(approval_id, None)
        if isinstance(target, str):
            return self.settle_write(target, happened, result, provider_ref, by=by)
        row = target
        key = exec_key(row)
        if happened:
            return self.settle_found(row, key, result, provider_ref, by=by)
        error = f"settled by {by}: did not happen"
        with self.settling(key, f"approval {approval_id}", row) as conn:
            self.store.release(key, error, conn=conn)
            self.settlement.failures.fail_approval(conn, row, error)
            # under the row the approval was made under (recorded, and what the audit holds the
            # approval's executions to), whatever the table says now
            self.append_settled(conn, row, key, "failed", row.row_fingerprint, error=error)
            self.store.append_events(conn, [self.events.event("released", row=row, key=key, by=by)])
        log.info(
            "settled (it did not happen): approval=%s version=%d key=%s by=%r", row.id, row.version, key, by
        )
        return None

    # -- writes (no approval: settled by the idempotency key)

    def reconcile_write(self, key: str, by: str) -> flow.Flow[Executed | None]:
        """A write's unknown outcome through its tool's hook: found, it succeeds with the
        provider's result; not found, it is released (its next call runs it under the same key)."""
        tool = tool_of_write_key(key) or ""
        record = self.store.get(key)
        if record is None or record.status != "needs_reconciliation":
            raise not_reconcilable(f"write {key}")
        spec = self.table.get(tool)
        if spec is None or spec.reconcile is None:
            raise no_hook(tool)
        found = answered((yield flow.Invoke(spec.reconcile, {"key": key})), tool, key)
        if found is None:
            log.info("reconcile: still unknown at the provider: write key=%s", key)
            return None
        if found.found:
            return self.settle_write(key, True, found.result, found.provider_ref, by=by)
        never = "provider never saw the key"
        return self.settle_write(key, False, None, None, by=by, why=never, attempts=record.attempts)

    def settle_write(
        self,
        key: str,
        happened: bool,
        result: Any,
        ref: str | None,
        *,
        by: str,
        why: str = "did not happen",
        attempts: int | None = None,
    ) -> Executed | None:
        """Settle a write's record: it happened (succeeded with `result`), or it did not (released:
        its next call runs it under the same key); with an execution row and an event."""
        tool = tool_of_write_key(key) or ""
        ran = _reconciled.last_run(self.store, tool, key)  # refused when its arguments were erased
        error = f"settled by {by}" if happened else f"settled by {by}: {why}"
        result, result_json = storable(result, "reconciled result", tool, key) if happened else (None, None)
        with self.settling(key, f"write {key}", attempts=attempts) as conn:
            if happened:
                record = self.store.resolve(key, result, provider_ref=ref, conn=conn)
            else:
                self.store.release(key, error, conn=conn)
            if ran is not None:  # under the rule it ran under (a worker that died mid-run left none)
                self.store.append_execution(
                    conn,
                    **{f: getattr(ran, f) for f in _RUN_FIELDS},
                    status="succeeded" if happened else "failed",
                    table_fingerprint=self.table.fingerprint,
                    result_json=result_json,
                    error=error,
                )
            kind = "reconciled" if happened else "released"
            event = self.events.event(kind, tool=tool, key=key, by=by, provider_ref=ref)
            self.store.append_events(conn, [event | {f: getattr(ran, f) for f in _CALL_FIELDS if ran}])
        log.info("settled write (%s): tool=%s key=%s by=%r", kind, tool, key, by)
        return Executed(tool=tool, result=record.result, idempotency_key=key) if happened else None

    # -- after a crash

    def recover(self) -> list[str]:
        """After a crash: every in-flight record whose lease expired becomes needs_reconciliation,
        its approver is notified, and tools with a `reconcile` hook are reconciled now (a write by
        its key). Each record on its own: a reconciliation that raises (the provider's lookup down,
        a changed row) is logged at WARNING and recorded (`reconcile_failed`), the next is handled;
        a run again that raised a definite failure settled its record (recorded as that), no failure
        of reconciling. Returns the keys it touched."""
        now = self.clock.now()
        touched: list[str] = []
        unreadable: list[str] = []  # each record on its own: one edited outside stops no other
        for record in self.store.idempotency_records(status="in_progress", unreadable=unreadable):
            if record.lease_expires_at is None or record.lease_expires_at > now:
                continue
            reason = f"lease of {record.lease_owner} expired while in flight"
            parsed = approval_of_key(record.key)
            row = self.store.get_approval(parsed[0]) if parsed else None
            try:
                with self.store.transaction() as conn:  # with its event: a pass that fails changes nothing
                    if not self.store.expire_lease(record.key, now=now, reason=reason, conn=conn):
                        continue
                    event = self.events.event("needs_reconciliation", row=row, key=record.key, reason=reason)
                    self.store.append_events(conn, [event])
            except Exception as exc:  # its COMMIT landed, the reply lost: announced and reconciled now
                if not _reconciled.expiry_landed(self.store, record.key, now, reason, exc):
                    raise
            touched.append(record.key)
            log.warning(
                "recover: lease expired in flight, needs_reconciliation: key=%s reason=%s", record.key, reason
            )
            self.notices.unknown_outcome(
                row, record.key, reason, record.provider_ref, tool=tool_of_write_key(record.key)
            )
            spec = self.table.get(row.tool if row is not None else tool_of_write_key(record.key) or "")
            if spec is not None and spec.reconcile is not None:  # a write's by its key
                try:
                    self.reconcile(row.id if row is not None else record.key)
                except Exception as exc:  # each record on its own: logged, recorded, and on
                    error = describe(exc)
                    settled = self.store.get(record.key)  # its run again failed: recorded as that
                    if settled is not None and settled.status in ("succeeded", "failed"):
                        log.info("recover: reconciled: key=%s ended %s", record.key, settled.status)
                        continue
                    log.warning("recover: reconcile failed: key=%s error=%s", record.key, error)
                    failed = self.events.event("reconcile_failed", row=row, key=record.key, error=error)
                    self.events.record(failed)
        for key in unreadable:
            log.warning(
                "recover: an in-flight record cannot be read (edited outside effectgate): key=%s", key
            )
        return touched
