"""EffectGate: one effect table between a model's tool calls and the tools, enforced in code.

Routing is a function of the table row and the arguments, never of model text:

- read: validate, check scope, run (transient errors retried with backoff), log.
- write: validate, check scope, run once per (session, tool, origin message, args hash),
  record the state before and after.
- gated classes (send, money, destructive by default): freeze the arguments, register or find
  the approval under the intent key, and return `Pending`. `approve` mints a single-use token
  bound to the frozen hash; `execute` runs the tool exactly once with it.

`EffectGate` is a facade of one-line delegations over parts that each receive their
dependencies explicitly (`_deps.Deps`): proposals (`_proposals`), decisions (`_decisions`),
execution (`_execution`), reconciliation (`_reconcile`), the ledger reading they share
(`_ledger`), events and notices. It depends on the store protocols (`stores.protocol`), never on
one backend. `gate.flows` exposes the operations as flows (`effectgate.flow`) for adapters that
compose them with `yield from`.

Observability: decisions, refusals, executions and reconciliations are logged through `logging`
(one logger per part under "effectgate", no handler installed; reads are not logged), and call,
approve and execute are OpenTelemetry spans when `opentelemetry-api` is installed (`_telemetry`).
Neither is the record: the ledger is, and a failing tracer changes no outcome.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import flow
from ._adecide import VOIDED, decided, void
from ._calls import Calls, ToolCallLike
from ._clock import SYSTEM_CLOCK, Clock, uuid4_hex
from ._decisions import Decisions
from ._deps import Deps, Events
from ._devkeys import gate_keyring
from ._execution import Execution
from ._ledger import Ledger
from ._notice import Notices, Notify
from ._owned import own_store
from ._proposals import Proposals
from ._readlog import ReadLog
from ._reconcile import Reconciliation
from ._release import release
from ._settle import Settlement
from ._telemetry import Spans
from .audit import AuditReport, audit
from .context import Approver, CallContext
from .effects import Policy
from .outcomes import (
    Card,
    Decision,
    Executed,
    Outcome,
    ReconciliationNotice,
    RefusalCode,
    Refused,
    SubjectView,
    VersionEntry,
)
from .stores.protocol import Store
from .table import EffectTable
from .tokens import Keyring

__all__ = ["EffectGate", "Flows", "ReconciliationNotice", "SubjectView", "ToolCallLike", "VersionEntry"]


def _text_reason(reason: object) -> None:
    if not isinstance(reason, str):  # before any row is read: nothing changes
        raise TypeError(f"a denial reason must be text (got {type(reason).__name__})")


class Flows:
    """The gate's operations as flows (`effectgate.flow`): generators an adapter composes into
    its own with `yield from` and runs with `flow.drive` / `flow.adrive`. Each is the same body
    the gate's own methods run."""

    def __init__(
        self,
        calls: Calls,
        proposals: Proposals,
        decisions: Decisions,
        execution: Execution,
        ledger: Ledger,
        spans: Spans,
    ) -> None:
        self._spans = spans
        self._calls = calls
        self._proposals = proposals
        self._ledger = ledger
        self._decisions = decisions
        self._execution = execution

    def call(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> flow.Flow[Outcome]:
        return self._spans.call_flow(name, self._calls.call_flow(name, args, ctx))

    def edit(
        self, name: str, args: Mapping[str, Any], ctx: CallContext, *, editor: str
    ) -> flow.Flow[Outcome]:
        """A reviewer's edit of a waiting call: the same call with new arguments, recorded as
        edited by `editor` (a new version that still needs its own approval)."""
        return self._spans.call_flow(name, self._calls.call_flow(name, args, ctx, edited_by=editor))

    def versions(self, approval_id: str) -> flow.Flow[tuple[VersionEntry, ...]]:
        return flow.done(self._ledger.versions, approval_id)

    def card(self, approval_id: str) -> flow.Flow[Card]:
        return flow.done(self._ledger.card, approval_id)

    def call_step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> flow.Flow[list[Outcome]]:
        return self._calls.step_flow(calls, ctx)

    def execute(self, token: str, args: Mapping[str, Any] | None = None) -> flow.Flow[Executed]:
        return self._spans.execute_flow(token, self._execution.execute_flow(token, args))

    def deny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> flow.Flow[Refused]:
        _text_reason(reason)
        return flow.done(self._decisions.deny, approval_id, approver=approver, reason=reason, version=version)


class EffectGate:
    """Enforces an effect table over a store. Thread-safe; one per process is typical."""

    def __init__(
        self,
        table: EffectTable,
        store: Store,
        *,
        policy: Policy | None = None,
        keyring: Keyring | None = None,
        clock: Clock | None = None,
        ids: Callable[[], str] | None = None,
        on_needs_reconciliation: Callable[[ReconciliationNotice], None] | None = None,
        notify: Notify | Sequence[Notify] | None = None,
        read_log_batch: int = 4096,
        tracer_provider: object | None = None,
    ) -> None:
        """`tracer_provider`: the OpenTelemetry `TracerProvider` for the gate's spans (the global
        one when None; spans are no-ops without `opentelemetry-api`)."""
        policy = policy or Policy()
        table.bind(policy)  # every row, and each registered later, meets the policy
        # One resolution with the CLI and the inbox: $EFFECTGATE_KEYRING, else a SQLite file's key
        # file beside it (never a new one over records), else MissingKeyring saying how to set one.
        keyring = keyring or gate_keyring(store)
        own_store(store.url)  # its database, journals and key file: never the file tools' (`_owned`)
        notifiers = () if notify is None else tuple(notify) if isinstance(notify, Sequence) else (notify,)
        for hook in notifiers:
            # A webhook receiver holds its signing key: it must never be able to mint grants.
            ring = getattr(hook, "keyring", None)
            if isinstance(ring, Keyring) and ring.shares_key(keyring):
                raise ValueError(
                    "a notifier must not sign with the gate's grant keyring: give it its own keys"
                )
        store.check()  # no schema, or another schema version: refused before anything is read
        self.deps = Deps(
            table=table,
            store=store,
            policy=policy,
            keyring=keyring,
            clock=clock or store.clock or SYSTEM_CLOCK,
            ids=ids or uuid4_hex,
        )
        self._reads = ReadLog(store, batch=read_log_batch)
        self._spans = Spans(table, tracer_provider)
        self._events = Events(self.deps)
        self._ledger = Ledger(self.deps, self._events)
        self._notices = Notices(self.deps, self._events, self._ledger, notifiers, on_needs_reconciliation)
        self._settlement = Settlement(self.deps, self._events, self._notices)
        self._execution = Execution(self.deps, self._events, self._ledger, self._notices, self._settlement)
        self._proposals = Proposals(self.deps, self._events, self._ledger)
        self._calls = Calls(
            self.deps,
            self._events,
            self._notices,
            self._reads,
            self._proposals,
            self._settlement,
            self._spans,
        )
        self._decisions = Decisions(self.deps, self._events, self._ledger)
        self._reconciliation = Reconciliation(
            self.deps, self._events, self._ledger, self._notices, self._settlement
        )
        self.flows = Flows(
            self._calls, self._proposals, self._decisions, self._execution, self._ledger, self._spans
        )

    # -- what the gate enforces with

    @property
    def table(self) -> EffectTable:
        return self.deps.table

    @property
    def store(self) -> Store:
        return self.deps.store

    @property
    def policy(self) -> Policy:
        return self.deps.policy

    @property
    def keyring(self) -> Keyring:
        return self.deps.keyring

    @property
    def clock(self) -> Clock:
        return self.deps.clock

    # -- lifecycle

    def flush(self) -> None:
        """Write buffered read records now (a background thread writes them within 200 ms)."""
        self._reads.flush()

    def close(self) -> None:
        """Write buffered read records and stop the background threads (read log, lease renewal);
        the renewal stops also when the reads cannot be written (they stay buffered, the error
        raised)."""
        try:
            self._reads.close()
        finally:
            self._settlement.leases.close()

    def __enter__(self) -> EffectGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls

    def call(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> Outcome:
        """Route one tool call: run it, or pause it for approval, or refuse it. See the module doc."""
        return self._spans.call(name, lambda: self._calls.call(name, args, ctx))

    async def acall(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> Outcome:
        return await self._spans.acall(name, lambda: flow.adrive(self._calls.call_flow(name, args, ctx)))

    def call_step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[Outcome]:
        """One model step's calls. Two or more calls of one gated tool register none of them."""
        return flow.drive(self._calls.step_flow(calls, ctx))

    async def acall_step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[Outcome]:
        return await flow.adrive(self._calls.step_flow(calls, ctx))

    def refuse(
        self, name: str, ctx: CallContext, *, code: RefusalCode, message: str, approval_id: str | None = None
    ) -> Refused:
        """Record and return a refusal an adapter decided (e.g. a paused call whose arguments no
        longer match its approval); the refusal is an event like the gate's own."""
        return self._events.refuse(code, message, name, ctx, self.table.get(name), approval_id)

    def note(self, kind: str, *, ctx: CallContext | None = None, **detail: Any) -> None:
        """Append an application event (e.g. "demo_started") to the gate's log, about the call
        `ctx` if given. Every other keyword is detail (`tool=` too: never the event's own fields)."""
        if ctx is not None and not isinstance(ctx, CallContext):
            raise TypeError(f"ctx must be a CallContext (got {type(ctx).__name__})")
        event = self._events.event(kind, ctx=ctx)
        event["detail_json"] = {**detail, **event["detail_json"]}  # with the tool call id, if any
        self._events.record(event)

    def versions(self, approval_id: str) -> tuple[VersionEntry, ...]:
        """Each version of an approval, oldest first, with its args hash and proposing message."""
        return self._ledger.versions(approval_id)

    # -- reading the ledger

    def card(self, approval_id: str) -> Card:
        return self._ledger.card(approval_id)

    def pending(self, *, role: str | None = None, session_id: str | None = None) -> list[Card]:
        """Approvals waiting for a decision, newest first; `role`: those this role may decide."""
        return self._ledger.pending(role=role, session_id=session_id)

    def subject_view(self, approval_id: str) -> SubjectView:
        return self._ledger.subject_view(approval_id)

    def expire(self) -> None:
        """Mark every pending approval past its deadline as expired (also done lazily)."""
        self._ledger.expire()

    def warn_expiring(self, *, within: float) -> list[Card]:
        """Notify about pending approvals lapsing within `within` seconds (once per version)."""
        return self._notices.warn_expiring(within=within)

    # -- decisions

    def approve(self, approval_id: str, *, version: int, approver: Approver) -> Decision:
        """Approve one version (see `_decisions.Decisions.approve`)."""
        return self._spans.approve(
            approval_id,
            version,
            lambda: self._decisions.approve(approval_id, version=version, approver=approver),
        )

    async def aapprove(self, approval_id: str, *, version: int, approver: Approver) -> Decision:
        """`approve` in a worker thread; cancelled, it waits for the thread and voids a grant it
        minted (nobody holds its token: approve again), see `_adecide`."""
        return await decided(
            functools.partial(self.approve, approval_id, version=version, approver=approver),
            functools.partial(void, functools.partial(release, self.deps, self._events, **VOIDED)),
        )

    def deny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> Refused:
        """Close a pending (or approved, not yet executed) approval; the model will be told why."""
        _text_reason(reason)
        return self._decisions.deny(approval_id, approver=approver, reason=reason, version=version)

    async def adeny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> Refused:
        """`deny` in a worker thread; a denial that lands is final, also when the call was
        cancelled meanwhile (it waits for the thread, and its CancelledError notes the denial)."""
        deny = functools.partial(self.deny, approval_id, approver=approver, reason=reason, version=version)
        return await decided(deny, lambda refused: False)

    def release(self, token: str) -> None:
        """Give back an unpresented grant (see `_release`): the token is void from now on and the
        approval, still approved, can be granted again (`approve`, a new round of approvers).
        Raises TokenError (as `execute` would refuse it) and changes nothing otherwise."""
        release(self.deps, self._events, token)

    # -- execution and after

    def execute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        """Run an approved call exactly once. `args`, when given (what a framework re-sends),
        must hash to the frozen value. The tool always receives the frozen arguments.
        Raises TokenError (expired, used, forged, mismatch, revoked, tampered) and runs nothing."""
        return self._spans.execute(token, lambda: flow.drive(self._execution.execute_flow(token, args)))

    async def aexecute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        return await self._spans.aexecute(
            token, lambda: flow.adrive(self._execution.execute_flow(token, args))
        )

    def result(self, approval_id: str) -> Executed | None:
        """The stored result of an executed approval (None while it has not succeeded)."""
        return self._reconciliation.result(approval_id)

    def reconcile(self, approval_id: str, *, approver: Approver | None = None) -> Executed | None:
        """Settle a `needs_reconciliation` approval (or a write: its idempotency key, as its
        `NeedsReconciliation.key` names it) through the tool's `reconcile(key)` hook."""
        return flow.drive(self._reconciliation.reconcile_flow(approval_id, approver))

    def settle(
        self,
        approval_id: str,
        *,
        happened: bool,
        result: Any = None,
        by: str,
        provider_ref: str | None = None,
    ) -> Executed | None:
        """A person settles a reconciliation (an approval, or a write by its idempotency key): it
        happened (with its result), or it did not."""
        if type(happened) is not bool:  # "false" is truthy: it would settle as happened
            raise TypeError(f"happened must be True or False (got {type(happened).__name__})")
        return self._reconciliation.settle(
            approval_id, happened=happened, result=result, by=by, provider_ref=provider_ref
        )

    def recover(self) -> list[str]:
        """After a crash: in-flight records whose lease expired become needs_reconciliation (each
        on its own: a reconciliation that raises is logged and recorded, and the next goes on)."""
        return self._reconciliation.recover()

    def audit(self, *, table: EffectTable | None = None) -> AuditReport:
        """The audit scan against this gate's table (or another, e.g. a proposed reclassification)."""
        self.flush()
        return audit(self.store, table or self.table, self.policy, keyring=self.keyring)
