"""The inbox through the ASGI client: every refusal path changes nothing; approvals are real."""

from __future__ import annotations

from starlette.testclient import TestClient

from effectgate import Approver, Pending
from effectgate.examples.shop import context
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

from .conftest import FROM_PROXY, SSO_SECRET, Inbox, csrf_of, form, login, propose, snapshot


def test_signed_out_pages_redirect_to_login(inbox: Inbox) -> None:
    """Without a session every inbox page redirects to /login and shows nothing."""
    p = propose(inbox)
    c = inbox.client()
    for path in ("/", f"/approvals/{p.approval_id}", "/history", "/reconciliation"):
        r = c.get(path)
        assert (r.status_code, r.headers["location"]) == (303, "/login"), path
        assert p.approval_id not in r.text


def test_login_with_a_wrong_secret_is_refused(inbox: Inbox) -> None:
    """A wrong secret or unknown id gets 401 and no session; the right one signs in."""
    c = inbox.client()
    csrf = csrf_of(c.get("/login").text)
    for who, secret in (("fiona", "nope"), ("mallory", "fiona-pw"), ("fiona", "")):
        r = c.post("/login", data={"csrf": csrf, "approver": who, "secret": secret})
        assert r.status_code in (401, 400, 422), (who, r.status_code)
        assert c.get("/").status_code == 303
    login(c, "fiona")
    assert c.get("/").status_code == 200


def test_login_without_csrf_is_refused(inbox: Inbox) -> None:
    """A login POST without the session's CSRF token is refused (no login CSRF)."""
    c = inbox.client()
    c.get("/login")
    r = c.post("/login", data={"approver": "fiona", "secret": "fiona-pw"})
    assert r.status_code == 403
    assert c.get("/").status_code == 303


def test_session_cookie_is_httponly_and_samesite_lax(inbox: Inbox) -> None:
    """The session cookie cannot be read by scripts, nor sent with a cross-site POST (Lax: a
    link followed from another site opens the inbox signed in; every decision is a POST)."""
    c = inbox.client()
    csrf = csrf_of(c.get("/login").text)
    r = c.post("/login", data={"csrf": csrf, "approver": "fiona", "secret": "fiona-pw"})
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=lax" in cookie
    assert r.headers["x-frame-options"] == "DENY"


def test_inbox_lists_pending_newest_first_and_filters(inbox: Inbox) -> None:
    """The read-only view lists every pending card newest first; the role and session filters
    narrow the list."""
    first = propose(inbox)
    inbox.clock.advance(5)
    email = inbox.gate.call(
        "send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "Sorry"}, context("m7")
    )
    assert isinstance(email, Pending)
    inbox.clock.advance(5)
    other = propose(
        inbox,
        {"order_id": "2001", "amount": 100, "currency": "GBP"},
        "g1",
        user_id="u2",
        session_id="s-grace",
    )
    c = inbox.client()
    login(c, "fiona")
    page = c.get("/", params={"all": "1"}).text
    order = [page.index(x.approval_id) for x in (other, email, first)]
    assert order == sorted(order)
    finance = c.get("/", params={"all": "1", "role": "finance"}).text
    assert first.approval_id in finance
    assert email.approval_id not in finance
    grace = c.get("/", params={"session": "s-grace"}).text
    assert other.approval_id in grace
    assert first.approval_id not in grace


def test_card_shows_stored_arguments_hash_history_and_balance(inbox: Inbox) -> None:
    """The card renders the stored args, hash, role, version, expiry, the subject's other refunds
    and what is left to refund."""
    earlier = propose(inbox, {"order_id": "1042", "amount": 5000, "currency": "GBP"}, "m1")
    inbox.gate.approve(earlier.approval_id, version=1, approver=Approver("fiona", "finance"))
    p = propose(inbox, {"order_id": "1042", "amount": 3000, "currency": "GBP"}, "m2")
    c = inbox.client()
    login(c, "frank")
    html = c.get(f"/approvals/{p.approval_id}").text
    for text in (
        p.card.args_hash,
        "finance",
        "version 1",
        "compensable",
        "<div>amount<pre>3000</pre>",
        "<td>in 1d 0h 0m</td>",
    ):
        assert text in html, text
    assert earlier.approval_id in html  # in flight on the same subject
    assert "&#34;refundable&#34;: 7000" in html


def test_hostile_argument_text_is_escaped(inbox: Inbox) -> None:
    """Argument text from the model is escaped, never rendered as markup."""
    body = '<script>alert(1)</script><form action="/approvals/x/approve">'
    p = inbox.gate.call(
        "send_email", {"to": ["ada@example.com"], "subject": "x", "body": body}, context("m7")
    )
    assert isinstance(p, Pending)
    c = inbox.client()
    login(c, "sam")
    html = c.get(f"/approvals/{p.approval_id}").text
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_long_values_are_folded_not_cut(inbox: Inbox) -> None:
    """A long argument is folded behind a summary with its size, and its whole text is in the page."""
    body = "x" * 5000
    p = inbox.gate.call(
        "send_email", {"to": ["ada@example.com"], "subject": "x", "body": body}, context("m7")
    )
    assert isinstance(p, Pending)
    c = inbox.client()
    login(c, "sam")
    html = c.get(f"/approvals/{p.approval_id}").text
    assert "<details>" in html
    assert "folded" in html
    assert body in html


def test_approve_executes_once_and_shows_the_result(inbox: Inbox) -> None:
    """Approve as finance: one grant, on_grant executes it, the receiver counts one refund."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200, r.text
    assert inbox.shop.receiver.count("refund", order_id="1042") == 1
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert row.status == "executed"
    [d] = inbox.store.all_decisions()
    assert (d.approver_id, d.role, d.decision) == ("fiona", "finance", "approve")
    again = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert again.status_code == 409
    assert inbox.shop.receiver.count("refund") == 1
    history = c.get("/history").text  # who decided, when, and the stored result
    assert "approve: fiona (finance) at 20" in history
    assert "re_1" in history


def test_post_without_or_with_a_wrong_csrf_token_changes_nothing(inbox: Inbox) -> None:
    """An approve POST without the CSRF token, or with another session's, is refused."""
    p = propose(inbox)
    c = inbox.client()
    login(c, "fiona")
    other = inbox.client()
    foreign = login(other, "frank")
    before = snapshot(inbox)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, "")).status_code == 403
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, foreign)).status_code == 403
    data = form(p, "")
    del data["csrf"]
    assert c.post(f"/approvals/{p.approval_id}/approve", data=data).status_code == 403
    assert snapshot(inbox) == before


def test_get_never_changes_state(inbox: Inbox) -> None:
    """The decision endpoints do not answer GET, and GET pages change nothing."""
    p = propose(inbox)
    c = inbox.client()
    login(c, "fiona")
    before = snapshot(inbox)
    assert c.get(f"/approvals/{p.approval_id}/approve").status_code == 405
    for path in ("/", f"/approvals/{p.approval_id}", "/history", "/reconciliation"):
        assert c.get(path).status_code == 200
    assert snapshot(inbox) == before


def test_stale_version_from_an_old_tab_is_refused(inbox: Inbox) -> None:
    """A decision on version 1 after an amendment to version 2 is refused and changes nothing."""
    p = propose(inbox)
    amended = propose(inbox, {"order_id": "1042", "amount": 6000, "currency": "GBP"}, "m5")
    assert (amended.approval_id, amended.version) == (p.approval_id, 2)
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 409
    assert "version 2" in r.text
    assert snapshot(inbox) == before


def test_a_version_not_made_yet_is_not_called_stale(inbox: Inbox) -> None:
    """A decision naming a version newer than the card's says it does not exist yet, not that
    the reviewer saw it and it is now an older one; nothing changes."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data={**form(p, csrf), "version": 2})
    assert r.status_code == 409
    assert "Version 2 of this card does not exist yet" in r.text
    assert "you saw version 2" not in r.text
    assert snapshot(inbox) == before


def test_args_hash_that_is_not_the_stored_one_is_refused(inbox: Inbox) -> None:
    """A form whose args hash differs from the stored record's is refused."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf, args_hash="0" * 64))
    assert r.status_code == 409
    assert snapshot(inbox) == before


def test_expired_approval_is_refused(inbox: Inbox) -> None:
    """Past its deadline an approval cannot be approved; it is expired, not granted."""
    p = propose(inbox)
    inbox.clock.advance(2 * 86400)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code in (409, 410)
    assert inbox.store.all_decisions() == []
    assert inbox.shop.receiver.count("refund") == 0


def test_wrong_role_cannot_approve_even_if_the_form_says_otherwise(inbox: Inbox) -> None:
    """The role comes from the registry: a support lead posting role=finance is refused."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "sam")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf, role="finance", approver="fiona"))
    assert r.status_code == 403
    assert snapshot(inbox) == before


def test_failed_confirm_check_is_refused(inbox: Inbox) -> None:
    """When the order's refundable balance shrank after the proposal, approval fails the confirm check."""
    b = propose(inbox, {"order_id": "1042", "amount": 5000, "currency": "GBP"}, "m2")
    inbox.shop.orders["1042"]["total"] = 1000  # e.g. a partial refund made outside the agent
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{b.approval_id}/approve", data=form(b, csrf))
    assert r.status_code == 409
    assert "left to refund" in r.text
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


def test_destructive_needs_two_distinct_approvers(inbox: Inbox) -> None:
    """A data deletion shows 1 of 2 after the first approval, refuses the same approver again,
    and runs once after a second privacy approver."""
    p = inbox.gate.call("delete_customer_data", {"customer_id": "u1"}, context("m9"))
    assert isinstance(p, Pending)
    first, second = inbox.client(), inbox.client()
    csrf = login(first, "pia")
    r = first.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    assert "1 of 2" in r.text
    assert "1 more distinct approver is needed" in r.text
    assert "1 of 2" in first.get(f"/approvals/{p.approval_id}").text
    again = first.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert again.status_code in (403, 409)
    assert inbox.shop.receiver.count("delete") == 0
    csrf2 = login(second, "pete")
    assert second.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf2)).status_code == 200
    assert inbox.shop.receiver.count("delete") == 1


def test_deny_records_the_reason(inbox: Inbox) -> None:
    """A denial needs a reason; it is recorded with the approver, and nothing runs."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="  ")).status_code == 409
    assert snapshot(inbox) == before
    denied = c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="delivered"))
    assert denied.status_code == 200
    assert f"Denied version {p.version}." in denied.text
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert (row.status, row.reason) == ("denied", "delivered")
    [d] = inbox.store.all_decisions()
    assert (d.approver_id, d.decision) == ("fiona", "deny")
    assert inbox.shop.receiver.count("refund") == 0
    history = c.get("/history").text
    assert p.approval_id in history
    assert "fiona" in history


def test_reconciliation_queue_and_reconcile(inbox: Inbox) -> None:
    """A refund whose provider timed out is queued with its provider ref; reconcile settles it
    from the provider's record, with no second refund."""
    p = propose(inbox)
    inbox.shop.provider.timeouts_to_inject = 1
    c = inbox.client()
    csrf = login(c, "fiona")
    c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    [record] = inbox.store.idempotency_records(status="needs_reconciliation")
    queue = c.get("/reconciliation").text
    assert record.key in queue
    assert "re_1" in queue
    r = c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf})
    assert r.status_code == 200
    assert inbox.store.idempotency_records(status="needs_reconciliation") == []
    assert inbox.shop.receiver.count("refund") == 1


def test_sso_header_identity_comes_from_the_registry(inbox: Inbox) -> None:
    """Behind a proxy, the header names a registered approver whose registry role is used; an
    unregistered name gets no access."""
    approvers = ApproverRegistry(
        [RegisteredApprover("sam", "support_lead", hash_secret("x"))],
        verify=lambda value: value.removeprefix("sso:"),
    )
    app = create_app(
        inbox.gate, approvers, secret_key="k", sso_header="X-Forwarded-User", sso_secret=SSO_SECRET
    )
    p = propose(inbox)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False, headers=FROM_PROXY)
    assert c.get("/", headers={"X-Forwarded-User": "sso:fiona"}).status_code == 303
    page = c.get("/", headers={"X-Forwarded-User": "sso:sam"})
    assert page.status_code == 200
    csrf = csrf_of(page.text)
    r = c.post(
        f"/approvals/{p.approval_id}/approve", data=form(p, csrf), headers={"X-Forwarded-User": "sso:sam"}
    )
    assert r.status_code == 403  # sam is support_lead in the registry, whatever else is claimed
    assert inbox.store.all_decisions() == []
