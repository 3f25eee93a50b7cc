"""Execution with a grant token, stored results, reconciliation and crash recovery.

Part of `EffectGate` (a mixin so the gate module stays one concept per file). The sequence for
a gated call is three transactions:

1. verify the token, claim the idempotency key and mark the token used (one commit);
2. run the tool with the frozen arguments and a ToolContext carrying the idempotency key;
3. store the result, mark the approval executed, append the execution row (one commit).

A crash between 1 and 3 leaves an `in_progress` record whose lease expires; `recover()` turns it
into `needs_reconciliation` and asks the tool's `reconcile(key)` hook, never re-running blindly.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import _flow
from ._seal import approval_intact
from .canonical import args_hash, freeze
from .context import Approver, CallContext, ToolContext
from .errors import (
    ArgumentError,
    NeedsReconciliation,
    OutcomeUnknown,
    PolicyViolation,
    TamperedRecord,
    TokenError,
    UnknownApproval,
    WrongApprover,
)
from .outcomes import Executed
from .stores.base import Claimed, Stored, to_json
from .stores.records import ApprovalRow
from .table import ToolSpec
from .tokens import Keyring, TokenClaims, token_hash

if TYPE_CHECKING:
    from ._clock import Clock
    from ._notice import NotificationKind
    from .effects import Policy
    from .gate import ReconciliationNotice
    from .stores.sql import SQLStore
    from .table import EffectTable

EXEC_PREFIX = "eg_"


def _definite(spec: ToolSpec, *, gated: bool, exc: Exception) -> bool:
    """Whether a tool's exception is a definite failure (nothing happened downstream).

    A gated call (send, money, destructive) fails definitely only with an exception type its row
    lists in `definite_failures` (e.g. a provider's 4xx "card declined"); anything else, a
    connection reset or an HTTP client's timeout included, is an unknown outcome. A write fails
    definitely unless the exception is `OutcomeUnknown`, a `TimeoutError` or one its row lists in
    `unknown_outcome`."""
    if isinstance(exc, (OutcomeUnknown, TimeoutError, *spec.unknown_outcome)):
        return False
    if gated:
        return isinstance(exc, spec.definite_failures)
    return True


WRITE_PREFIX = "w_"


def _tool_of_write_key(key: str) -> str | None:
    """Write keys read `w_<tool>_<sha256 hex>`."""
    if not key.startswith(WRITE_PREFIX) or "_" not in key[len(WRITE_PREFIX) :]:
        return None
    return key[len(WRITE_PREFIX) :].rsplit("_", 1)[0]


def exec_key(row: ApprovalRow) -> str:
    """The idempotency key of an approval version; also the key passed downstream."""
    return f"{EXEC_PREFIX}{row.id}_v{row.version}"


def _approval_of_key(key: str) -> tuple[str, int] | None:
    if not key.startswith(EXEC_PREFIX) or "_v" not in key:
        return None
    approval_id, _, version = key[len(EXEC_PREFIX) :].rpartition("_v")
    return (approval_id, int(version)) if version.isdigit() else None


def context_of(row: ApprovalRow) -> CallContext:
    return CallContext(
        session_id=row.session_id,
        origin_message_id=row.origin_message_id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        run_id=row.run_id,
    )


class ExecutionMixin:
    table: EffectTable
    store: SQLStore
    policy: Policy
    keyring: Keyring
    clock: Clock
    _notify: Callable[[ReconciliationNotice], None] | None

    if TYPE_CHECKING:

        def _event(self, kind: str, **kw: Any) -> dict[str, Any]: ...
        def _record(self, *events: dict[str, Any]) -> None: ...
        def _current_spec(self, row: ApprovalRow) -> ToolSpec: ...
        def _bar(self, row: ApprovalRow) -> tuple[ToolSpec, str, int]: ...
        def _approvers(
            self, conn: Any, row: ApprovalRow, *, round_: int, role: str | None = None
        ) -> list[Any]: ...
        def _announce(self, kind: NotificationKind, **kw: Any) -> None: ...

    # -- execute

    def execute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        """Run an approved call exactly once. `args`, when given (what a framework re-sends),
        must hash to the frozen value. The tool always receives the frozen arguments.
        Raises TokenError (expired, used, forged, mismatch, revoked) and runs nothing."""
        return _flow.drive(self._execute_flow(token, args))

    async def aexecute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        return await _flow.adrive(self._execute_flow(token, args))

    def _execute_flow(self, token: str, args: Mapping[str, Any] | None) -> _flow.Flow[Executed]:
        deferred: NeedsReconciliation | None = None
        claims: TokenClaims | None = None
        try:
            claims = Keyring.read(token)
            with self.store.transaction() as conn:
                row = self.store.approval(conn, claims.approval_id)
                if row is None:
                    raise TokenError("forged", "the token names no known approval")
                self.store.lock(conn, f"subject:{row.subject_key}")
                row = self.store.approval(conn, claims.approval_id)  # re-read under the lock
                assert row is not None
                self.keyring.verify(claims, args_hash=row.args_hash)
                if row.token_hash is None or not hmac.compare_digest(token_hash(token), row.token_hash):
                    if row.status == "denied":
                        raise TokenError("revoked", f"approval {row.id} was denied")
                    raise TokenError("forged", f"this is not the token granted for approval {row.id}")
                if claims.version != row.version:
                    raise TokenError(
                        "mismatch", f"token is for version {claims.version}, approval is at {row.version}"
                    )
                if not approval_intact(self.keyring, row):
                    raise TokenError(
                        "tampered",
                        f"approval {row.id}: the stored record (arguments, role or approvers) does not "
                        "verify; it was changed outside effectgate",
                    )
                if args is not None and self._resent_hash(row, args) != row.args_hash:
                    raise TokenError("mismatch", "the arguments do not hash to the approved value")
                if row.status == "denied":
                    raise TokenError("revoked", f"approval {row.id} was denied")
                if row.status == "executed":
                    raise TokenError("used", f"approval {row.id} has already executed")
                if row.status == "failed":
                    raise TokenError(
                        "used", f"approval {row.id} ran and failed; a new attempt needs a new proposal"
                    )
                if row.status != "approved":
                    raise TokenError("mismatch", f"approval {row.id} is {row.status}")
                key = exec_key(row)
                now = self.clock.now()
                record = self.store._load(conn, key)
                if record is not None and record.status == "succeeded":
                    return self._finish_stored(conn, row, record.result)
                if record is not None and record.status == "in_progress":
                    if record.lease_expires_at is not None and record.lease_expires_at > now:
                        raise TokenError("used", f"approval {row.id} is executing now")
                elif record is not None and record.status == "failed":
                    raise TokenError("used", f"the grant for approval {row.id} was spent")
                elif record is None:
                    if row.token_used_at is not None:
                        raise TokenError("used", f"the grant for approval {row.id} was spent")
                    # The signed expiry decides; a stored one can only make it shorter.
                    if now >= min(claims.expires_at, row.token_expires_at or claims.expires_at):
                        raise TokenError("expired", f"the grant for approval {row.id} expired")
                # An in-flight record whose lease ran out, or one awaiting reconciliation: the
                # claim below raises NeedsReconciliation (never a second run).
                spec = self._bar_for_execute(conn, row)
                try:
                    claim = self.store.claim(
                        key, row.args_hash, lease_seconds=self.policy.lease_seconds, conn=conn
                    )
                except NeedsReconciliation as exc:
                    deferred = exc
                    self.store.append_events(
                        conn, [self._event("needs_reconciliation", row=row, reason=exc.reason)]
                    )
                else:
                    if isinstance(claim, Stored):  # pragma: no cover - handled by the load above
                        return self._finish_stored(conn, row, claim.result)
                    self.store.update_approval(
                        conn, row.id, expect_status=["approved"], values={"token_used_at": now}
                    )
                    self.store.append_events(
                        conn, [self._event("token_used", row=row, attempt=claim.attempt)]
                    )
        except TokenError as exc:
            # The transaction rolled back; the refusal is recorded on its own.
            refused = self._event("token_refused", reason=exc.reason)
            # As the token claims it (may name nothing); a malformed token names no approval.
            refused["approval_id"] = claims.approval_id if claims is not None else None
            self._record(refused)
            raise
        if deferred is not None:
            self._notify_unknown(row, key, deferred.reason, deferred.provider_ref)
            raise deferred
        assert isinstance(claim, Claimed)
        tool_context = ToolContext(
            idempotency_key=key,
            call=context_of(row),
            approval_id=row.id,
            version=row.version,
            attempt=claim.attempt,
        )
        result = yield from self._run_claimed(
            spec,
            json.loads(row.args_json),
            row.args_hash,
            context_of(row),
            key=key,
            owner=claim.owner,
            tool_context=tool_context,
            row=row,
        )
        return result

    def _resent_hash(self, row: ApprovalRow, args: Mapping[str, Any]) -> str | None:
        """The hash of arguments a framework re-sends, frozen as a call's arguments are."""
        spec = self.table.get(row.tool)
        try:
            return args_hash(row.tool, freeze(args, spec.schema if spec else None))
        except ArgumentError:
            return None

    def _bar_for_execute(self, conn: Any, row: ApprovalRow) -> ToolSpec:
        """Re-derive, before anything runs, that the grant was made by enough distinct approvers
        holding the role the table requires (sealed decisions of the round that minted it)."""
        try:
            spec, role, required = self._bar(row)
        except TamperedRecord as exc:
            raise TokenError("tampered", str(exc)) from exc
        approvers = self._approvers(conn, row, round_=row.grants - 1, role=role)
        if row.grants < 1 or len(approvers) < required:
            raise TokenError(
                "tampered",
                f"approval {row.id} has {len(approvers)} valid approval(s) of the {required} it needs",
            )
        return spec

    def _finish_stored(self, conn: Any, row: ApprovalRow, result: Any) -> Executed:
        """The result was stored but the approval not yet marked: finish, return it as a replay."""
        now = self.clock.now()
        self.store.update_approval(
            conn,
            row.id,
            expect_status=["approved"],
            values={"status": "executed", "updated_at": now, "token_used_at": now},
        )
        self.store.append_events(conn, [self._event("replay", row=row, status="executed")])
        return Executed(
            tool=row.tool,
            result=result,
            replay=True,
            approval_id=row.id,
            version=row.version,
            idempotency_key=exec_key(row),
        )

    def _run_claimed(
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
    ) -> _flow.Flow[Executed]:
        """Run a claimed operation and settle its record: succeeded, failed or needs_reconciliation."""
        try:
            before = spec.snapshot(args) if spec.snapshot else None
        except Exception as exc:  # nothing ran: a definite failure
            error = f"snapshot failed: {type(exc).__name__}: {exc}"
            with self.store.transaction() as conn:
                self.store.fail(key, owner, error, conn=conn)
                self._fail_approval(conn, row, error)
                self.store.append_events(
                    conn,
                    [
                        self._event(
                            "failed", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, error=error
                        )
                    ],
                )
            raise
        execution = {
            "approval_id": row.id if row else None,
            "version": row.version if row else None,
            "tool": spec.name,
            "effect": str(spec.effect),
            "args_hash": frozen,
            "args_json": json.dumps(dict(args), sort_keys=True),
            "idempotency_key": key,
            "table_fingerprint": self.table.fingerprint,
            "row_fingerprint": spec.fingerprint,
            "policy_fingerprint": self.policy.fingerprint,
            **{k: v for k, v in ctx.as_record().items() if k != "tool_call_id"},
            "before_json": to_json(before) if spec.snapshot else None,
        }
        try:
            result = yield _flow.Invoke(spec.fn, args, spec.context_params, tool_context)
        except Exception as exc:
            if _definite(spec, gated=row is not None, exc=exc):
                self._record_failure(spec, ctx, row, frozen, key, owner, execution, exc)
                raise

            reason = f"{type(exc).__name__}: {exc}"
            ref = getattr(exc, "provider_ref", None)
            with self.store.transaction() as conn:
                self.store.mark_needs_reconciliation(key, owner, reason, provider_ref=ref, conn=conn)
                self.store.append_execution(conn, status="needs_reconciliation", error=reason, **execution)
                self.store.append_events(
                    conn,
                    [
                        self._event(
                            "needs_reconciliation",
                            spec=spec,
                            ctx=ctx,
                            row=row,
                            args_hash_=frozen,
                            key=key,
                            reason=reason,
                        )
                    ],
                )
            self._notify_unknown(row, key, reason, ref, tool=spec.name)
            raise NeedsReconciliation(key, reason, provider_ref=ref) from exc
        try:
            after = spec.snapshot(args) if spec.snapshot else None
        except Exception as exc:  # the effect happened: keep its result, note the missing snapshot
            after = {"snapshot_failed": f"{type(exc).__name__}: {exc}"}
        with self.store.transaction() as conn:
            record = self.store.complete(key, owner, result, conn=conn)
            if row is not None:
                self.store.update_approval(
                    conn,
                    row.id,
                    expect_status=["approved"],
                    values={"status": "executed", "updated_at": self.clock.now()},
                )
            self.store.append_execution(
                conn,
                status="succeeded",
                result_json=to_json(result),
                after_json=to_json(after) if spec.snapshot else None,
                **{k: v for k, v in execution.items() if k != "after_json"},
            )
            self.store.append_events(
                conn,
                [
                    self._event(
                        "executed" if row else "write",
                        spec=spec,
                        ctx=ctx,
                        row=row,
                        args_hash_=frozen,
                        key=key,
                    )
                ],
            )
        return Executed(
            tool=spec.name,
            result=record.result,
            approval_id=row.id if row else None,
            version=row.version if row else None,
            idempotency_key=key,
            before=json.loads(to_json(before)) if spec.snapshot else None,
            after=json.loads(to_json(after)) if spec.snapshot else None,
        )

    def _record_failure(
        self,
        spec: ToolSpec,
        ctx: CallContext,
        row: ApprovalRow | None,
        frozen: str,
        key: str,
        owner: str,
        execution: dict[str, Any],
        exc: Exception,
    ) -> None:
        """A definite failure: the record is `failed`; a gated approval ends `failed` (terminal)."""
        error = f"{type(exc).__name__}: {exc}"
        with self.store.transaction() as conn:
            self.store.fail(key, owner, error, conn=conn)
            self._fail_approval(conn, row, error)
            self.store.append_execution(conn, status="failed", error=error, **execution)
            self.store.append_events(
                conn,
                [self._event("failed", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, error=error)],
            )

    def _fail_approval(self, conn: Any, row: ApprovalRow | None, error: str) -> None:
        """End a gated approval in `failed`: the subject is free, the card shows why, and a new
        attempt is a new proposal (the grant was spent when execution started)."""
        if row is None:
            return
        now = self.clock.now()
        self.store.update_approval(
            conn,
            row.id,
            expect_status=["approved"],
            values={"status": "failed", "reason": error, "updated_at": now},
        )

    def _notify_unknown(
        self, row: ApprovalRow | None, key: str, reason: str, ref: str | None, *, tool: str | None = None
    ) -> None:
        """Page the approver role; a failing hook is recorded and never breaks the gate."""
        from .gate import ReconciliationNotice

        notice = ReconciliationNotice(
            key=key,
            tool=row.tool if row else (tool or ""),
            reason=reason,
            approval_id=row.id if row else None,
            approver_role=row.approver_role if row else None,
            provider_ref=ref,
        )
        role = notice.approver_role
        if role is None and (spec := self.table.get(notice.tool)) is not None:
            role = spec.owner
        self._announce(
            "needs_reconciliation",
            tool=notice.tool,
            role=role,
            approval_id=notice.approval_id,
            version=row.version if row else None,
            reason=reason,
            key=key,
            provider_ref=ref,
        )
        if self._notify is None:
            return
        try:
            self._notify(notice)
            self._record(
                self._event("notified", row=row, tool=notice.tool, key=key, role=notice.approver_role)
            )
        except Exception as exc:
            self._record(self._event("notify_failed", row=row, tool=notice.tool, key=key, error=repr(exc)))

    # -- results and reconciliation

    def result(self, approval_id: str) -> Executed | None:
        """The stored result of an executed approval (None while it has not succeeded)."""
        row = self.store.get_approval(approval_id)
        if row is None:
            raise UnknownApproval(approval_id)
        record = self.store.get(exec_key(row))
        if record is None or record.status != "succeeded":
            return None
        return Executed(
            tool=row.tool,
            result=record.result,
            replay=True,
            approval_id=row.id,
            version=row.version,
            idempotency_key=record.key,
        )

    def reconcile(self, approval_id: str, *, approver: Approver | None = None) -> Executed | None:
        """Settle a `needs_reconciliation` approval through the tool's `reconcile(key)` hook.

        Found at the provider: the record completes with the provider's result. Not found: it runs
        again with the same key (the provider dedupes on it). Unknown: it stays; returns None.
        A person reconciling passes `approver`: they must hold the approval's role (it can run
        the operation again), and the events record who did it."""
        return _flow.drive(self._reconcile_flow(approval_id, approver))

    def _settled_row(self, approval_id: str, approver: Approver | None) -> ApprovalRow:
        """The approval to reconcile or settle, verified, and `approver` allowed to."""
        row = self.store.get_approval(approval_id)
        if row is None:
            raise UnknownApproval(approval_id)
        if not approval_intact(self.keyring, row):
            raise TamperedRecord(approval_id, "its seal or arguments hash does not verify")
        if approver is not None and not self.policy.role_satisfies(approver.role, row.approver_role):
            raise WrongApprover(
                approval_id,
                f"reconciling {row.tool} needs role {row.approver_role}; {approver.id} holds {approver.role}",
            )
        return row

    def _reconcile_flow(self, approval_id: str, approver: Approver | None) -> _flow.Flow[Executed | None]:
        row = self._settled_row(approval_id, approver)
        by = f"reconcile by {approver.id} ({approver.role})" if approver is not None else "reconcile"
        key = exec_key(row)
        record = self.store.get(key)
        if record is None or record.status != "needs_reconciliation":
            raise PolicyViolation(
                f"approval {approval_id} is not awaiting reconciliation", code="not_reconcilable"
            )
        spec = self._current_spec(row)
        if spec.reconcile is None:
            raise PolicyViolation(
                f"{row.tool} has no reconcile hook; settle it with gate.settle()", code="not_reconcilable"
            )
        found = yield _flow.Invoke(spec.reconcile, {"key": key})
        if found is None:
            return None
        if found.found:
            return self._settle_found(row, spec, key, found.result, found.provider_ref, by=by)
        with self.store.transaction() as conn:
            self.store.release(key, "provider never saw the key", conn=conn)
            self.store.append_events(conn, [self._event("released", row=row, key=key, by=by)])
        claim = self.store.claim(key, row.args_hash, lease_seconds=self.policy.lease_seconds)
        if isinstance(claim, Stored):  # pragma: no cover - released just above
            return None
        tool_context = ToolContext(
            idempotency_key=key,
            call=context_of(row),
            approval_id=row.id,
            version=row.version,
            attempt=claim.attempt,
        )
        result = yield from self._run_claimed(
            spec,
            json.loads(row.args_json),
            row.args_hash,
            context_of(row),
            key=key,
            owner=claim.owner,
            tool_context=tool_context,
            row=row,
        )
        return result

    def _settle_found(
        self, row: ApprovalRow, spec: ToolSpec, key: str, result: Any, ref: str | None, *, by: str
    ) -> Executed:
        with self.store.transaction() as conn:
            record = self.store.resolve(key, result, provider_ref=ref, conn=conn)
            self.store.update_approval(
                conn,
                row.id,
                expect_status=["approved"],
                values={"status": "executed", "updated_at": self.clock.now()},
            )
            self.store.append_execution(
                conn,
                approval_id=row.id,
                version=row.version,
                tool=row.tool,
                effect=row.effect,
                args_hash=row.args_hash,
                args_json=row.args_json,
                idempotency_key=key,
                status="succeeded",
                table_fingerprint=self.table.fingerprint,
                row_fingerprint=spec.fingerprint,
                policy_fingerprint=self.policy.fingerprint,
                result_json=to_json(result),
                error=f"settled by {by}",
                **{k: v for k, v in context_of(row).as_record().items() if k != "tool_call_id"},
            )
            self.store.append_events(
                conn, [self._event("reconciled", row=row, key=key, by=by, provider_ref=ref)]
            )
        return Executed(
            tool=row.tool, result=record.result, approval_id=row.id, version=row.version, idempotency_key=key
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
        """A person settles a reconciliation: the effect happened (with its result), or it did not:
        a definite failure, so the record and the approval end `failed` (the subject is free and
        a new attempt is a new proposal; the spent grant never runs it again)."""
        row = self._settled_row(approval_id, None)
        key = exec_key(row)
        if happened:
            return self._settle_found(row, self._current_spec(row), key, result, provider_ref, by=by)
        error = f"settled by {by}: did not happen"
        with self.store.transaction() as conn:
            self.store.release(key, error, conn=conn)
            self._fail_approval(conn, row, error)
            self.store.append_events(conn, [self._event("released", row=row, key=key, by=by)])
        return None

    def recover(self) -> list[str]:
        """After a crash: every in-flight record whose lease expired becomes needs_reconciliation,
        its approver is notified, and tools with a `reconcile` hook are reconciled now.
        Returns the keys it touched."""
        now = self.clock.now()
        touched: list[str] = []
        for record in self.store.idempotency_records(status="in_progress"):
            if record.lease_expires_at is None or record.lease_expires_at > now:
                continue
            reason = f"lease of {record.lease_owner} expired while in flight"
            with self.store.transaction() as conn:
                changed = self.store._transition(
                    conn,
                    record.key,
                    from_status=("in_progress",),
                    lease_expired_before=now,
                    values={"status": "needs_reconciliation", "error": reason, "updated_at": now},
                )
            if not changed:
                continue
            touched.append(record.key)
            parsed = _approval_of_key(record.key)
            row = self.store.get_approval(parsed[0]) if parsed else None
            self._record(self._event("needs_reconciliation", row=row, key=record.key, reason=reason))
            self._notify_unknown(
                row, record.key, reason, record.provider_ref, tool=_tool_of_write_key(record.key)
            )
            if row is not None:
                spec = self.table.get(row.tool)
                if spec is not None and spec.reconcile is not None:
                    self.reconcile(row.id)
        return touched
