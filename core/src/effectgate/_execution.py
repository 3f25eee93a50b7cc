"""Execution with a grant token: verify, claim, run once, settle the record.

The sequence for a gated call is three transactions:

1. verify the token and re-derive what it stands for (the stored arguments' hash, the seal, the
   bar and the sealed approvals of the round that minted it), claim the idempotency key and mark
   the token used (one commit: a grant is spent when its execution starts, whatever follows);
2. run the tool with the frozen arguments and a ToolContext carrying the idempotency key;
3. store the result, mark the approval executed, append the execution row (one commit).

This module does 1; `_settle.py` does 2 and 3 (for writes too). A crash between 1 and 3 leaves
an `in_progress` record whose lease expires; `recover()` turns it into `needs_reconciliation`,
never re-running blindly.

Logged on "effectgate._execution": a gated execution (and a replayed one) at INFO with approval
id, version and idempotency key, a write at DEBUG; an unknown outcome (needs_reconciliation, with
key and reason) and a definite failure at WARNING; a refused token at INFO with its reason, at
WARNING when the record was tampered with. Never the token, the arguments or the result.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any

from . import flow
from ._deps import Deps, Events, claim_landed
from ._failures import log_outcome
from ._json import parse
from ._ledger import Ledger, context_of
from ._logging import logger
from ._notice import Notices
from ._seal import approval_intact, approval_verifies, foreign_key, grant_released, mismatch
from ._settle import Settlement
from .canonical import args_hash, freeze
from .context import ToolContext
from .errors import ArgumentError, NeedsReconciliation, PolicyViolation, TamperedRecord, TokenError
from .outcomes import Executed
from .stores.base import Claimed, Stored
from .stores.records import ApprovalRow, DecisionRow
from .table import ToolSpec
from .tokens import Keyring, TokenClaims, token_hash

log = logger(__name__)

EXEC_PREFIX = "eg_"
WRITE_PREFIX = "w_"


def lapsed(claims: TokenClaims, row: ApprovalRow, now: float) -> bool:
    """Whether the grant has expired at `now`: the signed expiry decides; a stored one can only
    make it shorter (a stored one that is not a number, text edited into SQLite, cannot)."""
    stored = row.token_expires_at
    if not (stored and isinstance(stored, int | float)):
        stored = claims.expires_at
    return now >= min(claims.expires_at, stored)


def exec_key(row: ApprovalRow) -> str:
    """The idempotency key of an approval version; also the key passed downstream."""
    return f"{EXEC_PREFIX}{row.id}_v{row.version}"


def stored_replay(row: ApprovalRow, result: Any) -> Executed:
    """An approval version's stored `result`, answered as a replay under its execution key."""
    return Executed(
        tool=row.tool,
        result=result,
        replay=True,
        approval_id=row.id,
        version=row.version,
        idempotency_key=exec_key(row),
    )


class Execution:
    """Runs approved calls and writes once; see the module docstring."""

    def __init__(
        self, deps: Deps, events: Events, ledger: Ledger, notices: Notices, settlement: Settlement
    ) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.events = events
        self.ledger = ledger
        self.notices = notices
        self.settlement = settlement

    def execute_flow(self, token: str, args: Mapping[str, Any] | None) -> flow.Flow[Executed]:
        deferred: NeedsReconciliation | None = None
        claims: TokenClaims | None = None
        claim: Claimed | Stored | None = None
        row: ApprovalRow | None = None
        try:
            claims = Keyring.read(token)
            with self.store.transaction() as conn:
                row, decided = self.store.locked_decided(conn, claims.approval_id)
                if row is None:
                    raise TokenError("forged", "the token names no known approval")
                self.keyring.verify(claims, args_hash=row.args_hash)
                stored = row.token_hash  # edited into text that is not ASCII (or a blob): not it
                if not isinstance(stored, str) or not hmac.compare_digest(
                    token_hash(token).encode(), stored.encode("utf-8", "surrogatepass")
                ):
                    if row.status == "denied":
                        raise TokenError("revoked", f"approval {row.id} was denied")
                    if self.clock.now() >= claims.expires_at:  # genuine (its MAC verified), replaced
                        raise TokenError(
                            "expired", f"this grant for approval {row.id} expired (a later grant replaced it)"
                        )
                    raise TokenError("forged", f"this is not the token granted for approval {row.id}")
                if claims.version != row.version:
                    raise TokenError(
                        "mismatch", f"token is for version {claims.version}, approval is at {row.version}"
                    )
                intact = approval_intact(self.keyring, row)
                # a call whose arguments `redact` erased (sealed: only they changed) never runs: it is
                # refused as what it is (a lapsed grant; "used" or "revoked" below), not as edited
                erased = not intact and approval_verifies(self.keyring, row)
                if (
                    erased
                    and row.status == "approved"
                    and row.token_used_at is None
                    and lapsed(claims, row, self.clock.now())
                ):
                    raise TokenError("expired", f"the grant for approval {row.id} expired")
                if not intact and not (erased and row.status != "approved"):
                    raise TokenError(
                        "tampered",
                        f"approval {row.id}: the stored record (arguments, role or approvers) does not "
                        "verify; it was changed outside effectgate",
                    )
                if claims.grant_round not in (None, row.grants - 1):  # its hash edited back in
                    raise TokenError(
                        "tampered", f"approval {row.id}: its stored grant is of an earlier round (edited)"
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
                if record is not None and record.payload_hash != row.args_hash:  # edited: never replayed
                    raise TokenError("tampered", f"approval {row.id}: its idempotency record was edited")
                if record is not None and record.status == "succeeded":
                    # The run that stored this result marks the approval executed in the same
                    # commit, without the subject lock: under READ COMMITTED it may have committed
                    # after `row` was read. Read the status again (it can only refuse here).
                    fresh = self.store.approval(conn, row.id)
                    if fresh is None or fresh.status != "approved":
                        raise TokenError("used", f"approval {row.id} has already executed")
                    return self.finish_stored(conn, row, record.result)
                if record is not None and record.status == "in_progress":
                    if record.lease_expires_at is not None and record.lease_expires_at > now:
                        raise TokenError("used", f"approval {row.id} is executing now")
                elif record is not None and record.status == "failed":
                    raise TokenError("used", f"the grant for approval {row.id} was spent")
                elif record is None:
                    # The append-only rows decide, not token_used_at or the status (neither sealed):
                    # a version presented or run before never starts again under a fresh claim.
                    if row.token_used_at is not None or self.store.grant_spent(conn, row.id, row.version):
                        raise TokenError("used", f"the grant for approval {row.id} was spent")
                    if lapsed(claims, row, now):
                        raise TokenError("expired", f"the grant for approval {row.id} expired")
                # An in-flight record whose lease ran out, or one awaiting reconciliation: the
                # claim below raises NeedsReconciliation (never a second run).
                spec = self.bar_for_execute(conn, row, decided)
                flow.refuse_async_on_loop(spec.fn)  # nothing claimed, the grant kept for aexecute
                try:
                    claim = self.store.claim(
                        key,
                        row.args_hash,
                        lease_seconds=self.policy.lease_seconds,
                        conn=conn,
                        user_id=row.user_id,
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
        except (TokenError, PolicyViolation) as exc:
            # The transaction rolled back; the refusal is recorded on its own (a grant for a row
            # changed since its proposal is refused as PolicyViolation "reclassified").
            reason = exc.reason if isinstance(exc, TokenError) else exc.code
            refused = self.events.event("token_refused", reason=reason)
            # As the token claims it (may name nothing); a malformed token names no approval.
            refused["approval_id"] = claims.approval_id if claims is not None else None
            self.events.record(refused)
            log.log(
                logging.WARNING if reason == "tampered" else logging.INFO,
                "grant refused (%s): approval=%s version=%s",
                reason,
                claims.approval_id if claims is not None else None,
                claims.version if claims is not None else None,
            )
            raise
        except Exception as exc:  # the claim committed, its reply lost: the tool runs (see `landed`)
            if row is None or not isinstance(claim, Claimed) or not self.landed(row, claim, exc):
                raise
        if deferred is not None:
            log_outcome("needs_reconciliation (outcome unknown)", row.tool, row, key, deferred.reason)
            self.notices.unknown_outcome(row, key, deferred.reason, deferred.provider_ref)
            raise deferred
        assert isinstance(claim, Claimed)
        call = context_of(row)
        tool_context = ToolContext(
            idempotency_key=key,
            call=call,
            approval_id=row.id,
            version=row.version,
            attempt=claim.attempt,
        )
        result = yield from self.settlement.run_claimed(
            spec,
            parse(row.args_json),
            row.args_hash,
            call,
            key=key,
            owner=claim.owner,
            tool_context=tool_context,
            row=row,
            args_text=row.args_json,
        )
        return result

    def landed(self, row: ApprovalRow, claim: Claimed, exc: Exception) -> bool:
        """Whether the claim's transaction committed although `exc` (the connection lost, its
        reply never received: a failover) says otherwise: the record, read back, is in flight
        under this claim's lease for these arguments. The grant was then spent by this very call,
        so the tool runs now; raising would leave it spent and the call never run."""
        held = claim_landed(self.store, exec_key(row), claim, row.args_hash, exc)
        if held:
            log.warning("connection lost after the claim was committed (it was): approval=%s", row.id)
        return held

    def resent_hash(self, row: ApprovalRow, args: Mapping[str, Any]) -> str | None:
        """The hash of arguments a framework re-sends, frozen as a call's arguments are."""
        spec = self.table.get(row.tool)
        try:
            return args_hash(row.tool, freeze(args, spec.schema if spec else None))
        except ArgumentError:
            return None

    def bar_for_execute(self, conn: Any, row: ApprovalRow, read: list[DecisionRow]) -> ToolSpec:
        """Re-derive, before anything runs, that the grant was made by enough distinct approvers
        holding the role the table requires (sealed decisions of the round that minted it), from
        `read`: the version's decisions, read with the row under its subject's lock."""
        try:
            spec, role, required = self.ledger.bar(row)
        except TamperedRecord as exc:
            raise TokenError("tampered", str(exc)) from exc
        approvers, denial = self.ledger.decided(conn, row, round_=row.grants - 1, role=role, read=read)
        if grant_released(self.keyring, read, row):  # whatever its stored expiry says by now
            raise TokenError("expired", f"the grant for approval {row.id} was given back unpresented")
        if denial is not None:
            raise TokenError(
                "revoked",
                f"approval {row.id} was denied by {denial.approver_id} (a sealed decision); its status "
                "column says otherwise because it was changed outside effectgate",
            )
        if row.grants < 1 or len(approvers) < required:
            for d in read:  # retired, not edited?
                kid = foreign_key(self.keyring, d.seal) if d.grant_round == row.grants - 1 else None
                if kid is not None:
                    raise TokenError("keyring_mismatch", f"approval {row.id}, a decision: {mismatch(kid)}")
            raise TokenError(
                "tampered",
                f"approval {row.id} has {len(approvers)} valid approval(s) of the {required} it needs",
            )
        return spec

    def finish_stored(self, conn: Any, row: ApprovalRow, result: Any) -> Executed:
        """The result was stored but the approval not yet marked: finish, return it as a replay."""
        now = self.clock.now()
        self.settlement.mark_executed(conn, row, updated_at=now, token_used_at=now)
        self.store.append_events(conn, [self.events.event("replay", row=row, status="executed")])
        log.info(
            "execution replayed (stored result): approval=%s version=%d key=%s",
            row.id,
            row.version,
            exec_key(row),
        )
        return stored_replay(row, result)
