"""Proposals: registering gated calls as approvals, replays and amendments.

A gated call freezes its arguments, registers or finds its approval under the intent key
(session, tool, origin message, subject), and returns `Pending`; a replayed message finds the same
approval (or, once it ran, its stored result); a new message while it waits amends it (version
+ 1, sealed again). A call out of scope is recorded as rejected and never reaches a card.

Logged on "effectgate._proposals", after the transaction commits: proposed, amended and replayed
approvals at INFO (approval id, version, tool, role; never argument values), refusals at INFO
with their code, a tampered record at WARNING.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._answers import SHADOW_NOTE, log_outcome, unknown_outcome
from ._deadline import derived
from ._deadline import lapsed as deadline_passed
from ._deps import Deps, Events
from ._execution import exec_key, stored_replay
from ._intent import intent_keys
from ._json import dumps
from ._ledger import Ledger, grant_live, in_scope, said
from ._logging import INFO, logger
from ._seal import approval_intact, approval_sealed, broken, seal_approval
from ._written import ran_as_write, write_key
from .context import CallContext
from .errors import StaleApproval, TamperedRecord
from .outcomes import Card, Outcome, Pending, RefusalCode, Refused
from .stores.records import ApprovalRow
from .table import ToolSpec

log = logger(__name__)
_PROPOSER = ("origin_message_id", "user_id", "agent_id", "run_id", "model_id")  # a version's, on amend
_CLOSED = ("executed", "failed", "denied")  # a replay's answer carries the result or a reviewer's text


def tampered(row: ApprovalRow, what: str) -> TamperedRecord:
    """The refusal of a stored record that does not verify, logged at WARNING."""
    error = TamperedRecord(row.id, what)
    log.warning("tampered approval record: approval=%s tool=%r: %s", row.id, row.tool, error)
    return error


class Proposals:
    """Registers gated calls; see the module docstring."""

    def __init__(self, deps: Deps, events: Events, ledger: Ledger) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.ids = deps.ids
        self.events = events
        self.ledger = ledger

    def propose(
        self,
        spec: ToolSpec,
        args: Mapping[str, Any],
        frozen: str,
        ctx: CallContext,
        *,
        text: str,
        edited_by: str | None = None,
    ) -> Outcome:
        """Register (or find, replay, amend) the approval of a gated call; `text` is the arguments'
        canonical JSON (stored as `args_json`), `frozen` its args hash."""
        subject = spec.subject_of(args)
        subject_key, intent = intent_keys(spec, args, frozen, ctx, subject)
        role, notes = spec.role_for(args)
        assert role is not None  # check_policy guarantees a role for every gated row
        if spec.shadow:
            notes = [*notes, SHADOW_NOTE]
        now = self.clock.now()
        with self.store.transaction() as conn:
            noted = self.events.note_rules(conn, spec)
            outcome = self._propose_in(
                conn,
                spec,
                args,
                frozen,
                ctx,
                text=text,
                edited_by=edited_by,
                subject=subject,
                subject_key=subject_key,
                intent=intent,
                role=role,
                notes=notes,
                now=now,
            )
        noted()
        if log.isEnabledFor(INFO):
            log_outcome(outcome, spec, ctx, edited_by)
        return outcome  # a shadow row's is told as `shadowed` by the caller, once it is announced

    def _propose_in(
        self,
        conn: Any,
        spec: ToolSpec,
        args: Mapping[str, Any],
        frozen: str,
        ctx: CallContext,
        *,
        text: str,
        edited_by: str | None,
        subject: dict[str, Any] | None,
        subject_key: str,
        intent: str,
        role: str,
        notes: list[str],
        now: float,
    ) -> Outcome:
        self.store.lock(conn, f"session:{ctx.session_id}")
        self.store.lock(conn, f"subject:{subject_key}")
        written = write_key(spec.name, ctx, frozen)  # this call's record, had it run as a write
        reads = self.store.proposal_reads(conn, ctx.session_id, intent, subject_key, now, written)
        listed, existing, busy, ran = reads
        waiting = self.ledger.expire_lapsed(conn, listed)
        if existing and existing.status == "pending" and all(r.id != existing.id for r in waiting):
            existing = self.store.approval_for_key(conn, intent)  # lapsed just now: read as marked
        if existing is not None:
            self.keyed(existing, spec, ctx, subject_key)
        if existing is not None and existing.status in _CLOSED and ctx.user_id != existing.user_id:
            existing = existing if in_scope(spec, args, ctx) else None  # another's: scoped as a new call
        if existing is not None and existing.status != "pending":
            return self.replayed(conn, existing, frozen, ctx)
        if existing is not None and (self.store.key_version(conn, intent) or 0) < existing.version:
            # A replay of a message that a later message already amended: answer with the
            # current version; an old message must not roll the amendment back.
            self.store.append_events(
                conn, [self.events.event("replay", row=existing, ctx=ctx, superseded=True)]
            )
            return Pending(
                approval_id=existing.id,
                version=existing.version,
                card=self.ledger.card_of(conn, existing),
                replay=True,
            )
        if existing is None and not in_scope(spec, args, ctx):
            row = self.new_row(
                spec, args, frozen, ctx, subject, subject_key, role, notes, now, status="rejected", text=text
            )
            row.reason = "out of scope: the caller may not act on this subject"
            self.store.insert_approval(conn, row)
            self.store.add_key(conn, intent, row.id, 1, ctx.origin_message_id)
            self.store.append_events(
                conn, [self.events.event("rejected", row=row, spec=spec, code="out_of_scope")]
            )
            message = f"{spec.name}: {row.reason}"
            return Refused(code="out_of_scope", message=message, tool=spec.name, approval_id=row.id)
        answer = (
            ran_as_write(self.store, conn, self.events, spec, frozen, ctx) if ran and not existing else None
        )
        if answer is not None:  # this very call ran as a write before its row was reclassified
            return answer
        pending = existing or next(
            (r for r in waiting if r.tool == spec.name and r.subject_key == subject_key), None
        )
        if pending is not None:
            return self.amend(
                conn,
                spec,
                pending,
                args,
                frozen,
                ctx,
                intent,
                role,
                notes,
                replay=existing is not None,
                text=text,
                edited_by=edited_by,
            )
        if busy is not None:
            message = (
                f"{spec.name}: approval {busy.id} ({busy.tool}) is already in flight on "
                f"this subject from another session"
            )
            self.store.append_events(
                conn,
                [self.events.event("refused", spec=spec, ctx=ctx, code="subject_busy", busy=busy.id)],
            )
            return Refused(code="subject_busy", message=message, tool=spec.name, approval_id=busy.id)
        if len(waiting) >= self.policy.max_pending_per_session:
            self.store.append_events(
                conn, [self.events.event("refused", spec=spec, ctx=ctx, code="too_many_pending")]
            )
            message = f"this session already has {self.policy.max_pending_per_session} approvals waiting"
            return Refused(code="too_many_pending", message=message, tool=spec.name)
        reason = self.ledger.confirm(conn, spec, args, ctx, subject_key, exclude=None)
        if reason is not None:
            self.store.append_events(
                conn,
                [self.events.event("refused", spec=spec, ctx=ctx, code="confirm_failed", reason=reason)],
            )
            return Refused(code="confirm_failed", message=f"{spec.name}: {reason}", tool=spec.name)
        row = self.new_row(
            spec, args, frozen, ctx, subject, subject_key, role, notes, now, status="pending", text=text
        )
        self.store.insert_approval(conn, row)
        self.store.add_key(conn, intent, row.id, 1, ctx.origin_message_id)
        # its pending_ttl: the policy's fingerprint leaves it out, the audit reads it here (`_audit_deadline`)
        proposed = self.events.event("proposed", row=row, spec=spec, pending_ttl=self.policy.pending_ttl)
        self.store.append_events(conn, [proposed])
        return Pending(approval_id=row.id, version=1, card=Card.from_record(row))

    def keyed(self, row: ApprovalRow, spec: ToolSpec, ctx: CallContext, subject_key: str) -> None:
        """The approval an intent key names (keys are not sealed) is this call's, by its sealed
        session, tool and (under the same table row: a changed row may derive another) subject."""
        same_row = row.row_fingerprint == spec.fingerprint
        ours = (row.session_id, row.tool) == (ctx.session_id, spec.name)
        ours = ours and (row.subject_key == subject_key or not same_row)
        if not (ours and approval_sealed(self.keyring, row)):
            raise tampered(
                row, broken(self.keyring, row) if ours else "the intent key of another call names it"
            )

    def new_row(
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
        text: str,
    ) -> ApprovalRow:
        row = ApprovalRow(
            id=self.ids(),
            session_id=ctx.session_id,
            origin_message_id=ctx.origin_message_id,
            user_id=ctx.user_id,
            agent_id=ctx.agent_id,
            run_id=ctx.run_id,
            model_id=ctx.model_id,
            tool=spec.name,
            effect=str(spec.effect),
            reversibility=str(spec.reversibility),
            owner=spec.owner,
            subject_key=subject_key,
            subject_json=dumps(subject) if subject is not None else None,
            args_json=text,
            args_hash=frozen,
            approver_role=role,
            notes_json=dumps(notes),
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

    def amend(
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
        text: str,
        edited_by: str | None = None,
    ) -> Outcome:
        if not approval_intact(self.keyring, row) or row.grants:
            # a pending row was never granted: its sealed count of grants says its status was edited
            raise tampered(row, broken(self.keyring, row, granted=bool(row.grants)))
        # a new message's same arguments under a row or policy not the sealed ones: amended (`bar`)
        current = (row.row_fingerprint, row.policy_fingerprint) == (spec.fingerprint, self.policy.fingerprint)
        if row.args_hash == frozen and (current or replay):
            try:  # as `approve`: a version without its proposal event no one can ever decide
                proposed = self.store.proposal_times(conn, [row.id]).get((row.id, row.version))
                derived(row, proposed, self.policy.pending_ttl)
            except TamperedRecord as exc:
                raise tampered(row, exc.what) from None
            if not replay:
                self.store.add_key(conn, intent, row.id, row.version, ctx.origin_message_id)
            self.store.append_events(conn, [self.events.event("replay", row=row, ctx=ctx)])
            return Pending(
                approval_id=row.id, version=row.version, card=self.ledger.card_of(conn, row), replay=True
            )
        # other arguments are checked as a new call's are, before they can reach a card
        scoped = in_scope(spec, args, ctx)
        reason = (
            self.ledger.confirm(conn, spec, args, ctx, row.subject_key, exclude=row.id) if scoped else None
        )
        if not scoped or reason is not None:
            code: RefusalCode = "confirm_failed" if scoped else "out_of_scope"
            reason = reason or "out of scope: the caller may not act on this subject"
            self.store.append_events(
                conn, [self.events.event("refused", spec=spec, ctx=ctx, code=code, reason=reason)]
            )
            return Refused(code=code, message=f"{spec.name}: {reason}", tool=spec.name, approval_id=row.id)
        now = self.clock.now()
        values = {
            "version": row.version + 1,
            "args_json": text,
            "args_hash": frozen,
            "approver_role": role,
            "approvals_required": self.policy.approvals_needed(spec.effect),
            "notes_json": dumps(notes),
            "updated_at": now,
            "expires_at": now + self.policy.pending_ttl,
            "row_fingerprint": spec.fingerprint,
            "table_fingerprint": self.table.fingerprint,
            "policy_fingerprint": self.policy.fingerprint,
            # who proposed this version (sealed: the user may not approve it), not who proposed v1
            **{f: getattr(ctx, f) for f in _PROPOSER},
        }
        values["seal"] = seal_approval(self.keyring, row, values)
        if not self.store.update_approval(
            conn, row.id, expect_status=["pending"], expect_version=row.version, values=values
        ):
            raise StaleApproval(row.id, row.version, row.version + 1)  # pragma: no cover - locked
        self.store.add_key(conn, intent, row.id, row.version + 1, ctx.origin_message_id)
        updated = self.store.approval(conn, row.id)
        assert updated is not None
        amended = self.events.event(
            "amended", row=updated, previous_hash=row.args_hash, pending_ttl=self.policy.pending_ttl
        )
        if edited_by:
            amended["detail_json"] = {**amended["detail_json"], "edited_by": edited_by}
        self.store.append_events(conn, [amended])
        return Pending(approval_id=row.id, version=updated.version, card=Card.from_record(updated))

    def replayed(self, conn: Any, row: ApprovalRow, frozen: str, ctx: CallContext) -> Outcome:
        """The intent key found a decided approval: answer as before, never a second one."""
        # The intent (session, tool, message, subject) is what counts: a replay whose arguments
        # came out differently still answers with this approval, never a second one.
        detail: dict[str, Any] = {"status": row.status, "same_args": row.args_hash == frozen}
        self.store.append_events(conn, [self.events.event("replay", row=row, ctx=ctx, **detail)])
        if row.status == "rejected":
            return Refused(
                code="out_of_scope", message=said(row.tool, row.reason), tool=row.tool, approval_id=row.id
            )
        if row.status == "denied":
            return Refused(
                code="denied",
                message=said(f"{row.tool} was denied", row.reason),
                tool=row.tool,
                approval_id=row.id,
            )
        if row.status == "expired":
            message = f"approval {row.id} for {row.tool} expired undecided"
            return Refused(code="expired", message=message, tool=row.tool, approval_id=row.id)
        if row.status == "failed":
            message = f"{said(f'{row.tool} ran and failed', row.reason)}. A new attempt needs a new request"
            return Refused(code="failed", message=message, tool=row.tool, approval_id=row.id)
        if row.status == "executed":
            record = self.store.load(conn, exec_key(row))
            if record is not None and record.payload_hash != row.args_hash:  # edited: never replayed
                raise tampered(row, "its stored result was recorded for other arguments")
            result = record.result if record is not None else None
            return stored_replay(row, result)
        now = self.clock.now()
        if (  # nothing runs it: its grant and its deadline (`_deadline`) both passed
            row.status == "approved"
            and row.grants
            and row.token_used_at is None
            and not grant_live(row.token_expires_at, now)
            and deadline_passed(self.store, conn, [row], self.policy.pending_ttl, now)
        ):
            message = f"the grant for {row.tool} lapsed unused and approval {row.id} expired; "
            message += "a new attempt needs a new request"
            return Refused(code="expired", message=message, tool=row.tool, approval_id=row.id)
        record = self.store.load(conn, exec_key(row)) if row.status == "approved" else None
        unknown = unknown_outcome(row, record) if record is not None else None
        if unknown is not None:  # its grant ran: not Pending
            return unknown
        card = self.ledger.card_of(conn, row)
        return Pending(approval_id=row.id, version=row.version, card=card, status=row.status, replay=True)
