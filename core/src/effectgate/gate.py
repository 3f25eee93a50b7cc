"""EffectGate: the one state machine between a model's tool calls and the tools.

Routing is a function of the table row and the arguments, never of model text:

- read: validate, check scope, run (transient errors retried with backoff), log.
- write: validate, check scope, run once per (session, tool, origin message, args hash),
  record the state before and after.
- gated classes (send, money, destructive by default): freeze the arguments, register or find
  the approval under the intent key, and return `Pending`. `approve` mints a single-use token
  bound to the frozen hash; `execute` runs the tool exactly once with it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _flow
from ._clock import SYSTEM_CLOCK, Clock
from ._execution import WRITE_PREFIX, ExecutionMixin, context_of, exec_key
from ._notice import NoticeMixin, Notify
from ._readlog import ReadLog
from ._seal import approval_intact, decision_intact, seal_approval, seal_decision
from .audit import AuditReport, audit
from .canonical import args_hash, canonical_json, digest, freeze, key_of
from .context import Approver, CallContext, Confirmation, SubjectEntry, ToolContext
from .effects import Effect, Policy
from .errors import (
    AlreadyDecided,
    ApprovalExpired,
    ArgumentError,
    ConfirmFailed,
    InProgress,
    NeedsReconciliation,
    PolicyViolation,
    StaleApproval,
    TamperedRecord,
    UnknownApproval,
    WrongApprover,
)
from .outcomes import Card, Executed, Grant, Invalid, Outcome, PartialApproval, Pending, RefusalCode, Refused
from .stores.base import Stored
from .stores.records import ApprovalRow, DecisionRow
from .stores.sql import SQLStore
from .table import EffectTable, SchemaError, ToolSpec
from .tokens import Keyring, token_hash

ToolCallLike = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], str | None]


@dataclass(frozen=True, kw_only=True)
class ReconciliationNotice:
    """Sent to `on_needs_reconciliation`: who must look at which operation, and why."""

    key: str
    tool: str
    reason: str
    approval_id: str | None = None
    approver_role: str | None = None
    provider_ref: str | None = None


@dataclass(frozen=True)
class VersionEntry:
    """One version of an approval: its number, args hash and the proposing user message."""

    version: int
    args_hash: str
    origin_message_id: str


@dataclass(frozen=True)
class SubjectView:
    """The subject's other approvals of the same tool, newest first, and its balance if known."""

    history: tuple[SubjectEntry, ...]
    balance: Any = None


class EffectGate(ExecutionMixin, NoticeMixin):
    """Enforces an effect table over a store. Thread-safe; one per process is typical."""

    def __init__(
        self,
        table: EffectTable,
        store: SQLStore,
        *,
        policy: Policy | None = None,
        keyring: Keyring | None = None,
        clock: Clock | None = None,
        ids: Callable[[], str] | None = None,
        on_needs_reconciliation: Callable[[ReconciliationNotice], None] | None = None,
        notify: Notify | Sequence[Notify] | None = None,
        read_log_batch: int = 256,
    ) -> None:
        self.table = table
        self.store = store
        self.policy = policy or Policy()
        for spec in table:
            spec.check_policy(self.policy)
        self.keyring = keyring or Keyring.from_env() or Keyring.generate()
        self.clock = clock or store.clock or SYSTEM_CLOCK
        self._ids = ids or (lambda: uuid.uuid4().hex)
        self._notify = on_needs_reconciliation
        self._notifiers = (
            () if notify is None else tuple(notify) if isinstance(notify, Sequence) else (notify,)
        )
        for hook in self._notifiers:
            # A webhook receiver holds its signing key: it must never be able to mint grants.
            ring = getattr(hook, "keyring", None)
            if isinstance(ring, Keyring) and ring.shares_key(self.keyring):
                raise ValueError(
                    "a notifier must not sign with the gate's grant keyring: give it its own keys"
                )
        store.check()  # no schema, or another schema version: refused before anything is read
        self._reads = ReadLog(store, batch=read_log_batch)
        self._recorded_rules: set[str] = set()

    # -- lifecycle

    def flush(self) -> None:
        """Write buffered read records now (a background thread writes them within 200 ms)."""
        self._reads.flush()

    def close(self) -> None:
        self._reads.close()

    def __enter__(self) -> EffectGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _event(
        self,
        kind: str,
        *,
        spec: ToolSpec | None = None,
        tool: str | None = None,
        ctx: CallContext | None = None,
        row: ApprovalRow | None = None,
        args_hash_: str | None = None,
        **detail: Any,
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "at": self.clock.now(),
            "kind": kind,
            "detail_json": detail,
            "table_fingerprint": self.table.fingerprint,
        }
        if spec is not None:
            event.update(tool=spec.name, effect=str(spec.effect), row_fingerprint=spec.fingerprint)
        if tool is not None:
            event["tool"] = tool
        if row is not None:
            event.update(
                approval_id=row.id,
                version=row.version,
                tool=row.tool,
                effect=row.effect,
                args_hash=row.args_hash,
                session_id=row.session_id,
                user_id=row.user_id,
                origin_message_id=row.origin_message_id,
                agent_id=row.agent_id,
                run_id=row.run_id,
            )
        if ctx is not None:
            event.update(
                session_id=ctx.session_id,
                origin_message_id=ctx.origin_message_id,
                user_id=ctx.user_id,
                agent_id=ctx.agent_id,
                run_id=ctx.run_id,
            )
            if ctx.tool_call_id:
                event["detail_json"] = {**detail, "tool_call_id": ctx.tool_call_id}
        if args_hash_ is not None:
            event["args_hash"] = args_hash_
        return event

    def _record(self, *events: dict[str, Any]) -> None:
        with self.store.transaction() as conn:
            self.store.append_events(conn, list(events))

    # -- calls

    def call(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> Outcome:
        """Route one tool call: run it, or pause it for approval, or refuse it. See the module doc."""
        return _flow.drive(self._call_flow(name, args, ctx))

    async def acall(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> Outcome:
        return await _flow.adrive(self._call_flow(name, args, ctx))

    def call_step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[Outcome]:
        """One model step's calls. Two or more calls of one gated tool register none of them."""
        return [_flow.drive(f) if f is not None else r for f, r in self._step(calls, ctx)]  # type: ignore[misc]

    async def acall_step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[Outcome]:
        return [await _flow.adrive(f) if f is not None else r for f, r in self._step(calls, ctx)]  # type: ignore[misc]

    def _step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[tuple[Any, Outcome | None]]:
        counts: dict[str, int] = {}
        for call in calls:
            counts[call[0]] = counts.get(call[0], 0) + 1
        out: list[tuple[Any, Outcome | None]] = []
        refusals: list[dict[str, Any]] = []
        for call in calls:
            name, args = call[0], call[1]
            call_ctx = _with_call_id(ctx, call[2] if len(call) > 2 else None)
            spec = self.table.get(name)
            if spec is not None and self.policy.gates(spec.effect) and counts[name] > 1:
                message = (
                    f"{counts[name]} calls of {name} in one step; none was registered. "
                    f"Make one call with the arguments you intend."
                )
                out.append((None, Refused(code="parallel_calls", message=message, tool=name)))
                refusals.append(self._event("refused", spec=spec, ctx=call_ctx, code="parallel_calls"))
            else:
                out.append((self._call_flow(name, args, call_ctx), None))
        if refusals:
            self._record(*refusals)
        return out

    def _refuse(
        self,
        code: RefusalCode,
        message: str,
        name: str,
        ctx: CallContext,
        spec: ToolSpec | None = None,
        approval_id: str | None = None,
    ) -> Refused:
        self._record(
            self._event(
                "refused",
                spec=spec,
                tool=name,
                ctx=ctx,
                code=code,
                message=message,
                refused_approval=approval_id,
            )
        )
        return Refused(code=code, message=message, tool=name, approval_id=approval_id)

    def _call_flow(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> _flow.Flow[Outcome]:
        spec = self.table.get(name)
        if spec is None:
            return self._refuse("unknown_tool", f"{name!r} is not a tool in the effect table", name, ctx)
        if not self.table.allowed(ctx.agent_id, name):
            return self._refuse("not_allowed", f"agent {ctx.agent_id!r} may not call {name}", name, ctx, spec)
        checked = self._validate(spec, args)
        if isinstance(checked, Invalid):
            self._record(
                self._event("invalid", spec=spec, ctx=ctx, errors=[e.__dict__ for e in checked.errors])
            )
            return checked
        args = checked  # the frozen copy: what is checked, hashed, recorded and run
        if spec.effect is Effect.READ:  # READ is always autonomous (Policy refuses to gate it)
            if not self._in_scope(spec, args, ctx):
                return self._refuse(
                    "out_of_scope", f"{name}: the caller may not access this subject", name, ctx, spec
                )
            return (yield from self._read(spec, args, ctx))
        frozen = args_hash(name, args)
        if self.policy.gates(spec.effect):
            outcome = self._propose(spec, args, frozen, ctx)
            if isinstance(outcome, Pending) and not outcome.replay:
                self._announce_card("pending", outcome.card)  # a new approval, or a new version
            return outcome
        if not self._in_scope(spec, args, ctx):
            return self._refuse(
                "out_of_scope", f"{name}: the caller may not access this subject", name, ctx, spec
            )
        return (yield from self._write(spec, args, frozen, ctx))

    def refuse(
        self,
        name: str,
        ctx: CallContext,
        *,
        code: RefusalCode,
        message: str,
        approval_id: str | None = None,
    ) -> Refused:
        """Record and return a refusal an adapter decided (e.g. a paused call whose arguments no
        longer match its approval); the refusal is an event like the gate's own."""
        return self._refuse(code, message, name, ctx, self.table.get(name), approval_id)

    def versions(self, approval_id: str) -> tuple[VersionEntry, ...]:
        """Each version of an approval, oldest first: its args hash and the user message that
        proposed it (the same message for a reviewer's edit, another one for an amendment)."""
        out = {
            e.version: VersionEntry(e.version, e.args_hash or "", e.origin_message_id or "")
            for e in self.store.events(approval_id=approval_id)
            if e.kind in ("proposed", "amended") and e.version is not None
        }
        return tuple(out[v] for v in sorted(out))

    @staticmethod
    def _validate(spec: ToolSpec, args: Any) -> dict[str, Any] | Invalid:
        """The frozen copy of valid arguments (see `canonical.freeze`), or Invalid with pointers."""
        if not isinstance(args, Mapping):
            return Invalid(tool=spec.name, errors=(SchemaError("", "arguments must be a JSON object"),))
        try:
            frozen: dict[str, Any] = freeze(args, spec.schema)
        except ArgumentError as exc:
            return Invalid(tool=spec.name, errors=(SchemaError(exc.pointer, exc.detail),))
        errors = spec.validate(frozen)
        return Invalid(tool=spec.name, errors=tuple(errors)) if errors else frozen

    @staticmethod
    def _in_scope(spec: ToolSpec, args: Mapping[str, Any], ctx: CallContext) -> bool:
        if spec.scope is None:
            return True
        try:
            return bool(spec.scope(args, ctx))
        except Exception:  # a check that cannot decide denies
            return False

    def _read(self, spec: ToolSpec, args: Mapping[str, Any], ctx: CallContext) -> _flow.Flow[Outcome]:
        attempt = 0
        while True:
            try:
                result = yield _flow.Invoke(spec.fn, args)
                break
            except spec.transient as exc:
                attempt += 1
                if attempt > self.policy.read_retries:
                    failed = self._event("read_failed", spec=spec, ctx=ctx, attempts=attempt, error=repr(exc))
                    self._reads.add(failed, args)
                    raise
                self.clock.sleep(self.policy.retry_backoff * 2 ** (attempt - 1))
        self._reads.add(self._event("read", spec=spec, ctx=ctx, attempts=attempt + 1), args)
        return Executed(tool=spec.name, result=result)

    def _write(
        self, spec: ToolSpec, args: Mapping[str, Any], frozen: str, ctx: CallContext
    ) -> _flow.Flow[Outcome]:
        key = f"{WRITE_PREFIX}{spec.name}_" + key_of(
            "write", ctx.session_id, spec.name, ctx.origin_message_id, frozen
        )
        self._note_rules(spec)
        try:
            claim = self.store.claim(key, frozen, lease_seconds=self.policy.lease_seconds)
        except InProgress:
            return self._refuse(
                "in_progress", f"{spec.name}: the same write is running now", spec.name, ctx, spec
            )
        except NeedsReconciliation as exc:
            return self._refuse("needs_reconciliation", str(exc), spec.name, ctx, spec)
        if isinstance(claim, Stored):
            self._record(self._event("replay", spec=spec, ctx=ctx, args_hash_=frozen, key=key))
            return Executed(tool=spec.name, result=claim.result, replay=True, idempotency_key=key)
        tool_context = ToolContext(idempotency_key=key, call=ctx, attempt=claim.attempt)
        result = yield from self._run_claimed(
            spec, args, frozen, ctx, key=key, owner=claim.owner, tool_context=tool_context, row=None
        )
        return result

    # -- gated calls: proposal, replay, amendment

    def _propose(self, spec: ToolSpec, args: Mapping[str, Any], frozen: str, ctx: CallContext) -> Outcome:
        subject = spec.subject_of(args)
        subject_key = digest({"subject": subject}) if subject is not None else f"args:{frozen}"
        intent = key_of(
            "intent",
            ctx.session_id,
            spec.name,
            ctx.origin_message_id,
            subject if subject is not None else dict(args),
        )
        role, notes = spec.role_for(args)
        assert role is not None  # check_policy guarantees a role for every gated row
        self._note_rules(spec)
        now = self.clock.now()
        with self.store.transaction() as conn:
            self.store.lock(conn, f"session:{ctx.session_id}")
            self.store.lock(conn, f"subject:{subject_key}")
            self._expire_due(conn, session_id=ctx.session_id)
            existing = self.store.approval_for_key(conn, intent)
            if existing is not None and existing.status != "pending":
                return self._replayed(conn, existing, frozen, ctx)
            if existing is not None and (self.store.key_version(conn, intent) or 0) < existing.version:
                # A replay of a message that a later message already amended: answer with the
                # current version; an old message must not roll the amendment back.
                self.store.append_events(
                    conn, [self._event("replay", row=existing, ctx=ctx, superseded=True)]
                )
                return Pending(
                    approval_id=existing.id,
                    version=existing.version,
                    card=self._card(conn, existing),
                    replay=True,
                )
            if existing is None and not self._in_scope(spec, args, ctx):
                row = self._new_row(
                    spec, args, frozen, ctx, subject, subject_key, role, notes, now, status="rejected"
                )
                row.reason = "out of scope: the caller may not act on this subject"
                self.store.insert_approval(conn, row)
                self.store.add_key(conn, intent, row.id, 1, ctx.origin_message_id)
                self.store.append_events(
                    conn, [self._event("rejected", row=row, spec=spec, code="out_of_scope")]
                )
                return Refused(
                    code="out_of_scope",
                    message=f"{spec.name}: {row.reason}",
                    tool=spec.name,
                    approval_id=row.id,
                )
            pending = existing or self.store.pending_in_session(conn, ctx.session_id, spec.name, subject_key)
            if pending is not None:
                return self._amend(
                    conn, spec, pending, args, frozen, ctx, intent, role, notes, replay=existing is not None
                )
            busy = self.store.in_flight_elsewhere(conn, subject_key, ctx.session_id, now)
            if busy is not None:
                message = (
                    f"{spec.name}: approval {busy.id} ({busy.tool}) is already in flight on "
                    f"this subject from another session"
                )
                self.store.append_events(
                    conn, [self._event("refused", spec=spec, ctx=ctx, code="subject_busy", busy=busy.id)]
                )
                return Refused(code="subject_busy", message=message, tool=spec.name, approval_id=busy.id)
            if self.store.count_pending(conn, ctx.session_id) >= self.policy.max_pending_per_session:
                self.store.append_events(
                    conn, [self._event("refused", spec=spec, ctx=ctx, code="too_many_pending")]
                )
                message = f"this session already has {self.policy.max_pending_per_session} approvals waiting"
                return Refused(code="too_many_pending", message=message, tool=spec.name)
            reason = self._confirm(conn, spec, args, ctx, subject_key, exclude=None)
            if reason is not None:
                self.store.append_events(
                    conn, [self._event("refused", spec=spec, ctx=ctx, code="confirm_failed", reason=reason)]
                )
                return Refused(code="confirm_failed", message=f"{spec.name}: {reason}", tool=spec.name)
            row = self._new_row(
                spec, args, frozen, ctx, subject, subject_key, role, notes, now, status="pending"
            )
            self.store.insert_approval(conn, row)
            self.store.add_key(conn, intent, row.id, 1, ctx.origin_message_id)
            self.store.append_events(conn, [self._event("proposed", row=row, spec=spec)])
            return Pending(approval_id=row.id, version=1, card=Card.from_record(row))

    def _new_row(
        self,
        spec: ToolSpec,
        args: Mapping[str, Any],
        frozen: str,
        ctx: CallContext,
        subject: dict[str, Any] | None,
        subject_key: str,
        role: str,
        notes: list[str],
        now: float,
        *,
        status: str,
    ) -> ApprovalRow:
        row = ApprovalRow(
            id=self._ids(),
            session_id=ctx.session_id,
            origin_message_id=ctx.origin_message_id,
            user_id=ctx.user_id,
            agent_id=ctx.agent_id,
            run_id=ctx.run_id,
            tool=spec.name,
            effect=str(spec.effect),
            reversibility=str(spec.reversibility),
            owner=spec.owner,
            subject_key=subject_key,
            subject_json=json.dumps(subject) if subject is not None else None,
            args_json=json.dumps(dict(args), sort_keys=True),
            args_hash=frozen,
            approver_role=role,
            notes_json=json.dumps(notes),
            approvals_required=self.policy.approvals_needed(spec.effect),
            status=status,
            version=1,
            created_at=now,
            updated_at=now,
            expires_at=now + self.policy.pending_ttl,
            row_fingerprint=spec.fingerprint,
            table_fingerprint=self.table.fingerprint,
            policy_fingerprint=self.policy.fingerprint,
            has_confirm=spec.confirm is not None,
        )
        row.seal = seal_approval(self.keyring, row)
        return row

    def _note_rules(self, spec: ToolSpec | None) -> None:
        """Record the canonical form of `spec`'s row and of the policy (once per process), so the
        audit can check every approval against the rule it was made under."""
        rules = []
        if self.policy.fingerprint not in self._recorded_rules:
            rules.append(
                (self.policy.fingerprint, "policy", canonical_json(self.policy.canonical()).decode())
            )
        if spec is not None and spec.fingerprint not in self._recorded_rules:
            rules.append((spec.fingerprint, "row", canonical_json(spec.canonical()).decode()))
        if rules:
            with self.store.transaction() as conn:
                self.store.add_rules(conn, rules)
            self._recorded_rules.update(r[0] for r in rules)

    def _amend(
        self,
        conn: Any,
        spec: ToolSpec,
        row: ApprovalRow,
        args: Mapping[str, Any],
        frozen: str,
        ctx: CallContext,
        intent: str,
        role: str,
        notes: list[str],
        *,
        replay: bool,
    ) -> Outcome:
        if not approval_intact(self.keyring, row):
            raise TamperedRecord(row.id, "its seal or arguments hash does not verify")
        if row.args_hash == frozen:
            if not replay:
                self.store.add_key(conn, intent, row.id, row.version, ctx.origin_message_id)
            self.store.append_events(conn, [self._event("replay", row=row, ctx=ctx)])
            return Pending(approval_id=row.id, version=row.version, card=self._card(conn, row), replay=True)
        reason = self._confirm(conn, spec, args, ctx, row.subject_key, exclude=row.id)
        if reason is not None:
            self.store.append_events(
                conn, [self._event("refused", spec=spec, ctx=ctx, code="confirm_failed", reason=reason)]
            )
            return Refused(
                code="confirm_failed", message=f"{spec.name}: {reason}", tool=spec.name, approval_id=row.id
            )
        now = self.clock.now()
        values = {
            "version": row.version + 1,
            "args_json": json.dumps(dict(args), sort_keys=True),
            "args_hash": frozen,
            "approver_role": role,
            "approvals_required": self.policy.approvals_needed(spec.effect),
            "notes_json": json.dumps(notes),
            "updated_at": now,
            "expires_at": now + self.policy.pending_ttl,
            "row_fingerprint": spec.fingerprint,
            "table_fingerprint": self.table.fingerprint,
            "policy_fingerprint": self.policy.fingerprint,
            "origin_message_id": ctx.origin_message_id,
        }
        values["seal"] = seal_approval(self.keyring, row.model_copy(update=values))
        if not self.store.update_approval(
            conn, row.id, expect_status=["pending"], expect_version=row.version, values=values
        ):
            raise StaleApproval(row.id, row.version, row.version + 1)  # pragma: no cover - locked
        self.store.add_key(conn, intent, row.id, row.version + 1, ctx.origin_message_id)
        updated = self.store.approval(conn, row.id)
        assert updated is not None
        self.store.append_events(conn, [self._event("amended", row=updated, previous_hash=row.args_hash)])
        return Pending(approval_id=row.id, version=updated.version, card=Card.from_record(updated))

    def _replayed(self, conn: Any, row: ApprovalRow, frozen: str, ctx: CallContext) -> Outcome:
        """The intent key found a decided approval: answer as before, never a second one."""
        # The intent (session, tool, message, subject) is what counts: a replay whose arguments
        # came out differently still answers with this approval, never a second one.
        self.store.append_events(
            conn,
            [self._event("replay", row=row, ctx=ctx, status=row.status, same_args=row.args_hash == frozen)],
        )
        if row.status == "rejected":
            return Refused(
                code="out_of_scope", message=f"{row.tool}: {row.reason}", tool=row.tool, approval_id=row.id
            )
        if row.status == "denied":
            return Refused(
                code="denied",
                message=f"{row.tool} was denied: {row.reason}",
                tool=row.tool,
                approval_id=row.id,
            )
        if row.status == "expired":
            return Refused(
                code="expired",
                message=f"approval {row.id} for {row.tool} expired undecided",
                tool=row.tool,
                approval_id=row.id,
            )
        if row.status == "failed":
            return Refused(
                code="failed",
                message=f"{row.tool} ran and failed: {row.reason}. A new attempt needs a new request",
                tool=row.tool,
                approval_id=row.id,
            )
        if row.status == "executed":
            record = self.store._load(conn, exec_key(row))
            result = record.result if record is not None else None
            return Executed(
                tool=row.tool,
                result=result,
                replay=True,
                approval_id=row.id,
                version=row.version,
                idempotency_key=exec_key(row),
            )
        return Pending(
            approval_id=row.id,
            version=row.version,
            card=self._card(conn, row),
            status=row.status,
            replay=True,
        )

    def _confirm(
        self,
        conn: Any,
        spec: ToolSpec,
        args: Mapping[str, Any],
        ctx: CallContext,
        subject_key: str,
        *,
        exclude: str | None,
    ) -> str | None:
        if spec.confirm is None:
            return None
        history = self._history(conn, spec.name, subject_key, exclude)
        try:
            return spec.confirm(args, Confirmation(call=ctx, history=history))
        except Exception as exc:  # a check that cannot decide refuses
            return f"confirm check raised {type(exc).__name__}: {exc}"

    def _history(
        self, conn: Any, tool: str, subject_key: str, exclude: str | None
    ) -> tuple[SubjectEntry, ...]:
        """The subject's other approvals of `tool`, oldest first, each marked whether it is in effect."""
        now = self.clock.now()
        return tuple(
            SubjectEntry(
                approval_id=r.id,
                status=r.status,
                version=r.version,
                args=json.loads(r.args_json),
                created_at=r.created_at,
                in_effect=r.status == "executed"
                or (
                    r.status == "approved"
                    and (r.token_used_at is not None or (r.token_expires_at or 0) > now)
                ),
            )
            for r in self.store.subject_history(conn, tool, subject_key, exclude)
        )

    def subject_view(self, approval_id: str) -> SubjectView:
        """What a reviewer sees beside a card: the subject's other approvals of this tool (newest
        first) and, when the row has a `balance` check, what is left on the subject."""
        with self.store.reading() as conn:
            row = self.store.approval(conn, approval_id)
            if row is None:
                raise UnknownApproval(approval_id)
            history = self._history(conn, row.tool, row.subject_key, row.id)
        spec = self.table.get(row.tool)
        balance: Any = None
        if spec is not None and spec.balance is not None:
            ctx = CallContext(
                session_id=row.session_id,
                origin_message_id=row.origin_message_id,
                user_id=row.user_id,
                agent_id=row.agent_id,
            )
            try:
                balance = spec.balance(json.loads(row.args_json), Confirmation(call=ctx, history=history))
            except Exception as exc:  # a display helper must not break the card
                balance = f"unavailable ({type(exc).__name__})"
        return SubjectView(history=tuple(reversed(history)), balance=balance)

    def _expire_due(
        self, conn: Any, *, session_id: str | None = None, approval_id: str | None = None
    ) -> None:
        now = self.clock.now()
        for row in self.store.approvals_due(conn, now, session_id=session_id, approval_id=approval_id):
            if self.store.update_approval(
                conn, row.id, expect_status=["pending"], values={"status": "expired", "updated_at": now}
            ):
                self.store.append_events(conn, [self._event("expired", row=row)])

    def expire(self) -> None:
        """Mark every pending approval past its deadline as expired (also done lazily)."""
        with self.store.transaction() as conn:
            self._expire_due(conn)

    def _card(self, conn: Any, row: ApprovalRow) -> Card:
        intact = approval_intact(self.keyring, row)
        given = self._approvers(conn, row, round_=row.grants) if intact else []
        if not given and row.grants > 0 and intact:  # a granted row shows the round that granted it
            given = self._approvers(conn, row, round_=row.grants - 1)
        return Card.from_record(row, approvals_given=len(given), intact=intact)

    def card(self, approval_id: str) -> Card:
        with self.store.reading() as conn:
            row = self.store.approval(conn, approval_id)
            if row is None:
                raise UnknownApproval(approval_id)
            return self._card(conn, row)

    def pending(self, *, role: str | None = None, session_id: str | None = None) -> list[Card]:
        """Approvals waiting for a decision, newest first. `role`: only those an approver holding
        this role may decide (the policy's role grants included)."""
        self.expire()
        with self.store.reading() as conn:
            return [
                self._card(conn, r)
                for r in self.store.approvals(status="pending", session_id=session_id)
                if role is None or self.policy.role_satisfies(role, r.approver_role)
            ]

    def _approvers(
        self, conn: Any, row: ApprovalRow, *, round_: int, role: str | None = None
    ) -> list[DecisionRow]:
        """The distinct approvers of the row's version in one grant round: decisions whose seal
        verifies (and whose role satisfies `role`, when given); a forged row counts for nothing."""
        seen: dict[str, DecisionRow] = {}
        for d in self.store.decisions(conn, row.id, row.version):
            if (
                d.decision == "approve"
                and d.grant_round == round_
                and d.approver_id not in seen
                and decision_intact(self.keyring, d)
                and (role is None or self.policy.role_satisfies(d.role, role))
            ):
                seen[d.approver_id] = d
        return list(seen.values())

    def _bar(self, row: ApprovalRow) -> tuple[ToolSpec, str, int]:
        """The table row, the required role and the number of distinct approvers for a stored
        call, re-derived from this gate's table and policy (never from mutable columns): a call
        proposed under another row or policy needs a fresh proposal."""
        spec = self._current_spec(row)
        if row.policy_fingerprint != self.policy.fingerprint:
            raise PolicyViolation(
                f"{row.tool}: the policy changed since this approval was proposed; it needs a fresh proposal",
                code="reclassified",
            )
        role, _ = spec.role_for(json.loads(row.args_json))
        required = self.policy.approvals_needed(spec.effect)
        if role != row.approver_role or required != row.approvals_required:
            raise TamperedRecord(row.id, "its approver role or number of approvers differ from the table's")
        assert role is not None  # a gated row always names a role (check_policy)
        return spec, role, required

    # -- decisions

    def approve(self, approval_id: str, *, version: int, approver: Approver) -> Grant | PartialApproval:
        """Approve one version. Checks role (after escalation), version, expiry, that the approver
        did not make the call (unless `Policy.self_approval`), and re-runs `scope` and `confirm`.
        Returns a `Grant`, or a `PartialApproval` while more distinct approvers are needed. An
        approved version whose grant lapsed unpresented can be granted again, by as many distinct
        approvers as the first grant needed (see `_lapsed`). Raises an `ApprovalError` (or a
        `PolicyViolation`) and changes nothing otherwise."""
        expired = False
        with self.store.transaction() as conn:
            row = self._decidable(conn, approval_id, approver, allow=("pending", "approved"))
            if row is None:
                expired = True
            else:
                if version != row.version:
                    raise StaleApproval(approval_id, version, row.version)
                spec, role, required = self._bar(row)
                if approver.id == row.user_id and not self.policy.self_approval:
                    raise WrongApprover(
                        approval_id,
                        f"{approver.id} made this call and may not approve it (Policy.self_approval is off)",
                    )
                regrant = row.status == "approved"
                if regrant:
                    self._lapsed(conn, row)
                given = self._approvers(conn, row, round_=row.grants, role=role)
                if any(d.approver_id == approver.id for d in given):
                    raise WrongApprover(
                        approval_id, f"{approver.id} already approved; a second, distinct approver is needed"
                    )
                self._recheck_and_record(conn, spec, row, approver)
                if len(given) + 1 < required:
                    kind = "regrant_partial" if regrant else "approved_partial"
                    self.store.append_events(conn, [self._event(kind, row=row, approver=approver.id)])
                    return PartialApproval(
                        approval_id=row.id, version=row.version, approvals=len(given) + 1, required=required
                    )
                if regrant:
                    return self._mint(conn, row, approver, "regranted", {}, expect="approved")
                decided = {"status": "approved", "decided_at": self.clock.now()}
                return self._mint(conn, row, approver, "approved", decided, expect="pending")
        assert expired
        raise ApprovalExpired(approval_id)

    def _lapsed(self, conn: Any, row: ApprovalRow) -> None:
        """An approved version may be granted again only when its grant lapsed unpresented: the
        approval still stands, but the subject, scope and confirm checks run again (the lapse
        freed the subject for other sessions), the old token is void (its hash is replaced), and
        the new grant needs its own round of distinct approvers."""
        now = self.clock.now()
        if row.token_used_at is not None or (row.token_expires_at or 0) > now:
            raise AlreadyDecided(row.id, "approved")  # a usable or presented grant exists
        if row.expires_at <= now:
            raise ApprovalExpired(row.id)
        busy = self.store.in_flight_elsewhere(conn, row.subject_key, row.session_id, now)
        if busy is not None:
            raise PolicyViolation(
                f"{row.tool}: approval {busy.id} is in flight on this subject from another session",
                code="subject_busy",
            )

    def _recheck_and_record(self, conn: Any, spec: ToolSpec, row: ApprovalRow, approver: Approver) -> None:
        """Re-run `scope` and `confirm` for the stored call, then record the sealed decision."""
        ctx = context_of(row)
        args = json.loads(row.args_json)
        if not self._in_scope(spec, args, ctx):
            raise PolicyViolation(
                f"{row.tool}: the caller is no longer in scope for this subject", code="out_of_scope"
            )
        reason = self._confirm(conn, spec, args, ctx, row.subject_key, exclude=row.id)
        if reason is not None:
            raise ConfirmFailed(row.tool, reason)
        self._decide(conn, row, approver, "approve")

    def _decide(
        self, conn: Any, row: ApprovalRow, approver: Approver, decision: str, reason: str | None = None
    ) -> None:
        values = {
            "approval_id": row.id,
            "version": row.version,
            "grant_round": row.grants,
            "approver_id": approver.id,
            "role": approver.role,
            "decision": decision,
        }
        self.store.add_decision(conn, reason=reason, seal=seal_decision(self.keyring, values), **values)

    def _mint(
        self,
        conn: Any,
        row: ApprovalRow,
        approver: Approver,
        kind: str,
        values: dict[str, Any],
        *,
        expect: str,
    ) -> Grant:
        """Mint a grant for the row's version, store only its hash, count the grant in the
        sealed row (so the next grant needs a new round of approvers), and record `kind`."""
        now = self.clock.now()
        expires = now + self.policy.token_ttl
        token = self.keyring.mint(
            approval_id=row.id, version=row.version, args_hash=row.args_hash, expires_at=expires
        )
        values = {
            **values,
            "updated_at": now,
            "token_hash": token_hash(token),
            "token_kid": self.keyring.current,
            "token_expires_at": expires,
            "grants": row.grants + 1,
        }
        values["seal"] = seal_approval(self.keyring, row.model_copy(update=values))
        if not self.store.update_approval(
            conn, row.id, expect_status=[expect], expect_version=row.version, values=values
        ):  # pragma: no cover - the subject lock is held
            raise StaleApproval(row.id, row.version, row.version)
        self.store.append_events(
            conn,
            [
                self._event(kind, row=row, approver=approver.id, role=approver.role),
                self._event("token_minted", row=row, kid=self.keyring.current, expires_at=expires),
            ],
        )
        return Grant(approval_id=row.id, version=row.version, token=token, expires_at=expires)

    def deny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> Refused:
        """Close a pending (or approved, not yet executed) approval; the model will be told why."""
        if not reason or not reason.strip():
            raise PolicyViolation("a denial needs a reason the model can be told")
        with self.store.transaction() as conn:
            row = self._decidable(conn, approval_id, approver, allow=("pending", "approved"))
            if row is None:
                raise_expired = True
            else:
                raise_expired = False
                if row.token_used_at is not None:  # the grant was presented: too late to revoke
                    raise AlreadyDecided(approval_id, "executing")
                if version is not None and version != row.version:
                    raise StaleApproval(approval_id, version, row.version)
                now = self.clock.now()
                self._decide(conn, row, approver, "deny", reason)
                if not self.store.update_approval(
                    conn,
                    row.id,
                    expect_status=["pending", "approved"],
                    values={"status": "denied", "reason": reason, "decided_at": now, "updated_at": now},
                ):
                    raise AlreadyDecided(approval_id, "executing")  # pragma: no cover - locked
                self.store.append_events(
                    conn, [self._event("denied", row=row, approver=approver.id, reason=reason)]
                )
        if raise_expired or row is None:
            raise ApprovalExpired(approval_id)
        return Refused(
            code="denied", message=f"{row.tool} was denied: {reason}", tool=row.tool, approval_id=approval_id
        )

    def _decidable(
        self, conn: Any, approval_id: str, approver: Approver, allow: tuple[str, ...] = ("pending",)
    ) -> ApprovalRow | None:
        """The row if `approver` may decide it now; None if it just expired (marked so). The row
        is read under the subject lock and its seal and arguments hash verified first."""
        row = self.store.approval(conn, approval_id)
        if row is None:
            raise UnknownApproval(approval_id)
        self.store.lock(conn, f"subject:{row.subject_key}")
        row = self.store.approval(conn, approval_id)  # re-read under the lock (READ COMMITTED)
        assert row is not None
        if not approval_intact(self.keyring, row):
            raise TamperedRecord(approval_id, "its seal or arguments hash does not verify")
        if row.status == "pending" and row.expires_at <= self.clock.now():
            self._expire_due(conn, approval_id=approval_id)
            return None
        if row.status not in allow:
            if row.status == "expired":
                raise ApprovalExpired(approval_id)
            raise AlreadyDecided(approval_id, row.status)
        if not self.policy.role_satisfies(approver.role, row.approver_role):
            raise WrongApprover(
                approval_id, f"{row.tool} needs role {row.approver_role}; {approver.id} holds {approver.role}"
            )
        return row

    def _current_spec(self, row: ApprovalRow) -> ToolSpec:
        spec = self.table.get(row.tool)
        if spec is None:
            raise PolicyViolation(f"{row.tool} is no longer in the effect table", code="reclassified")
        if spec.fingerprint != row.row_fingerprint:
            raise PolicyViolation(
                f"{row.tool} changed in the effect table since this approval was proposed; "
                "it needs a fresh proposal",
                code="reclassified",
            )
        return spec

    def audit(self, *, table: EffectTable | None = None) -> AuditReport:
        """The audit scan against this gate's table (or another, e.g. a proposed reclassification)."""
        self.flush()
        return audit(self.store, table or self.table, self.policy, keyring=self.keyring)

    # -- async twins of the decision API (store work off the event loop)

    async def aapprove(
        self, approval_id: str, *, version: int, approver: Approver
    ) -> Grant | PartialApproval:
        import asyncio

        return await asyncio.to_thread(lambda: self.approve(approval_id, version=version, approver=approver))

    async def adeny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> Refused:
        import asyncio

        return await asyncio.to_thread(
            lambda: self.deny(approval_id, approver=approver, reason=reason, version=version)
        )


def _with_call_id(ctx: CallContext, call_id: str | None) -> CallContext:
    if call_id is None:
        return ctx
    import dataclasses

    return dataclasses.replace(ctx, tool_call_id=call_id)
