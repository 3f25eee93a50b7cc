"""Round 13 review of decisions (approve, grant again, deny): defects reproduced first, on SQLite
and PostgreSQL (the `store` fixture family)."""

from __future__ import annotations

import unicodedata

import pytest
import sqlalchemy as sa

from effectgate import Approver, Pending
from effectgate.errors import AlreadyDecided, EffectGateError, WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE, Bank, pay_grant, status
from .conftest import MakeGate, ShopGate


def test_no_fresh_grant_for_a_version_whose_grant_was_presented(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A payment's grant was presented and its reply lost (outcome unknown). Someone with write
    access clears `token_used_at` and sets the status back to `approved` (neither is sealed). The
    append-only rows say the grant was spent (as `deny` and `execute` read them): granting the
    version again must be refused, with no new grant counted in the sealed row."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(EffectGateError):
        gate.execute(grant.token)
    assert bank.runs == 1
    with store.engine.begin() as conn:  # behind effectgate's back
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'approved', token_used_at = NULL WHERE id = :id"),
            {"id": grant.approval_id},
        )
    clock.advance(gate.policy.token_ttl + 1)
    with pytest.raises(AlreadyDecided):
        gate.approve(grant.approval_id, version=grant.version, approver=FINANCE)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert row.grants == 1
    assert bank.runs == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [("pia", "PIA"), ("pi\u00e1", "pia\u0301"), ("pia", "pia ")],
    ids=["case", "nfd", "space"],
)
def test_one_person_under_two_spellings_is_one_approver(
    shop_gate: ShopGate, store: SQLStore, first: str, second: str
) -> None:
    """A destructive call needs two distinct people: "pia" and "PIA", "pi\u00e1" composed and
    decomposed, "pia" and "pia " are one person to any reviewer: their two approvals must not
    grant it."""
    assert unicodedata.normalize("NFKC", second).strip().casefold() == first.casefold()
    _, gate = shop_gate
    out = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m9"))
    assert isinstance(out, Pending)
    gate.approve(out.approval_id, version=1, approver=Approver(first, "privacy"))
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=Approver(second, "privacy"))
    assert status(store, out.approval_id) == "pending"
