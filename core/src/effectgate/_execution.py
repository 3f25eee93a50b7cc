"""Execution with a grant token: verify, claim, run once, settle the record.

The sequence for a gated call is three transactions:

1. verify the token and re-derive what it stands for (the stored arguments' hash, the seal, the
   bar and the sealed approvals of the round that minted it), claim the idempotency key and mark
   the token used (one commit: a grant is spent when its execution starts, whatever follows);
2. run the tool with the frozen arguments and a ToolContext carrying the idempotency key;
3. store the result, mark the approval executed, append the execution row (one commit).

Only an exception the row declares definite fails a gated call (the approval ends `failed`);
every other exception is an unknown outcome (`needs_reconciliation`, the approver notified).
A crash between 1 and 3 leaves an `in_progress` record whose lease expires; `recover()` turns it
into `needs_reconciliation`, never re-running blindly.

Logged on "effectgate._execution": a gated execution (and a replayed one) at INFO with approval
id, version and idempotency key, a write at DEBUG; an unknown outcome (needs_reconciliation, with
key and reason) and a definite failure at WARNING; a refused token at INFO with its reason, at
WARNING when the record was tampered with. Never the token, the arguments or the result.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from . import flow
from ._deps import Deps, Events
from ._ledger import Ledger, context_of
from ._notice import Notices
from ._seal import approval_intact
from .canonical import args_hash, freeze
from .context import CallContext, ToolContext
from .errors import ArgumentError, NeedsReconciliation, OutcomeUnknown, TamperedRecord, TokenError
from .outcomes import Executed
from .stores.base import Claimed, Stored, to_json
from .stores.records import ApprovalRow
from .table import ToolSpec
from .tokens import Keyring, TokenClaims, token_hash

log = logging.getLogger(__name__)

EXEC_PREFIX = "eg_"
WRITE_PREFIX = "w_"


def exec_key(row: ApprovalRow) -> str:
    """The idempotency key of an approval version; also the key passed downstream."""
    return f"{EXEC_PREFIX}{row.id}_v{row.version}"


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


class Execution:
    """Runs approved calls and writes once; see the module docstring."""

    def __init__(self, deps: Deps, events: Events, ledger: Ledger, notices: Notices) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.events = events
        self.ledger = ledger
        self.notices = notices

    def execute_flow(self, token: str, args: Mapping[str, Any] | None) -> flow.Flow[Executed]:
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
                if args is not None and self.resent_hash(row, args) != row.args_hash:
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
                record = self.store.load(conn, key)
                if record is not None and record.status == "succeeded":
                    return self.finish_stored(conn, row, record.result)
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
                spec = self.bar_for_execute(conn, row)
                try:
                    claim = self.store.claim(
                        key, row.args_hash, lease_seconds=self.policy.lease_seconds, conn=conn
                    )
                except NeedsReconciliation as exc:
                    deferred = exc
                    self.store.append_events(
                        conn, [self.events.event("needs_reconciliation", row=row, reason=exc.reason)]
                    )
                else:
                    if isinstance(claim, Stored):  # pragma: no cover - handled by the load above
                        return self.finish_stored(conn, row, claim.result)
                    self.store.update_approval(
                        conn, row.id, expect_status=["approved"], values={"token_used_at": now}
                    )
                    self.store.append_events(
                        conn, [self.events.event("token_used", row=row, attempt=claim.attempt)]
                    )
        except TokenError as exc:
            # The transaction rolled back; the refusal is recorded on its own.
            refused = self.events.event("token_refused", reason=exc.reason)
            # As the token claims it (may name nothing); a malformed token names no approval.
            refused["approval_id"] = claims.approval_id if claims is not None else None
            self.events.record(refused)
            log.log(
                logging.WARNING if exc.reason == "tampered" else logging.INFO,
                "grant refused (%s): approval=%s version=%s",
                exc.reason,
                claims.approval_id if claims is not None else None,
                claims.version if claims is not None else None,
            )
            raise
        if deferred is not None:
            _log_outcome("needs_reconciliation (outcome unknown)", row.tool, row, key, deferred.reason)
            self.notices.unknown_outcome(row, key, deferred.reason, deferred.provider_ref)
            raise deferred
        assert isinstance(claim, Claimed)
        tool_context = ToolContext(
            idempotency_key=key,
            call=context_of(row),
            approval_id=row.id,
            version=row.version,
            attempt=claim.attempt,
        )
        result = yield from self.run_claimed(
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

    def resent_hash(self, row: ApprovalRow, args: Mapping[str, Any]) -> str | None:
        """The hash of arguments a framework re-sends, frozen as a call's arguments are."""
        spec = self.table.get(row.tool)
        try:
            return args_hash(row.tool, freeze(args, spec.schema if spec else None))
        except ArgumentError:
            return None

    def bar_for_execute(self, conn: Any, row: ApprovalRow) -> ToolSpec:
        """Re-derive, before anything runs, that the grant was made by enough distinct approvers
        holding the role the table requires (sealed decisions of the round that minted it)."""
        try:
            spec, role, required = self.ledger.bar(row)
        except TamperedRecord as exc:
            raise TokenError("tampered", str(exc)) from exc
        approvers = self.ledger.approvers(conn, row, round_=row.grants - 1, role=role)
        if row.grants < 1 or len(approvers) < required:
            raise TokenError(
                "tampered",
                f"approval {row.id} has {len(approvers)} valid approval(s) of the {required} it needs",
            )
        return spec

    def finish_stored(self, conn: Any, row: ApprovalRow, result: Any) -> Executed:
        """The result was stored but the approval not yet marked: finish, return it as a replay."""
        now = self.clock.now()
        self.store.update_approval(
            conn,
            row.id,
            expect_status=["approved"],
            values={"status": "executed", "updated_at": now, "token_used_at": now},
        )
        self.store.append_events(conn, [self.events.event("replay", row=row, status="executed")])
        log.info(
            "execution replayed (stored result): approval=%s version=%d key=%s",
            row.id,
            row.version,
            exec_key(row),
        )
        return Executed(
            tool=row.tool,
            result=result,
            replay=True,
            approval_id=row.id,
            version=row.version,
            idempotency_key=exec_key(row),
        )

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
        try:
            before = spec.snapshot(args) if spec.snapshot else None
        except Exception as exc:  # nothing ran: a definite failure
            error = f"snapshot failed: {type(exc).__name__}: {exc}"
            with self.store.transaction() as conn:
                self.store.fail(key, owner, error, conn=conn)
                self.fail_approval(conn, row, error)
                self.store.append_events(
                    conn,
                    [
                        self.events.event(
                            "failed", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, error=error
                        )
                    ],
                )
            _log_outcome("failed (definite)", spec.name, row, key, error)
            raise
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
            **{k: v for k, v in ctx.as_record().items() if k != "tool_call_id"},
            "before_json": to_json(before) if spec.snapshot else None,
        }
        refs: list[str] = []  # what the tool recorded with tool_context.set_provider_ref

        def on_ref(ref: str) -> None:
            self.store.set_provider_ref(key, owner, ref)  # committed before the tool goes on
            refs.append(ref)

        bound = replace(tool_context, _on_provider_ref=on_ref)
        try:
            result = yield flow.Invoke(spec.fn, args, spec.context_params, bound)
        except Exception as exc:
            if _definite(spec, gated=row is not None, exc=exc):
                self.record_failure(spec, ctx, row, frozen, key, owner, execution, exc)
                raise

            reason = f"{type(exc).__name__}: {exc}"
            ref = getattr(exc, "provider_ref", None) or (refs[-1] if refs else None)
            with self.store.transaction() as conn:
                self.store.mark_needs_reconciliation(key, owner, reason, provider_ref=ref, conn=conn)
                self.store.append_execution(conn, status="needs_reconciliation", error=reason, **execution)
                self.store.append_events(
                    conn,
                    [
                        self.events.event(
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
            _log_outcome("needs_reconciliation (outcome unknown)", spec.name, row, key, reason)
            self.notices.unknown_outcome(row, key, reason, ref, tool=spec.name)
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
        if row is not None:
            log.info("executed: approval=%s version=%d tool=%s key=%s", row.id, row.version, spec.name, key)
        else:
            log.debug("write executed: tool=%s key=%s", spec.name, key)
        return Executed(
            tool=spec.name,
            result=record.result,
            approval_id=row.id if row else None,
            version=row.version if row else None,
            idempotency_key=key,
            before=json.loads(to_json(before)) if spec.snapshot else None,
            after=json.loads(to_json(after)) if spec.snapshot else None,
        )

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
    ) -> None:
        """A definite failure: the record is `failed`; a gated approval ends `failed` (terminal)."""
        error = f"{type(exc).__name__}: {exc}"
        with self.store.transaction() as conn:
            self.store.fail(key, owner, error, conn=conn)
            self.fail_approval(conn, row, error)
            self.store.append_execution(conn, status="failed", error=error, **execution)
            self.store.append_events(
                conn,
                [
                    self.events.event(
                        "failed", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, error=error
                    )
                ],
            )
        _log_outcome("failed (definite)", spec.name, row, key, error)

    def fail_approval(self, conn: Any, row: ApprovalRow | None, error: str) -> None:
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


def _log_outcome(what: str, tool: str, row: ApprovalRow | None, key: str, reason: str) -> None:
    """A WARNING for an execution (gated, `row`) or a write that did not succeed: an unknown
    outcome or a definite failure, with the idempotency key and the reason."""
    kind, approval = ("execution", f" approval={row.id} version={row.version}") if row else ("write", "")
    log.warning("%s %s: tool=%s%s key=%s reason=%s", kind, what, tool, approval, key, reason)
