"""Round 23: one person is one approver however the application spelled their id. Ids differing
only in case, Unicode normalisation, invisible format characters or surrounding whitespace name
one person for the rules that count people: no approving one's own call, and two distinct
approvers for a destructive call (the gate, the audit and the inbox alike)."""

from __future__ import annotations

import pytest

import effectgate._decisions as decisions_module
import effectgate._ledger as ledger_module
from effectgate import Approver, Grant, PartialApproval, Pending
from effectgate._person import person
from effectgate.audit import audit
from effectgate.errors import WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


@pytest.mark.parametrize("spelling", ["U1", " u1", "u\u200b1", "\uff55\uff11"])
def test_the_user_who_made_a_call_under_another_spelling_may_not_approve_it(
    shop_gate: ShopGate, store: SQLStore, spelling: str
) -> None:
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m1", user_id="u1"))
    assert isinstance(out, Pending)
    with pytest.raises(WrongApprover, match="made this call"):
        gate.approve(out.approval_id, version=1, approver=Approver(spelling, "finance"))
    [row] = store.approvals()
    assert (row.status, row.token_hash) == ("pending", None)
    assert store.all_decisions() == []


def test_people_rules_leave_distinct_people_distinct() -> None:
    assert person("pia") != person("pete")
    assert person("pia x") != person("piax")  # whitespace inside an id is part of it
    assert person("pi\u00e1") == person("pia\u0301") != person("pia")


def test_the_audit_counts_one_person_under_two_spellings_once(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destructive call granted by "pia" and "PIA" (as a gate that compared ids exactly did) is
    reported by the audit: one person approved it, two were needed."""
    shop, gate = shop_gate
    out = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m9"))
    assert isinstance(out, Pending)
    with monkeypatch.context() as m:  # the comparison as it was: exact
        m.setattr(decisions_module, "person", lambda s: s)
        m.setattr(ledger_module, "person", lambda s: s)
        first = gate.approve(out.approval_id, version=1, approver=Approver("pia", "privacy"))
        assert isinstance(first, PartialApproval)
        grant = gate.approve(out.approval_id, version=1, approver=Approver("PIA", "privacy"))
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
    assert shop.receiver.count("delete") == 1
    report = audit(store, keyring=gate.keyring)
    assert not report.clean
    assert [f.approval_id for f in report.findings] == [out.approval_id]
