"""Giving back a grant nobody presented: its holder voids it so the approval can be granted again.

An adapter that holds a grant it cannot keep until its call runs (a LangGraph step that pauses
again: the re-run has no token; only its hash is stored) gives it back instead of presenting it
outside the call's own path. The token must verify (its MAC, its hash in the approval, the
approval's version and seal) and be unpresented; its stored expiry is then set to now, which
execute honours (a stored expiry can only shorten the signed one), so the token is refused as
expired from then on, and the approval stands approved with its grant lapsed: `approve` grants
it again, by a new round of approvers, with the subject, scope and confirm checks run again.
Recorded as a sealed `release` decision of the round that minted the grant (so an edit of the
stored expiry, which no seal covers, revives nothing: `execute` reads the version's decisions
with the row) and a `grant_released` event (never the token).
"""

from __future__ import annotations

import hmac
from typing import Any

from ._deps import Deps, Events
from ._execution import lapsed
from ._seal import RELEASE, approval_intact, seal_decision
from .errors import TokenError
from .stores.protocol import Store
from .stores.records import ApprovalRow
from .tokens import Keyring, token_hash


def release(
    deps: Deps,
    events: Events,
    token: str,
    *,
    why: str = "given back unpresented",
    kind: str = "grant_released",
    **detail: Any,
) -> None:
    """Void `token`, an unpresented grant; TokenError (as execute words it) and nothing changes
    for a token that is not the approval's live grant. `why` is the sealed decision's reason;
    `kind` and `detail` the event's (a cancelled `aapprove`'s voiding: `_adecide.VOIDED`)."""
    claims = Keyring.read(token)
    store = deps.store
    with store.transaction() as conn:
        row = store.locked_approval(conn, claims.approval_id)
        if row is None:
            raise TokenError("forged", "the token names no known approval")
        deps.keyring.verify(claims, args_hash=row.args_hash)
        stored = row.token_hash
        if not isinstance(stored, str) or not hmac.compare_digest(  # edited into non-ASCII text: not it
            token_hash(token).encode(), stored.encode("utf-8", "surrogatepass")
        ):
            raise TokenError("expired", f"this is not the live grant of approval {row.id}")
        if not approval_intact(deps.keyring, row):
            raise TokenError("tampered", f"approval {row.id}: the stored record does not verify")
        if claims.grant_round not in (None, row.grants - 1):  # its hash edited back in
            raise TokenError("tampered", f"approval {row.id}: its stored grant is of an earlier round")
        spent = row.token_used_at is not None or store.grant_spent(conn, row.id, row.version)
        if spent or row.status in ("executed", "failed"):
            raise TokenError("used", f"the grant for approval {row.id} was spent")
        if row.status != "approved" or claims.version != row.version:
            raise TokenError("mismatch", f"approval {row.id} is {row.status} at version {row.version}")
        now = deps.clock.now()
        if lapsed(claims, row, now):
            raise TokenError("expired", f"the grant for approval {row.id} expired")
        values = {"token_expires_at": now, "updated_at": now}
        if not store.update_approval(
            conn, row.id, expect_status=["approved"], expect_version=row.version, values=values
        ):  # pragma: no cover - the subject lock is held
            raise TokenError("mismatch", f"approval {row.id} changed")
        record_release(store, deps.keyring, conn, row, why)
        store.append_events(conn, [events.event(kind, row=row, **detail)])


def record_release(store: Store, keyring: Keyring, conn: Any, row: ApprovalRow, reason: str) -> None:
    """The sealed decision that gives the row's current grant back (`_seal.grant_released`):
    `execute` refuses that grant whatever its stored expiry says by then."""
    values = {
        "approval_id": row.id,
        "version": row.version,
        "grant_round": row.grants - 1,  # the round that minted it
        "approver_id": "effectgate",
        "role": row.approver_role,
        "decision": RELEASE,
    }
    store.add_decision(conn, reason=reason, seal=seal_decision(keyring, values), **values)
