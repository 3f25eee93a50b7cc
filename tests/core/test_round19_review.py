"""Round 19 review of `gate.release` (`_release`) and the voiding of a cancelled `aapprove`'s
grant (`_adecide`), against the subject history (`_standing`), `confirm`, the audit and the
two-person rule. SQLite and PostgreSQL; refunds counted at the provider's receiver.

- A released grant still counts in the subject's history until its granting decisions' time
  plus `token_ttl` (its stored expiry, unsealed, cannot shorten that): a second refund that would
  overdraw the order together with it is refused meanwhile; the released approval's own regrant
  passes its confirm (it is excluded from its own history). After that lifetime the second
  refund may be approved, and the first one's regrant is then refused by confirm: never more
  refunded than the order's total.
- A released-then-regranted refund runs once and the audit is clean.
- A released token whose row's stored expiry is edited back to later: the token ran (the
  unsealed column alone said the grant was given back) and the audit flagged nothing; now the
  sealed `release` decision of the grant's round refuses it (`_seal.grant_released`).
- A cancelled `aapprove` on a call that needs two approvers: the first (partial) approval that
  landed is kept and said so; the second's grant, voided, takes a new round of two.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, Grant, PartialApproval, Pending, Refused
from effectgate.errors import ConfirmFailed, TokenError, WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_round19_async import _cancelled_in_its_thread, _held_in

FINANCE = Approver("fiona", "finance")
FRED = Approver("fred", "finance")
PRIVACY = (Approver("pia", "privacy"), Approver("pat", "privacy"))


def _refund(shop_gate: ShopGate, amount: int, message: str, session: str = "s-ada") -> Pending:
    args = {"order_id": "1042", "amount": amount, "currency": "GBP"}
    pending = shop_gate.gate.call("refund_order", args, context(message, session_id=session))
    assert isinstance(pending, Pending), pending
    return pending


def _released(shop_gate: ShopGate, amount: int = 8000) -> tuple[Pending, str]:
    pending = _refund(shop_gate, amount, "m1")
    grant = shop_gate.gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop_gate.gate.release(grant.token)
    return pending, grant.token


def _refunded(shop_gate: ShopGate) -> int:
    return sum(int(r["amount"]) for r in shop_gate.shop.provider.refunds.values())


def test_a_released_refund_still_counts_until_its_grant_could_have_lapsed(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    first, _ = _released(shop_gate)
    second = gate.call(
        "refund_order",
        {"order_id": "1042", "amount": 8000, "currency": "GBP"},
        context("m2", session_id="s-2"),
    )
    if isinstance(second, Pending):  # proposed: its approval is refused by confirm
        with pytest.raises(ConfirmFailed):
            gate.approve(second.approval_id, version=1, approver=FRED)
    else:
        assert isinstance(second, Refused)
    # the released approval's own regrant passes its confirm (it is not its own history)
    again = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(again, Grant)
    gate.execute(again.token)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert _refunded(shop_gate) == 8000
    assert gate.audit().clean


def test_after_the_lifetime_the_second_refund_wins_and_the_regrant_is_refused(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    first, _ = _released(shop_gate)
    clock.advance(gate.policy.token_ttl + 1)
    second = _refund(shop_gate, 8000, "m2", session="s-2")
    grant = gate.approve(second.approval_id, version=1, approver=FRED)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    with pytest.raises(ConfirmFailed):  # the first, granted again, would overdraw the order
        gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert _refunded(shop_gate) == 8000
    assert gate.audit().clean


def test_a_released_token_stays_refused_and_cannot_be_released_into_a_regrant(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    first, token = _released(shop_gate)
    again = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(again, Grant)
    with pytest.raises(TokenError):
        gate.execute(token)
    with pytest.raises(TokenError):
        gate.release(token)  # the old token cannot void the new grant
    gate.execute(again.token)
    assert shop_gate.shop.receiver.count("refund") == 1
    kinds = [e.kind for e in shop_gate.gate.store.events(approval_id=first.approval_id)]
    assert (kinds.count("grant_released"), kinds.count("regranted")) == (1, 1)
    assert gate.audit().clean


def test_a_released_token_is_refused_even_when_its_stored_expiry_is_edited_back(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    first, token = _released(shop_gate)
    with store.transaction() as conn:  # the database owner puts the column back
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_expires_at = :t WHERE id = :id"),
            {"t": clock.now() + gate.policy.token_ttl, "id": first.approval_id},
        )
    with pytest.raises(TokenError) as refused:
        gate.execute(token)
    assert refused.value.reason == "expired"
    assert shop_gate.shop.receiver.count("refund") == 0
    assert gate.audit().clean


def test_a_released_grant_is_granted_again_even_when_its_stored_expiry_is_edited_back(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """The sealed release decides that the grant is no longer live: approving again is not
    AlreadyDecided because the column was put back; the new grant runs once, the old one never."""
    gate = shop_gate.gate
    first, token = _released(shop_gate)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_expires_at = :t WHERE id = :id"),
            {"t": clock.now() + gate.policy.token_ttl, "id": first.approval_id},
        )
    again = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(again, Grant)
    with pytest.raises(TokenError):
        gate.execute(token)
    gate.execute(again.token)
    with pytest.raises(TokenError):
        gate.execute(token)
    assert shop_gate.shop.receiver.count("refund") == 1
    with store.reading() as conn:
        released = [d for d in store.decisions(conn, first.approval_id) if d.decision == "release"]
    assert [(d.version, d.grant_round) for d in released] == [(1, 0)]
    assert gate.audit().clean


def test_a_cancelled_aapprove_of_a_two_approver_call_keeps_the_first_approval(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first (partial) approval landed in its thread: kept and said so; the second
    approver's grant runs once."""
    gate = shop_gate.gate
    pending = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m1"))
    assert isinstance(pending, Pending)
    entered, go = _held_in(monkeypatch, "_approve")
    exc = _cancelled_in_its_thread(
        lambda: gate.aapprove(pending.approval_id, version=1, approver=PRIVACY[0]), entered, go
    )
    monkeypatch.undo()
    assert "1 of 2" in " ".join(getattr(exc, "__notes__", ()))
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("pending", 0)
    with pytest.raises(WrongApprover):  # counted: the same approver is not a second one
        gate.approve(pending.approval_id, version=1, approver=PRIVACY[0])
    grant = gate.approve(pending.approval_id, version=1, approver=PRIVACY[1])
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("delete") == 1
    assert gate.audit().clean


def test_a_voided_second_approval_takes_a_new_round_of_two(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = shop_gate.gate
    pending = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m1"))
    assert isinstance(pending, Pending)
    first = gate.approve(pending.approval_id, version=1, approver=PRIVACY[0])
    assert isinstance(first, PartialApproval)
    entered, go = _held_in(monkeypatch, "mint")
    exc = _cancelled_in_its_thread(
        lambda: gate.aapprove(pending.approval_id, version=1, approver=PRIVACY[1]), entered, go
    )
    monkeypatch.undo()
    assert "voided" in " ".join(getattr(exc, "__notes__", ()))
    kinds = [e.kind for e in store.events(approval_id=pending.approval_id)]
    assert kinds.count("grant_voided") == 1
    # a new round: one approver alone grants nothing
    again = gate.approve(pending.approval_id, version=1, approver=PRIVACY[1])
    assert isinstance(again, PartialApproval)
    with pytest.raises(WrongApprover):  # the user who made the call may not be the second
        gate.approve(pending.approval_id, version=1, approver=Approver("u1", "privacy"))
    grant = gate.approve(pending.approval_id, version=1, approver=PRIVACY[0])
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("delete") == 1
    assert gate.audit().clean


def test_releasing_a_grant_whose_stored_hash_was_edited_into_other_text_is_refused(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """A token hash edited into non-ASCII text: `release` refuses the token as not the live grant
    (a TokenError), never a raw TypeError from comparing it, and changes nothing."""
    pending = _refund(shop_gate, 8000, "m1")
    grant = shop_gate.gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_hash = :h WHERE id = :id"),
            {"h": "é" * 64, "id": pending.approval_id},
        )
    with pytest.raises(TokenError):
        shop_gate.gate.release(grant.token)
    with store.reading() as conn:
        assert not [d for d in store.decisions(conn, pending.approval_id) if d.decision == "release"]
    assert shop_gate.shop.receiver.count("refund") == 0
