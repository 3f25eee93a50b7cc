"""Who sees what and who may act: the inbox lists what the approver's role can decide, the
read-only view shows the rest without forms, and deciding or reconciling needs the role."""

from __future__ import annotations

import json
import re

from starlette.testclient import TestClient

from effectgate import Pending
from effectgate.examples.shop import context
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

from .conftest import FROM_PROXY, SSO_SECRET, Inbox, form, login, propose, snapshot

CARD = re.compile(r'data-approval="([^"]+)"')
READ_ONLY = re.compile(r'data-approval="([^"]+)" data-read-only="1"')


def three_cards(inbox: Inbox) -> dict[str, Pending]:
    """A refund (finance), an email (support_lead) and a data deletion (privacy), all pending."""
    email = inbox.gate.call(
        "send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "Sorry"}, context("m7")
    )
    delete = inbox.gate.call("delete_customer_data", {"customer_id": "u1"}, context("m9"))
    assert isinstance(email, Pending)
    assert isinstance(delete, Pending)
    return {"refund": propose(inbox), "email": email, "delete": delete}


def listed(html: str) -> set[str]:
    return set(CARD.findall(html))


def test_inbox_lists_only_the_cards_the_role_can_decide(inbox: Inbox) -> None:
    """Each approver's inbox holds exactly the pending cards their role may decide."""
    cards = three_cards(inbox)
    for approver, kind in (("fiona", "refund"), ("sam", "email"), ("pia", "delete")):
        c = inbox.client()
        login(c, approver)
        assert listed(c.get("/").text) == {cards[kind].approval_id}, approver
    assert [a.status for a in inbox.store.approvals()] == ["pending"] * 3


def test_inbox_includes_cards_a_policy_role_grant_covers(inbox: Inbox) -> None:
    """A finance_lead (the shop's policy lets finance_lead decide for finance) sees the refunds."""
    cards = three_cards(inbox)
    approvers = ApproverRegistry([RegisteredApprover("lena", "finance_lead", hash_secret("lena-pw"))])
    app = create_app(inbox.gate, approvers, secret_key="k", sso_header="X-User", sso_secret=SSO_SECRET)
    headers = {"X-User": "lena", **FROM_PROXY}
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False, headers=headers)
    assert listed(c.get("/").text) == {cards["refund"].approval_id}


def test_show_all_lists_every_card_and_marks_the_others_read_only(inbox: Inbox) -> None:
    """`/?all=1` lists every pending card; those the viewer cannot decide are marked read-only,
    and the list carries no decision forms."""
    cards = three_cards(inbox)
    c = inbox.client()
    login(c, "sam")
    html = c.get("/", params={"all": "1"}).text
    assert listed(html) == {p.approval_id for p in cards.values()}
    assert set(READ_ONLY.findall(html)) == {cards["refund"].approval_id, cards["delete"].approval_id}
    assert "read-only view" in html
    assert 'action="/approvals/' not in html  # the only form that posts is the sign-out
    assert "read-only: needs finance" in html


def test_card_page_shows_decision_forms_only_to_a_role_that_can_decide(inbox: Inbox) -> None:
    """The refund's card has approve and deny forms for finance and none for a support lead."""
    p = propose(inbox)
    finance, support = inbox.client(), inbox.client()
    login(finance, "fiona")
    login(support, "sam")
    action = f'action="/approvals/{p.approval_id}/'
    assert finance.get(f"/approvals/{p.approval_id}").text.count(action) == 2
    html = support.get(f"/approvals/{p.approval_id}").text
    assert action not in html
    assert "Read-only: deciding this card needs role <strong>finance</strong>" in html


def test_a_post_from_a_role_shown_read_only_is_still_refused(inbox: Inbox) -> None:
    """Forging the approve and deny forms a support lead was not shown changes nothing."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "sam")
    before = snapshot(inbox)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 403
    r = c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="no"))
    assert r.status_code == 403
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


def timed_out_refund(inbox: Inbox) -> Pending:
    """A refund approved by fiona whose provider reply was lost: it needs reconciliation."""
    p = propose(inbox)
    inbox.shop.provider.timeouts_to_inject = 1
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    assert len(inbox.store.idempotency_records(status="needs_reconciliation")) == 1
    assert inbox.shop.receiver.count("refund") == 1
    return p


def test_reconcile_needs_the_operations_role(inbox: Inbox) -> None:
    """A support lead sees the queued refund read-only and a forged reconcile is refused with 403;
    nothing is settled, released or run again."""
    p = timed_out_refund(inbox)
    c = inbox.client()
    csrf = login(c, "sam")
    queue = c.get("/reconciliation").text
    assert f'action="/reconciliation/{p.approval_id}"' not in queue
    assert f'data-read-only="{p.approval_id}"' in queue
    before = (snapshot(inbox), inbox.store.idempotency_records(), inbox.store.events())
    r = c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf})
    assert r.status_code == 403
    assert "needs role finance" in r.text
    assert (snapshot(inbox), inbox.store.idempotency_records(), inbox.store.events()) == before
    assert inbox.shop.receiver.count("refund") == 1


def test_reconcile_by_the_role_settles_and_records_who(inbox: Inbox) -> None:
    """Finance sees the reconcile form; reconciling settles from the provider's record with no
    second refund, and the event names the approver."""
    p = timed_out_refund(inbox)
    c = inbox.client()
    csrf = login(c, "frank")
    assert f'action="/reconciliation/{p.approval_id}"' in c.get("/reconciliation").text
    assert c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf}).status_code == 200
    assert inbox.store.idempotency_records(status="needs_reconciliation") == []
    assert inbox.shop.receiver.count("refund") == 1
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert row.status == "executed"
    [event] = inbox.store.events(kind="reconciled", approval_id=p.approval_id)
    assert json.loads(event.detail_json)["by"] == "reconcile by frank (finance)"


def test_reconcile_of_an_unknown_approval_is_not_found(inbox: Inbox) -> None:
    """Reconciling an id that names no approval answers 404 and changes nothing."""
    p = timed_out_refund(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    before = (snapshot(inbox), inbox.store.idempotency_records())
    assert c.post("/reconciliation/nope", data={"csrf": csrf}).status_code == 404
    assert (snapshot(inbox), inbox.store.idempotency_records()) == before
    assert inbox.store.get_approval(p.approval_id) is not None
