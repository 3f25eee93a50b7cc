"""Direct runs: the calls that run without an approval, once `_calls.Calls` has routed them.

A read runs with its transient errors retried (backoff from the policy, on the injected clock)
and is recorded in the read log (`read`, or `read_failed` with the error's text). A write runs
once per (session, tool, origin message, args hash): its intent key is claimed in the
idempotency store (a call its message proposed for approval, or ran under another class, is
answered from that record: `_written.proposed_before`), a claim whose COMMIT landed with its
reply lost runs now, and the claimed run is settled by `_settle.Settlement`.

Logged on "effectgate._calls" (the routing part's logger): a write replayed at DEBUG, a claim
whose reply was lost at WARNING. Reads are not logged: their record is the read log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import flow
from ._deps import Deps, Events, claim_landed
from ._intent import reclassified_since
from ._logging import logger
from ._notice import Notices
from ._readlog import ReadLog
from ._settle import Settlement
from ._written import proposed_before, write_key
from .context import CallContext, ToolContext
from .errors import InProgress, NeedsReconciliation
from .outcomes import Executed, Outcome, Refused, executed
from .stores.base import Claimed, Stored
from .stores.records import ApprovalRow
from .table import ToolSpec

log = logger("effectgate._calls")


def error_of(exc: Exception) -> str:
    """A failed read's error text: `repr(exc)`, its type's name when that raises (the read is
    still recorded, and the tool's own exception raised)."""
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__name__}(...)"


class Direct:
    """Runs routed reads and writes; see the module docstring."""

    def __init__(
        self, deps: Deps, events: Events, notices: Notices, reads: ReadLog, settlement: Settlement
    ) -> None:
        self.store = deps.store
        self.policy = deps.policy
        self.clock = deps.clock
        self.keyring = deps.keyring
        self.events = events
        self.notices = notices
        self.reads = reads
        self.settlement = settlement

    def read(
        self, spec: ToolSpec, args: Mapping[str, Any], frozen: str, ctx: CallContext
    ) -> flow.Flow[Outcome]:
        attempt = 1
        while True:
            try:
                result = yield flow.Invoke(spec.fn, args)
                break
            except spec.transient as exc:
                if not self.retrying(spec, ctx, frozen, attempt, exc):
                    raise
                attempt += 1
            except Exception as exc:  # not transient: recorded as a failed read, then raised
                self.reads.add(self.events.read_row("read_failed", spec, ctx, frozen, attempt, error_of(exc)))
                raise
        self.reads.add(self.events.read_row("read", spec, ctx, frozen, attempt))
        return executed(spec.name, result)

    def retrying(self, spec: ToolSpec, ctx: CallContext, frozen: str, attempt: int, exc: Exception) -> bool:
        """After attempt `attempt` of a read failed transiently: back off and True, or, with the
        retries spent, record the failed read and False (the caller re-raises)."""
        if attempt > self.policy.read_retries:
            self.reads.add(self.events.read_row("read_failed", spec, ctx, frozen, attempt, error_of(exc)))
            return False
        self.clock.sleep(self.policy.retry_backoff * 2 ** (attempt - 1))
        return True

    def write(
        self, spec: ToolSpec, args: Mapping[str, Any], frozen: str, text: str, ctx: CallContext
    ) -> flow.Flow[Outcome]:
        key = write_key(spec.name, ctx, frozen)
        refusal: InProgress | NeedsReconciliation | None = None
        flow.refuse_async_on_loop(spec.fn)  # before the claim: the same call runs under acall
        claim: Claimed | Stored | None = None
        earlier: Executed | Refused | ApprovalRow | None = None
        try:
            with self.store.transaction() as conn:
                noted = self.events.note_rules(conn, spec)
                earlier = proposed_before(
                    self.store, conn, self.keyring, self.events, spec, args, frozen, ctx
                )
                try:
                    if earlier is None:
                        claim = self.store.claim(
                            key,
                            frozen,
                            lease_seconds=self.policy.lease_seconds,
                            conn=conn,
                            user_id=ctx.user_id,
                        )
                except (InProgress, NeedsReconciliation) as exc:
                    refusal = exc  # committed: a lapsed lease is now needs_reconciliation
        except Exception as exc:  # a claim whose COMMIT landed, its reply lost: it runs now
            if not claim_landed(self.store, key, claim, frozen, exc):
                raise
            log.warning("connection lost after the write's claim was committed (it was): key=%s", key)
        noted()
        if isinstance(earlier, Executed | Refused):  # its stored result, or its unknown outcome
            return earlier
        if earlier is not None:
            message = reclassified_since(spec.name, earlier, spec.effect)
            return self.events.refuse("mismatch", message, spec.name, ctx, spec, earlier.id, frozen)
        if isinstance(refusal, InProgress):
            message = f"{spec.name}: the same write is running now"
            return self.events.refuse("in_progress", message, spec.name, ctx, spec, args_hash_=frozen)
        if refusal is not None:  # its message quotes the write's error: erased with the write (args hash)
            reason = str(refusal)
            if refusal.expired:  # this claim found a dead worker's lease run out: `recover` never will
                why, ref = refusal.reason, refusal.provider_ref
                self.events.record(
                    self.events.event(
                        "needs_reconciliation", spec=spec, ctx=ctx, args_hash_=frozen, key=key, reason=why
                    )
                )
                self.notices.unknown_outcome(None, key, why, ref, tool=spec.name)
            return self.events.refuse("needs_reconciliation", reason, spec.name, ctx, spec, args_hash_=frozen)
        if isinstance(claim, Stored):
            self.events.record(self.events.event("replay", spec=spec, ctx=ctx, args_hash_=frozen, key=key))
            log.debug("write replayed: tool=%s key=%s", spec.name, key)
            return Executed(tool=spec.name, result=claim.result, replay=True, idempotency_key=key)
        assert claim is not None  # neither refused nor stored: claimed
        tool_context = ToolContext(idempotency_key=key, call=ctx, attempt=claim.attempt)
        result = yield from self.settlement.run_claimed(
            spec,
            args,
            frozen,
            ctx,
            key=key,
            owner=claim.owner,
            tool_context=tool_context,
            row=None,
            args_text=text,
        )
        return result
