"""Round 26 review of grant tokens and keys (`tokens`, `_execution`, `_release`), on SQLite and
PostgreSQL; refunds counted at the provider's receiver.

- A grant token named its approval, version, args hash and expiry, but not the round of approvers
  that minted it. A grant given back unpresented (`gate.release`) and granted again by a new round:
  with the row's unsealed `token_hash` edited back to the released token's hash, the released
  token ran (the sealed `release` decision names the old round; execute checks only the current
  one), and the audit saw nothing. Now the round is signed into the token (its nonce) and a token
  of another round than the row's sealed count is refused as tampered; a `release` of it voids
  nothing. A token minted without a round (an earlier release) still verifies.
- An approval's pending deadline (`expires_at`) was judged from its unsealed column, so one
  edited forward after it passed was approved and ran, and the audit was clean. Now it is derived
  from the version's proposal event and the policy (`_deadline`; round 29 tests the rest).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Approver, Grant, Pending
from effectgate.errors import ApprovalExpired, TokenError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tokens import Keyring, token_hash

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")
FRED = Approver("fred", "finance")


def _regranted(shop_gate: ShopGate, store: SQLStore) -> tuple[Pending, Grant, Grant]:
    """A refund granted, its grant released, granted again; the row's token hash edited back to
    the released grant's."""
    args = {"order_id": "1042", "amount": 8000, "currency": "GBP"}
    pending = shop_gate.gate.call("refund_order", args, context("m1", session_id="s-ada"))
    assert isinstance(pending, Pending), pending
    first = shop_gate.gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(first, Grant)
    shop_gate.gate.release(first.token)
    second = shop_gate.gate.approve(pending.approval_id, version=1, approver=FRED)
    assert isinstance(second, Grant)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_hash = :h WHERE id = :id"),
            {"h": token_hash(first.token), "id": pending.approval_id},
        )
    return pending, first, second


def test_a_released_grant_is_not_revived_by_its_hash_edited_back_after_a_regrant(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    pending, first, _ = _regranted(shop_gate, store)
    with pytest.raises(TokenError) as refused:
        shop_gate.gate.execute(first.token)
    assert refused.value.reason == "tampered"
    assert shop_gate.shop.receiver.count("refund") == 0
    kinds = [e.kind for e in store.events(approval_id=pending.approval_id)]
    assert "token_used" not in kinds
    assert "token_refused" in kinds


def test_releasing_a_released_grant_edited_back_voids_nothing(shop_gate: ShopGate, store: SQLStore) -> None:
    pending, first, second = _regranted(shop_gate, store)
    with pytest.raises(TokenError, match="earlier round"):
        shop_gate.gate.release(first.token)
    with store.reading() as conn:
        released = [d for d in store.decisions(conn, pending.approval_id) if d.decision == "release"]
    assert [d.grant_round for d in released] == [0]  # only the first grant's own release
    with store.transaction() as conn:  # the hash put right: the second grant runs, once
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_hash = :h WHERE id = :id"),
            {"h": token_hash(second.token), "id": pending.approval_id},
        )
    shop_gate.gate.execute(second.token)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_the_grant_round_is_signed_and_a_token_without_one_still_verifies() -> None:
    ring = Keyring.generate()
    at = 1_800_000_000.0
    token = ring.mint(approval_id="ap1", version=2, args_hash="h", expires_at=at, round_=3)
    claims = Keyring.read(token)
    ring.verify(claims, args_hash="h")
    assert claims.grant_round == 3
    legacy = Keyring.read(ring.mint(approval_id="ap1", version=2, args_hash="h", expires_at=at))
    ring.verify(legacy, args_hash="h")
    assert legacy.grant_round is None
    head, _, mac = token.rpartition(".")  # another round in the nonce: the MAC no longer matches
    moved = head.replace("_r3", "_r2") + "." + mac
    with pytest.raises(TokenError, match="forged"):
        ring.verify(Keyring.read(moved), args_hash="h")
    with pytest.raises(ValueError, match="round"):
        ring.mint(approval_id="ap1", version=2, args_hash="h", expires_at=at, round_=-1)


def test_an_approval_past_its_deadline_is_not_revived_by_its_deadline_edited_forward(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    args = {"order_id": "1042", "amount": 8000, "currency": "GBP"}
    pending = gate.call("refund_order", args, context("m1", session_id="s-ada"))
    assert isinstance(pending, Pending), pending
    clock.advance(gate.policy.pending_ttl * 3)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET expires_at = :t WHERE id = :id"),
            {"t": clock.now() + 3600, "id": pending.approval_id},
        )
    with pytest.raises(ApprovalExpired):  # was: granted, and the refund ran (audit clean)
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
