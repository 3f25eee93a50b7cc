"""What a decision is made on: the approval read and checked, and the sealed decision it records.

`decidable` reads the approval under its subject lock and refuses it (nothing changes) unless
its seal and arguments hash verify, its status allows the decision and the approver's role meets
the row's; its deadline is derived (not read from its column), and a pending approval past it is
marked expired (the caller raises `ApprovalExpired`). `lapsed` is the check before
an approved version is granted again; `recheck_and_record` re-runs the row's `scope` and
`confirm` for the stored call before an approval is recorded; `decide` writes the sealed
decision row (an approval or a denial, in its grant round). `_decisions.Decisions` approves and
denies with them, in its own transactions.
"""

from __future__ import annotations

from typing import Any

from ._deadline import derived
from ._deps import Deps
from ._json import parse
from ._ledger import Ledger, context_of, grant_live, in_scope, past
from ._seal import approval_intact, approval_verifies, broken, seal_decision
from .context import Approver
from .errors import (
    AlreadyDecided,
    ApprovalExpired,
    ConfirmFailed,
    PolicyViolation,
    TamperedRecord,
    UnknownApproval,
    WrongApprover,
)
from .stores.records import ApprovalRow, DecisionRow
from .table import ToolSpec


class Decidable:
    """The checks before a decision, and its sealed row; see the module docstring."""

    def __init__(self, deps: Deps, ledger: Ledger) -> None:
        self.store = deps.store
        self.policy = deps.policy
        self.keyring = deps.keyring
        self.clock = deps.clock
        self.ledger = ledger

    def decidable(
        self, conn: Any, approval_id: str, approver: Approver, allow: tuple[str, ...] = ("pending",)
    ) -> tuple[ApprovalRow | None, list[DecisionRow]]:
        """The row if `approver` may decide it now, None if it just expired (marked so); and its
        version's decisions. Read under the subject lock; seal, arguments hash, deadline checked first."""
        row, read, proposed = self.store.locked_decided_at(conn, approval_id)
        if row is None:
            raise UnknownApproval(approval_id)
        pending, intact = row.status == "pending", approval_intact(self.keyring, row)
        if not pending and not intact and approval_verifies(self.keyring, row):
            # a closed call whose arguments `redact` erased (sealed, so only they changed)
            if row.status == "expired":
                raise ApprovalExpired(approval_id)
            raise AlreadyDecided(approval_id, row.status)
        if not intact or (pending and row.grants):
            raise TamperedRecord(approval_id, broken(self.keyring, row, granted=pending and bool(row.grants)))
        if pending or row.status == "approved":  # from here on the row holds its derived deadline
            row.expires_at = derived(row, proposed, self.policy.pending_ttl)
        if pending and not self.ledger.expire_lapsed(conn, [row]):
            return None, read  # it lapsed: now marked expired
        if row.status not in allow:
            if row.status == "expired":
                raise ApprovalExpired(approval_id)
            raise AlreadyDecided(approval_id, row.status)
        if not self.policy.role_satisfies(approver.role, row.approver_role):
            raise WrongApprover(
                approval_id, f"{row.tool} needs role {row.approver_role}; {approver.id} holds {approver.role}"
            )
        return row, read

    def lapsed(self, conn: Any, row: ApprovalRow, *, released: bool = False) -> None:
        """An approved version may be granted again only when its grant lapsed unpresented: the
        approval still stands, but the subject, scope and confirm checks run again (the lapse
        freed the subject for other sessions), the old token is void (its hash is replaced), and
        the new grant needs its own round of distinct approvers."""
        now = self.clock.now()
        if (
            row.token_used_at is not None
            or (grant_live(row.token_expires_at, now) and not released)
            or self.store.grant_spent(conn, row.id, row.version)  # the append-only rows decide
        ):
            raise AlreadyDecided(row.id, "approved")  # a usable or presented grant exists
        if past(row.expires_at, now):
            raise ApprovalExpired(row.id)
        busy = self.store.in_flight_elsewhere(conn, row.subject_key, row.session_id, now)
        if busy is not None:
            raise PolicyViolation(
                f"{row.tool}: approval {busy.id} is in flight on this subject from another session",
                code="subject_busy",
            )

    def recheck_and_record(self, conn: Any, spec: ToolSpec, row: ApprovalRow, approver: Approver) -> None:
        """Re-run `scope` and `confirm` for the stored call (a row with neither has nothing to
        re-run), then record the sealed decision."""
        if spec.scope is not None or spec.confirm is not None:
            ctx = context_of(row)
            args = parse(row.args_json)
            if not in_scope(spec, args, ctx):
                raise PolicyViolation(
                    f"{row.tool}: the caller is no longer in scope for this subject", code="out_of_scope"
                )
            reason = self.ledger.confirm(conn, spec, args, ctx, row.subject_key, exclude=row.id)
            if reason is not None:
                raise ConfirmFailed(row.tool, reason)
            if past(row.expires_at, self.clock.now()):  # its deadline (derived) passed while they ran:
                raise ApprovalExpired(row.id)  # late, as the audit judges the decision (`approved_late`)
        self.decide(conn, row, approver, "approve")

    def decide(
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
