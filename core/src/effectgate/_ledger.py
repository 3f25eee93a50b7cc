"""Reading the approval ledger for a decision: checks, history, cards, and the bar a call must
clear. Shared by proposals, decisions and execution; it changes nothing but lapsed approvals.

The bar (`bar`) is re-derived from the table and policy in code for every stored call: the row
and policy it was proposed under must still be the gate's, the required role comes from the row's
escalation rules over the stored (verified) arguments, and the number of distinct approvers from
the policy. Decisions count only when their seal verifies (`approvers`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ._answers import SHADOW_NOTE
from ._deadline import lapsed
from ._deadline import past as past  # re-exported: its home was here
from ._deps import Deps, Events
from ._json import parse
from ._kept import forged
from ._person import person
from ._seal import approval_verifies, decision_intact, foreign_key, mismatch
from ._standing import standing
from .context import CallContext, Confirmation, SubjectEntry
from .errors import (
    AlreadyDecided,
    ApprovalExpired,
    PolicyViolation,
    StaleApproval,
    TamperedRecord,
    UnknownApproval,
    describe,
)
from .outcomes import UNSEALED_WARNING, Card, SubjectView, VersionEntry
from .stores._dialect import REDACTED_PREFIX, is_redacted
from .stores._statements import no_nul
from .stores.records import ApprovalRow, DecisionRow
from .table import ToolSpec


def context_of(row: ApprovalRow) -> CallContext:
    """The identity a stored approval was proposed with. A NUL (SQLite kept one written before
    contexts refused it, or edited into an unsealed field) as every write now stores it, U+FFFD:
    a ValueError here would come after an execution's claim."""
    return CallContext(
        session_id=no_nul(row.session_id),
        origin_message_id=no_nul(row.origin_message_id),
        user_id=no_nul(row.user_id),
        agent_id=no_nul(row.agent_id),
        run_id=no_nul(row.run_id),
        model_id=no_nul(row.model_id),
    )


def said(head: str, reason: object) -> str:
    """`head: reason` for the model, or `head (its reason was erased)` when `redact` erased it
    (a reviewer's or the gate's reason is personal: its marker's JSON is no reason)."""
    return f"{head} (its reason was erased)" if is_redacted(reason) else f"{head}: {reason}"


def _mapping(text: str) -> Mapping[str, Any]:
    """Stored arguments as a mapping: those of a row that does not verify may be any text."""
    try:
        value = parse(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def grant_live(deadline: object, now: float) -> bool:
    """Whether a grant with this deadline may still be presented: one not minted (None) may not;
    a deadline that is not a number (text edited into a SQLite column) may be (it counts)."""
    return deadline is not None and not (isinstance(deadline, int | float) and deadline <= now)


def in_scope(spec: ToolSpec, args: Mapping[str, Any], ctx: CallContext) -> bool:
    """The row's `scope` check; a check that cannot decide denies."""
    if spec.scope is None:
        return True
    try:
        allowed: object = spec.scope(args, ctx)  # an async function returns a coroutine
    except Exception:
        return False
    if inspect.isawaitable(allowed):  # an async check: never awaited here, it decides nothing
        getattr(allowed, "close", lambda: None)()
        return False
    return bool(allowed)


class Ledger:
    """The gate's reading of stored approvals (see the module docstring)."""

    def __init__(self, deps: Deps, events: Events) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.events = events

    # -- business checks

    def confirm(
        self,
        conn: Any,
        spec: ToolSpec,
        args: Mapping[str, Any],
        ctx: CallContext,
        subject_key: str,
        *,
        exclude: str | None,
    ) -> str | None:
        """The row's `confirm` check over the subject's history; a check that raises refuses, and so
        does a subject whose history holds a record that does not verify and may be in effect."""
        if spec.confirm is None:
            return None
        history = self.history(conn, spec.name, subject_key, exclude)
        if broken := next((e.approval_id for e in history if not e.intact), None):
            row = self.store.approval(conn, broken)
            if row is not None and (kid := foreign_key(self.keyring, row.seal)) is not None:
                return f"approval {broken} on this subject cannot be checked: {mismatch(kid)}"
            return f"approval {broken} on this subject does not verify (edited in the database)"
        try:
            return spec.confirm(args, Confirmation(call=ctx, history=history))
        except Exception as exc:
            return f"confirm check raised {describe(exc)}"

    def history(
        self, conn: Any, tool: str, subject_key: str, exclude: str | None
    ) -> tuple[SubjectEntry, ...]:
        """The subject's other approvals of `tool`, oldest first, each with whether it is in effect
        and its status as `_standing` derives them from what verifies (its executions, its sealed
        grants, denial and granting decisions), never from its unsealed status or grant expiry
        columns: a refund edited from 'executed' to 'denied', or a live grant to 'expired', still
        counts; a denied one edited to 'executed' does not. A row inserted in the database is no
        history; one the gate wrote whose seal no longer verifies is listed (`intact=False`) while
        it may be in effect. Three reads for the whole history, whatever its length."""
        now = self.clock.now()
        rows = self.store.subject_history(conn, tool, subject_key, exclude)
        ran = self.store.execution_outcomes(conn, [r.id for r in rows]) if rows else {}
        verified = {r.id for r in rows if self.verifies(r)} - forged(self.store, conn, self.keyring, rows)
        # the sealed decisions of the rows they decide: nothing ran (a grant? a denial?), a broken seal
        need = [r.id for r in rows if r.id not in verified or r.id not in ran]
        decided: dict[str, list[DecisionRow]] = {}
        for d in self.store.decisions_of(conn, need) if need else ():
            if decision_intact(self.keyring, d):
                decided.setdefault(d.approval_id, []).append(d)
        out: list[SubjectEntry] = []
        for r in rows:
            got = standing(
                r,
                ran.get(r.id),
                decided.get(r.id, ()),
                verified=r.id in verified,
                now=now,
                lifetime=self.policy.token_ttl,
                foreign=r.id not in verified and foreign_key(self.keyring, r.seal) is not None,
            )
            if got is not None:
                out.append(
                    SubjectEntry(
                        approval_id=r.id,
                        status=got.status,
                        version=r.version,
                        args=_mapping(r.args_json),
                        created_at=r.created_at,
                        in_effect=got.in_effect,
                        intact=got.intact,
                    )
                )
        return tuple(out)

    def verifies(self, row: ApprovalRow) -> bool:
        """`_seal.approval_verifies` under the gate's keyring."""
        return approval_verifies(self.keyring, row)

    def subject_view(self, approval_id: str) -> SubjectView:
        """What a reviewer sees beside a card: the subject's other approvals of this tool (newest
        first) and, when the row has a `balance` check, what is left on the subject."""
        with self.store.reading() as conn:
            row = self.store.approval(conn, approval_id)
            if row is None:
                raise UnknownApproval(approval_id)
            history = self.history(conn, row.tool, row.subject_key, row.id)
        spec = self.table.get(row.tool)
        balance: Any = None
        if spec is not None and spec.balance is not None:
            try:
                balance = spec.balance(
                    json.loads(row.args_json), Confirmation(call=context_of(row), history=history)
                )
            except Exception as exc:  # a display helper must not break the card
                balance = f"unavailable ({type(exc).__name__})"
            if not all(e.intact for e in history):  # an amount it summed may be an edit
                balance = "unavailable (a record on this subject does not verify)"
        return SubjectView(history=tuple(reversed(history)), balance=balance)

    # -- expiry

    def expire_lapsed(self, conn: Any, pending: list[ApprovalRow]) -> list[ApprovalRow]:
        """Of `pending` approvals (as read in `conn`), mark those past their deadline as expired;
        the others, in their order."""
        due = self._expire(conn, pending) if pending else []  # a session with none waiting
        return [r for r in pending if all(r is not d for d in due)]

    def _expire(self, conn: Any, rows: list[ApprovalRow]) -> list[ApprovalRow]:
        """Mark those of `rows` past their deadline (`_deadline.lapsed`) as expired; those."""
        now = self.clock.now()
        due = lapsed(self.store, conn, rows, self.policy.pending_ttl, now)
        for row in due:
            if self.store.update_approval(
                conn, row.id, expect_status=["pending"], values={"status": "expired", "updated_at": now}
            ):
                self.store.append_events(conn, [self.events.event("expired", row=row)])
        return due

    def expire(self) -> None:
        """Mark every pending approval past its deadline as expired (also done lazily)."""
        with self.store.transaction() as conn:
            self._expire(conn, self.store.approvals_due(conn, self.clock.now()))

    # -- cards

    def card_of(self, conn: Any, row: ApprovalRow) -> Card:
        redacted = row.args_json.startswith(REDACTED_PREFIX)
        verified = self.verifies(row)
        given, denial = self.decided(conn, row, round_=row.grants) if verified else ([], None)
        # a pending row that was granted, or whose version was denied (sealed): its status was edited
        intact = verified and not (row.status == "pending" and (row.grants or denial))
        given = given if intact else []
        if not given and intact and row.grants > 0:  # a granted row shows the round that granted it
            given = self.approvers(conn, row, round_=row.grants - 1)
        shown = self.as_derived(row) if intact and not redacted else None
        extra: tuple[str, ...] = () if shown is None else (UNSEALED_WARNING,)
        return Card.from_record(shown or row, approvals_given=len(given), intact=intact, extra=extra)

    def as_derived(self, row: ApprovalRow) -> ApprovalRow | None:
        """`row` with the unsealed fields a card shows (subject, notes, reversibility, owner) as the
        table row its seal names derives them from its verified arguments, when any stored one
        differs (it was edited in the database); None when all match, or when the table row
        changed since (the call needs a fresh proposal, and the stored values are all there is)."""
        spec = self.table.get(row.tool)
        if spec is None or spec.fingerprint != row.row_fingerprint:
            return None
        try:
            args = parse(row.args_json)
            subject, (_, notes) = spec.subject_of(args), spec.role_for(args)
        except Exception:  # a callable of the table's that cannot decide: nothing to compare with
            return None
        notes = [*notes, SHADOW_NOTE] if spec.shadow else list(notes)
        try:
            stored = (parse(row.subject_json) if row.subject_json else None, parse(row.notes_json))
        except (ValueError, RecursionError):  # edited into text that is not JSON (or too deep)
            stored = None
        subject = parse(json.dumps(subject)) if subject is not None else None  # as stored: lists
        reversibility = str(spec.reversibility)
        if (stored, row.reversibility, row.owner) == ((subject, notes), reversibility, spec.owner):
            return None
        return dataclasses.replace(
            row,
            subject_json=json.dumps(subject) if subject is not None else None,
            notes_json=json.dumps(notes),
            reversibility=reversibility,
            owner=spec.owner,
        )

    def card(self, approval_id: str) -> Card:
        with self.store.reading() as conn:
            row = self.store.approval(conn, approval_id)
            if row is None:
                raise UnknownApproval(approval_id)
            return self.card_of(conn, row)

    def pending(self, *, role: str | None = None, session_id: str | None = None) -> list[Card]:
        """Approvals waiting for a decision, newest first. `role`: only those an approver holding
        this role may decide (the policy's role grants included)."""
        self.expire()
        with self.store.reading() as conn:
            return [
                self.card_of(conn, r)
                for r in self.store.approvals(status="pending", session_id=session_id)
                if role is None or self.policy.role_satisfies(role, r.approver_role)
            ]

    # -- the bar

    def approvers(
        self, conn: Any, row: ApprovalRow, *, round_: int, role: str | None = None
    ) -> list[DecisionRow]:
        """The distinct approvers of the row's version in one grant round: decisions whose seal
        verifies (and whose role satisfies `role`, when given); a forged row counts for nothing."""
        return self.decided(conn, row, round_=round_, role=role)[0]

    def decided(
        self,
        conn: Any,
        row: ApprovalRow,
        *,
        round_: int,
        role: str | None = None,
        read: Sequence[DecisionRow] | None = None,
    ) -> tuple[list[DecisionRow], DecisionRow | None]:
        """`approvers`, and the version's sealed denial if it has one (else None), from one read
        (`read`: the version's decisions as the transaction read them with the row). A denial is
        final for its version whatever the status column (which no seal covers) says: a status
        edited from 'denied' back to 'approved' or 'pending' revives nothing."""
        seen: dict[str, DecisionRow] = {}
        denial: DecisionRow | None = None
        for d in self.store.decisions(conn, row.id, row.version) if read is None else read:
            if d.decision == "approve":
                who = person(d.approver_id)
                if (
                    d.grant_round == round_
                    and who not in seen
                    and decision_intact(self.keyring, d)
                    and (role is None or self.policy.role_satisfies(d.role, role))
                ):
                    seen[who] = d
            elif denial is None and d.decision == "deny" and decision_intact(self.keyring, d):
                denial = d
        return list(seen.values()), denial

    def moved(self, conn: Any, row: ApprovalRow) -> Exception:
        """Why a decision's compare-and-set on `row` failed: what the row says now (an `expire()`
        of another worker, which takes no subject lock, expired it since it was read)."""
        now = self.store.approval(conn, row.id)
        if now is not None and now.status == "expired":
            return ApprovalExpired(row.id)
        if now is not None and now.version == row.version and now.status != row.status:
            return AlreadyDecided(row.id, now.status)
        return StaleApproval(row.id, row.version, row.version if now is None else now.version)

    def denied(self, conn: Any, row: ApprovalRow, read: Sequence[DecisionRow]) -> bool:
        """Whether the row's version holds a sealed denial (its status column is no seal's)."""
        return self.decided(conn, row, round_=0, read=read)[1] is not None

    def granted(self, conn: Any, row: ApprovalRow) -> None:
        """Refuse (TamperedRecord) settling or running again a version its sealed decisions never
        granted: in the round that minted its last grant, by as many distinct approvers as its
        sealed bar (roles as the gate checked them then: a policy changed since blocks nothing),
        and never denied. An outcome awaiting reconciliation for such a version was written outside
        effectgate (an idempotency record inserted)."""
        given, denial = self.decided(conn, row, round_=row.grants - 1)
        if denial is not None or row.grants < 1 or len(given) < row.approvals_required:
            raise TamperedRecord(row.id, "an outcome awaits reconciliation for a version never granted")

    def current_spec(self, row: ApprovalRow) -> ToolSpec:
        """The table row of a stored call, refused if it changed since the proposal."""
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

    def bar(self, row: ApprovalRow) -> tuple[ToolSpec, str, int]:
        """The table row, the required role and the number of distinct approvers for a stored
        call, re-derived from this gate's table and policy (never from mutable columns): a call
        proposed under another row or policy needs a fresh proposal, and one whose agent the table
        no longer allows the tool is refused (`not_allowed`), as its call would be now."""
        spec = self.current_spec(row)
        if not self.table.allowed(row.agent_id, row.tool):
            raise PolicyViolation(f"agent {row.agent_id!r} may no longer call {row.tool}", code="not_allowed")
        if row.policy_fingerprint != self.policy.fingerprint:
            raise PolicyViolation(
                f"{row.tool}: the policy changed since this approval was proposed; it needs a fresh proposal",
                code="reclassified",
            )
        # no escalation rule: the row's role whatever the arguments (nothing to parse them for)
        role = spec.role_for(parse(row.args_json))[0] if spec.escalate else spec.approver_role
        required = self.policy.approvals_needed(spec.effect)
        if role != row.approver_role or required != row.approvals_required:
            raise TamperedRecord(row.id, "its approver role or number of approvers differ from the table's")
        assert role is not None  # a gated row always names a role (check_policy)
        return spec, role, required

    def versions(self, approval_id: str) -> tuple[VersionEntry, ...]:
        """Each version of an approval, oldest first: its args hash, the user message that
        proposed it, and the reviewer who edited it into being (None unless an adapter applied an
        edit decision: a version the same message proposed again is not an edit)."""
        out: dict[int, VersionEntry] = {}
        for e in self.store.events(approval_id=approval_id):
            if e.kind in ("proposed", "amended") and e.version is not None:
                editor = json.loads(e.detail_json or "{}").get("edited_by")
                out[e.version] = VersionEntry(
                    e.version,
                    e.args_hash or "",
                    e.origin_message_id or "",
                    editor if isinstance(editor, str) else None,
                )
        return tuple(out[v] for v in sorted(out))
