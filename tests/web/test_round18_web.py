"""Round 18: the inbox's approve form, on SQLite and PostgreSQL.

The args hash a form carries was compared with the stored one only when the form's version was
the one the page read: a form naming the next version (one no card had shown yet) skipped the
check, and an amendment landing between that read and the gate's decision was approved with
arguments no reviewer saw. And a card offered its Approve button to an approver the gate always
refuses: the user who made the call, or an approver of this version already."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import EffectGate, Pending
from effectgate.examples.shop import context

from .conftest import REFUND, Inbox, form, login, propose, snapshot

AMENDED = {"order_id": "1042", "amount": 6000, "currency": "GBP"}


def test_a_version_amended_in_after_the_page_read_is_not_approved(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A form naming version 2 and version 1's args hash, while version 1 waits: the agent amends
    the call to version 2 (60.00 instead of 120.00) just after the inbox read the card. Version 2's arguments
    were never shown to anyone and the form's hash is not theirs: nothing is approved or run."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    read = EffectGate.card

    def card_then_amend(gate: EffectGate, approval_id: str) -> Any:
        shown = read(gate, approval_id)
        monkeypatch.setattr(EffectGate, "card", read)  # once
        amended = propose(inbox, AMENDED, "m5")
        assert (amended.approval_id, amended.version) == (p.approval_id, 2)
        return shown

    monkeypatch.setattr(EffectGate, "card", card_then_amend)
    r = c.post(f"/approvals/{p.approval_id}/approve", data={**form(p, csrf), "version": 2})
    assert r.status_code == 409
    assert inbox.shop.receiver.count("refund") == 0
    [row] = inbox.store.approvals()
    assert (row.status, row.version, row.token_hash) == ("pending", 2, None)
    assert inbox.store.all_decisions() == []


def _approve_offered(html: str, approval_id: str) -> bool:
    return f'action="/approvals/{approval_id}/approve"' in html


def test_the_user_who_made_a_call_is_not_offered_its_approval(inbox: Inbox) -> None:
    """fiona (finance) made the refund herself: the gate refuses her approval (self-approval is
    off), so her card offers no Approve button (it says why; Deny stays), and a forged approve
    still changes nothing. frank, another finance approver, is offered it."""
    inbox.shop.orders["1042"]["user_id"] = "fiona"
    p = inbox.gate.call("refund_order", REFUND, context("m3", user_id="fiona"))
    assert isinstance(p, Pending), p
    c = inbox.client()
    csrf = login(c, "fiona")
    page = c.get(f"/approvals/{p.approval_id}").text
    assert not _approve_offered(page, p.approval_id)
    assert 'id="own-call"' in page
    assert f'action="/approvals/{p.approval_id}/deny"' in page  # she may still call it off
    before = snapshot(inbox)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 403
    assert snapshot(inbox) == before
    other = inbox.client()
    login(other, "frank")
    assert _approve_offered(other.get(f"/approvals/{p.approval_id}").text, p.approval_id)


def test_an_approver_of_this_version_is_not_offered_it_again(inbox: Inbox) -> None:
    """pia approved a destructive call (1 of 2): the gate refuses her a second approval, so her
    card no longer offers one; pete, a distinct approver, is still offered it."""
    p = inbox.gate.call("delete_customer_data", {"customer_id": "u1"}, context("m7"))
    assert isinstance(p, Pending), p
    c = inbox.client()
    csrf = login(c, "pia")
    assert _approve_offered(c.get(f"/approvals/{p.approval_id}").text, p.approval_id)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    page = c.get(f"/approvals/{p.approval_id}").text
    assert not _approve_offered(page, p.approval_id)
    assert 'id="approved-already"' in page
    other = inbox.client()
    login(other, "pete")
    assert _approve_offered(other.get(f"/approvals/{p.approval_id}").text, p.approval_id)
    assert inbox.shop.receiver.count("delete") == 0
