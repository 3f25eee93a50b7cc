"""Decisions: approve (and grant again after a lapse), deny, and minting the single-use grant.

Every decision reads the approval under its subject lock, verifies the row's seal and arguments
hash (`_decidable.Decidable`, with the sealed decision row it records), and re-derives the bar
(role and number of distinct approvers) from the table and policy (`Ledger.bar`). Decisions are
sealed rows in their grant round: a destructive call needs two distinct approvers for its first
grant and for any fresh grant after a lapse, and the user who made a call may not approve it
unless the policy allows self-approval.

Logged on "effectgate._decisions": approvals (partial and granted) and denials at INFO, with the
approval id, version, approver id and role (and a denial's reason); a refused decision at INFO
with its error and code; a tampered record at WARNING. Never a token.
"""

from __future__ import annotations

import hmac
from typing import Any

from ._decidable import Decidable
from ._deps import Deps, Events, connection_lost
from ._ledger import Ledger
from ._logging import logger
from ._person import person
from ._seal import approval_intact, grant_released, seal_approval
from .canonical import _SURROGATE
from .context import Approver
from .errors import (
    AlreadyDecided,
    ApprovalExpired,
    EffectGateError,
    PolicyViolation,
    StaleApproval,
    TamperedRecord,
    WrongApprover,
)
from .outcomes import Decision, Grant, PartialApproval, Recorded, Refused
from .stores._dialect import REDACTED_PREFIX
from .stores.records import ApprovalRow
from .tokens import token_hash

log = logger(__name__)


def _log_refused(what: str, approval_id: str, approver: Approver, exc: EffectGateError) -> None:
    """A decision the gate refused: INFO with the error's type and code; WARNING if tampered."""
    code = getattr(exc, "code", None)
    if isinstance(exc, TamperedRecord) and exc.foreign_key is None:  # a mismatch is no edit
        log.warning("%s refused: approval=%s approver=%r: %s", what, approval_id, approver.id, exc)
    else:
        log.info(
            "%s refused (%s%s): approval=%s approver=%r role=%s",
            what,
            type(exc).__name__,
            f", {code}" if code else "",
            approval_id,
            approver.id,
            approver.role,
        )


def _an_approver(approver: object) -> None:
    if not isinstance(approver, Approver):  # before any row is read: nothing changes
        raise TypeError(f"approver must be an Approver (got {type(approver).__name__})")


def check_denial_reason(reason: str) -> None:
    """PolicyViolation for a denial reason no record may hold (checked before any row is read)."""
    if not reason or not reason.strip():
        raise PolicyViolation("a denial needs a reason the model can be told")
    if _SURROGATE.search(reason):  # (a NUL is stored as U+FFFD, as everywhere)
        raise PolicyViolation("a denial reason cannot hold a lone surrogate: no database keeps one")
    if reason.startswith(REDACTED_PREFIX):  # only `redact` writes a value that starts like one
        raise PolicyViolation("a denial reason may not start like an erasure marker ('{\"$redacted\":')")


class Decisions:
    """Approve, deny, grant again; see the module docstring."""

    def __init__(self, deps: Deps, events: Events, ledger: Ledger) -> None:
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.events = events
        self.ledger = ledger
        self.checks = Decidable(deps, ledger)  # the row read and checked, the sealed decision row

    def approve(self, approval_id: str, *, version: int, approver: Approver) -> Decision:
        """Approve one version (see `_approve`), logged."""
        _an_approver(approver)
        minted: list[Grant] = []
        try:
            decision = self._approve(approval_id, version=version, approver=approver, minted=minted)
        except EffectGateError as exc:
            _log_refused("approve", approval_id, approver, exc)
            raise
        except Exception as exc:
            if not minted or not self.landed(minted[0], exc):
                raise
            decision = minted[0]
        if isinstance(decision, Grant):
            log.info(
                "approval granted: approval=%s version=%d approver=%r role=%s",
                decision.approval_id,
                decision.version,
                approver.id,
                approver.role,
            )
        else:  # recorded, not granted: more approvers needed, or a shadow call (never runs)
            log.info(
                "%s (%d of %d): approval=%s version=%d approver=%r role=%s",
                "shadow approval recorded, nothing runs"
                if isinstance(decision, Recorded)
                else "approval partial",
                decision.approvals,
                decision.required,
                decision.approval_id,
                decision.version,
                approver.id,
                approver.role,
            )
        return decision

    def landed(self, grant: Grant, exc: Exception) -> bool:
        """Whether the transaction that minted `grant` committed although `exc` (the connection
        lost, its reply never received: a failover) says otherwise: the approval, read back and
        verified, holds this grant's hash. The grant is then returned; the token exists nowhere
        else (only its hash is stored), so raising would leave a grant nobody holds."""
        if not connection_lost(self.store, exc):
            return False
        with self.store.reading() as conn:
            row = self.store.approval(conn, grant.approval_id)
        held = (
            row is not None
            and row.status == "approved"
            and row.version == grant.version
            and isinstance(row.token_hash, str)
            and hmac.compare_digest(row.token_hash.encode(), token_hash(grant.token).encode())
            and approval_intact(self.keyring, row)
        )
        if held:
            log.warning(
                "connection lost after the grant was committed (it was): approval=%s", grant.approval_id
            )
        return held

    def _approve(
        self, approval_id: str, *, version: int, approver: Approver, minted: list[Grant]
    ) -> Decision:
        """Approve one version. Checks role (after escalation), version, expiry, that the approver
        did not make the call (unless `Policy.self_approval`), and re-runs `scope` and `confirm`.
        Returns a `Grant`, or a `PartialApproval` while more distinct approvers are needed. An
        approved version whose grant lapsed unpresented can be granted again, by as many distinct
        approvers as the first grant needed (see `Decidable.lapsed`). Raises an `ApprovalError`
        (or a `PolicyViolation`) and changes nothing otherwise. A grant is put in `minted` before its
        transaction commits (see `landed`)."""
        expired = False
        with self.store.transaction() as conn:
            row, read = self.checks.decidable(conn, approval_id, approver, allow=("pending", "approved"))
            if row is None:
                expired = True
            else:
                if type(version) is not int or version != row.version:
                    raise StaleApproval(approval_id, version, row.version)
                spec, role, required = self.ledger.bar(row)
                if person(approver.id) == person(row.user_id) and not self.policy.self_approval:
                    raise WrongApprover(
                        approval_id,
                        f"{approver.id} made this call and may not approve it (Policy.self_approval is off)",
                    )
                regrant = row.status == "approved"
                if spec.shadow and regrant:
                    raise AlreadyDecided(approval_id, "approved")  # shadow: decided once, never run
                if regrant:  # a grant given back (sealed) is not live, whatever its stored expiry
                    self.checks.lapsed(conn, row, released=grant_released(self.keyring, read, row))
                given, denial = self.ledger.decided(conn, row, round_=row.grants, role=role, read=read)
                if denial is not None:  # its status was edited: the sealed denial decides
                    raise AlreadyDecided(approval_id, "denied")
                if any(person(d.approver_id) == person(approver.id) for d in given):
                    raise WrongApprover(
                        approval_id, f"{approver.id} already approved; a second, distinct approver is needed"
                    )
                self.checks.recheck_and_record(conn, spec, row, approver)
                if spec.shadow:
                    return self.record_shadow(conn, row, approver, len(given) + 1, required)
                if len(given) + 1 < required:
                    kind = "regrant_partial" if regrant else "approved_partial"
                    self.store.append_events(conn, [self.events.event(kind, row=row, approver=approver.id)])
                    return PartialApproval(
                        approval_id=row.id, version=row.version, approvals=len(given) + 1, required=required
                    )
                if regrant:
                    minted.append(self.mint(conn, row, approver, "regranted", {}, expect="approved"))
                else:
                    decided = {"status": "approved", "decided_at": self.clock.now()}
                    minted.append(self.mint(conn, row, approver, "approved", decided, expect="pending"))
                return minted[0]
        assert expired
        raise ApprovalExpired(approval_id)

    def record_shadow(
        self, conn: Any, row: ApprovalRow, approver: Approver, approvals: int, required: int
    ) -> Recorded:
        """A shadow call's approval: the decision is recorded (by the caller); once `required`
        distinct approvers have approved, the approval is `approved` with no grant. No token is
        minted for a shadow call, so nothing can ever run it."""
        complete = approvals >= required
        if complete:
            now = self.clock.now()
            values = {"status": "approved", "decided_at": now, "updated_at": now}
            if not self.store.update_approval(
                conn, row.id, expect_status=["pending"], expect_version=row.version, values=values
            ):  # expired since it was read (`expire()` takes no subject lock)
                raise self.ledger.moved(conn, row)
        kind = "shadow_approved" if complete else "shadow_approved_partial"
        self.store.append_events(
            conn, [self.events.event(kind, row=row, approver=approver.id, role=approver.role)]
        )
        return Recorded(approval_id=row.id, version=row.version, approvals=approvals, required=required)

    def mint(
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
        expires, ids = now + self.policy.token_ttl, {"approval_id": row.id, "args_hash": row.args_hash}
        token = self.keyring.mint(**ids, version=row.version, expires_at=expires, round_=row.grants)
        values = {
            **values,
            "updated_at": now,
            "token_hash": token_hash(token),
            "token_kid": self.keyring.current,
            "token_expires_at": expires,
            "grants": row.grants + 1,
        }
        values["seal"] = seal_approval(self.keyring, row, values)
        if not self.store.update_approval(
            conn, row.id, expect_status=[expect], expect_version=row.version, values=values
        ):  # expired since it was read (`expire()` takes no subject lock)
            raise self.ledger.moved(conn, row)
        self.store.append_events(
            conn,
            [
                self.events.event(kind, row=row, approver=approver.id, role=approver.role),
                self.events.event("token_minted", row=row, kid=self.keyring.current, expires_at=expires),
            ],
        )
        return Grant(approval_id=row.id, version=row.version, token=token, expires_at=expires)

    def deny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None = None
    ) -> Refused:
        """Close a pending (or approved, not yet executed) approval; the model will be told why."""
        _an_approver(approver)
        try:
            refused, denied_version = self._deny(
                approval_id, approver=approver, reason=reason, version=version
            )
        except EffectGateError as exc:
            _log_refused("deny", approval_id, approver, exc)
            raise
        log.info(
            "approval denied: approval=%s version=%d tool=%s approver=%r role=%s reason=%r",
            approval_id,
            denied_version,
            refused.tool,
            approver.id,
            approver.role,
            reason,
        )
        return refused

    def _deny(
        self, approval_id: str, *, approver: Approver, reason: str, version: int | None
    ) -> tuple[Refused, int]:
        check_denial_reason(reason)
        with self.store.transaction() as conn:
            row, read = self.checks.decidable(
                conn, approval_id, approver, allow=("pending", "approved", "denied")
            )
            if row is not None and row.status == "denied" and self.ledger.denied(conn, row, read):
                raise AlreadyDecided(approval_id, "denied")  # else the unsealed column was edited
            if row is None:
                raise_expired = True
            else:
                raise_expired = False
                # the grant was presented: too late to revoke. The append-only rows decide, not
                # token_used_at alone (unsealed: a denial must not land on an effect that ran)
                if row.token_used_at is not None or (
                    row.grants and self.store.grant_spent(conn, row.id, row.version)
                ):
                    raise AlreadyDecided(approval_id, "executing")
                if version is not None and (type(version) is not int or version != row.version):
                    raise StaleApproval(approval_id, version, row.version)
                now = self.clock.now()
                self.checks.decide(conn, row, approver, "deny", reason)
                if not self.store.update_approval(
                    conn,
                    row.id,
                    expect_status=["pending", "approved", "denied"],
                    values={"status": "denied", "reason": reason, "decided_at": now, "updated_at": now},
                ):
                    raise AlreadyDecided(approval_id, "executing")  # pragma: no cover - locked
                self.store.append_events(
                    conn, [self.events.event("denied", row=row, approver=approver.id, reason=reason)]
                )
        if raise_expired or row is None:
            raise ApprovalExpired(approval_id)
        refused = Refused(
            code="denied", message=f"{row.tool} was denied: {reason}", tool=row.tool, approval_id=approval_id
        )
        return refused, row.version
