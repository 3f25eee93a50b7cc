"""Whether a past approval of a subject is in effect, and the status it is shown with, from what
verifies: the append-only executions (`store.execution_outcomes`), the sealed count of grants,
the sealed denial of the version and the times of the sealed decisions that granted it; never
from the `status` or `token_expires_at` columns alone, which no seal covers (`Ledger.history`,
what a `confirm` balance check and a reviewer's card read; the web history page).

An edited column can hide a live grant (a refund said 'expired' while its grant can still run:
a second full refund would pass the balance check, and both run once the column is put back),
or invent one (a denied refund said 'executed' blocks legitimate ones). So a grant is in effect
from its sealed count of grants, with no sealed denial of its version, until its latest
possible expiry: its granting round's latest sealed decision's time (decisions are append-only;
a copy inserted earlier moves nothing) plus the policy's grant lifetime, or the stored expiry
when that is later (a longer lifetime of an earlier policy, a store's clock behind the gate's).

A row that does not verify but that sealed decisions name (the gate wrote it: it was edited
since, and may be put back) counts conservatively: in effect while any of its grants could
still run, flagged (`intact=False`), and a `confirm` check refuses while it is there (its
stored amount is no more trusted than its seal). So does a row sealed under a key the keyring
no longer holds (`foreign`: retired too early, its decisions sealed under it too, so none
verifies) while its executions say it ran or its stored grant expiry is ahead (the grant runs
once the key is back): an executed full refund is not forgotten because its key left. A row no
sealed decision names, inserted in the database, is no history; so is a foreign one that can
never run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .stores.records import ApprovalRow, DecisionRow

#: The status an approval has by what its executions (`store.execution_outcomes`) say, whatever
#: its unsealed status column says: ran, or its outcome unknown (in effect).
RAN_STATUS = {"succeeded": "executed", "needs_reconciliation": "approved", "presented": "approved"}
# what the executions (and a grant presented) say an approval's status is, whatever its column says
_RAN = {**RAN_STATUS, "failed": "failed"}
# what a status column claims that only an execution (a run, a failure) or a sealed denial records
_RECORDED = ("executed", "failed", "denied")


def said_status(row: ApprovalRow, ran: str | None, denied: bool, verified: bool) -> str:
    """The status the executions (`ran`, see `store.execution_outcomes`) and a sealed denial of
    the row's version (`denied`) say the row has; its column only where they say nothing and it
    claims nothing they would record. A row that does not verify under this keyring (`verified`:
    flagged so) keeps its column: its denial may be sealed under a key this keyring lacks."""
    if ran:
        return _RAN.get(ran, row.status)
    if denied:
        return "denied"
    if verified and row.status in _RECORDED:  # edited in the database: nothing ran, no one denied it
        return "approved" if row.grants else "pending"
    return row.status


class Standing(NamedTuple):
    """What a subject's history says of one approval."""

    status: str
    in_effect: bool
    intact: bool


def standing(
    row: ApprovalRow,
    ran: str | None,
    decisions: Sequence[DecisionRow],
    *,
    verified: bool,
    now: float,
    lifetime: float,
    foreign: bool = False,
) -> Standing | None:
    """The row's standing from its executions (`ran`) and its decisions whose seal verifies
    (`decisions`, any version); None when it does not verify and no sealed decision names it,
    unless its seal names a key the keyring lacks (`foreign`)."""
    if not verified:
        if not decisions and not foreign:
            return None
        times = [d.at for d in decisions if d.decision == "approve"]
        if decisions:
            live = ran is None and _live(times, row.token_expires_at, now, lifetime)
        else:  # its decisions cannot be checked: its stored expiry, trusted only to count it
            live = (
                ran is None and isinstance(row.token_expires_at, int | float) and now < row.token_expires_at
            )
        if not live and ran not in RAN_STATUS:  # nothing of it can run any more: no history
            return None
        return Standing("approved" if live else said_status(row, ran, False, False), True, False)
    ours = [d for d in decisions if d.version == row.version]
    denied = any(d.decision == "deny" for d in ours)
    granting = [d.at for d in ours if d.decision == "approve" and d.grant_round == row.grants - 1]
    live = (
        ran is None and row.grants > 0 and not denied and _live(granting, row.token_expires_at, now, lifetime)
    )
    return Standing(
        "approved" if live else said_status(row, ran, denied, True), live or ran in RAN_STATUS, True
    )


def _live(times: Sequence[object], stored: object, now: float, lifetime: float) -> bool:
    """Whether a grant its sealed decisions made at `times` may still be presented at `now`: one
    no sealed decision made may not; a time that is not a number (a copy inserted with text in
    it) says nothing certain, so it may."""
    if not times:
        return False
    if not all(isinstance(t, int | float) for t in times):
        return True
    deadline = max(float(t) for t in times if isinstance(t, int | float)) + lifetime
    if isinstance(stored, int | float):  # a later stored expiry only: an earlier one is an edit
        deadline = max(deadline, stored)
    return now < deadline
