"""Who proposed an amended version: the amending call's identity (a44ee2b), for every path.

A shared session: u1's message proposes an email, sam (a support lead) sends a later message on
the same subject with other arguments. The new version is sam's: sam may not approve it, on the
sync, flow (`call_step`) and async paths alike; someone else may, and it runs once. A reviewer's edit
(`gate.flows.edit`, the call's own context, `edited_by`) keeps the call's user as its proposer, so
the reviewer who edited can approve their edit and it runs once, while the call's user cannot.
Effects are counted at the shop's receiver.
"""

from __future__ import annotations

import asyncio

import pytest

from effectgate import Approver, CallContext, Grant, Pending
from effectgate.errors import WrongApprover
from effectgate.flow import drive
from tests.core.conftest import ShopGate

SAM = Approver("sam", "support_lead")
LEAD = Approver("lee", "support_lead")
U1 = Approver("u1", "support_lead")
EMAIL = {"to": ["a@x.example"], "subject": "hello", "body": "first"}


def ctx(message: str, user: str = "u1") -> CallContext:
    return CallContext(session_id="s-shared", origin_message_id=message, user_id=user, agent_id="support")


def _row(shop_gate: ShopGate, approval_id: str) -> tuple[str, str, int]:
    row = shop_gate.gate.store.get_approval(approval_id)
    assert row is not None
    return row.user_id, row.origin_message_id, row.version


@pytest.mark.parametrize("via", ["call", "call_step", "acall"])
def test_an_amendment_by_another_user_is_theirs_and_they_may_not_approve_it(
    shop_gate: ShopGate, via: str
) -> None:
    gate = shop_gate.gate
    first = gate.call("send_email", EMAIL, ctx("m1"))
    assert isinstance(first, Pending)
    later = {**EMAIL, "body": "second"}
    if via == "call_step":
        [amended] = drive(gate.flows.call_step([("send_email", later)], ctx("m2", "sam")))
    elif via == "acall":
        amended = asyncio.run(gate.acall("send_email", later, ctx("m2", "sam")))
    else:
        amended = gate.call("send_email", later, ctx("m2", "sam"))
    assert isinstance(amended, Pending)
    assert _row(shop_gate, first.approval_id) == ("sam", "m2", 2)
    with pytest.raises(WrongApprover):
        gate.approve(first.approval_id, version=2, approver=SAM)
    grant = gate.approve(first.approval_id, version=2, approver=U1)  # u1 did not propose version 2
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("email") == 1


def test_a_reviewers_edit_can_be_approved_by_that_reviewer_not_by_the_calls_user(
    shop_gate: ShopGate,
) -> None:
    gate = shop_gate.gate
    first = gate.call("send_email", EMAIL, ctx("m1"))
    assert isinstance(first, Pending)
    edited = drive(gate.flows.edit("send_email", {**EMAIL, "body": "fixed"}, ctx("m1"), editor="sam"))
    assert isinstance(edited, Pending)
    assert edited.version == 2
    assert _row(shop_gate, first.approval_id) == ("u1", "m1", 2)
    assert [v.edited_by for v in gate.versions(first.approval_id)][-1] == "sam"
    with pytest.raises(WrongApprover):
        gate.approve(first.approval_id, version=2, approver=U1)
    grant = gate.approve(first.approval_id, version=2, approver=SAM)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("email") == 1
