"""Sign-in held server-side: failed logins are throttled per approver and per client address
(on the gate's clock), signing out ends the session for every copy of the cookie, and sessions
expire on the server."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from effectgate.web import ApproverRegistry, create_app

from .conftest import (
    FROM_PROXY,
    SECRETS,
    SSO_SECRET,
    Inbox,
    csrf_of,
    form,
    login,
    propose,
    registry,
    snapshot,
)

COOKIE = "effectgate_session"


class Counted:
    """The test registry, counting how often a secret is actually checked."""

    def __init__(self) -> None:
        self.registry: ApproverRegistry = registry()
        self.checks = 0
        check = self.registry.check_secret

        def counting(approver_id: str, secret: str) -> Any:
            self.checks += 1
            return check(approver_id, secret)

        self.registry.check_secret = counting  # type: ignore[method-assign]


@pytest.fixture
def counted(inbox: Inbox) -> Counted:
    """The inbox app over a registry that counts secret checks (default limits: 5, 20, 15 min)."""
    counted = Counted()
    inbox.app = create_app(inbox.gate, counted.registry, secret_key="test-secret")
    return counted


def attempt(c: TestClient, approver: str, secret: str) -> Any:
    csrf = csrf_of(c.get("/login").text)
    return c.post("/login", data={"csrf": csrf, "approver": approver, "secret": secret})


def test_five_failures_for_one_approver_lock_that_approver_until_the_window_passes(
    inbox: Inbox, counted: Counted
) -> None:
    """After 5 wrong secrets for fiona, even her right secret gets 429 without a check; another
    approver from the same address is unaffected; 15 minutes after the first failure she signs in."""
    c = inbox.client()
    for _ in range(5):
        assert attempt(c, "fiona", "wrong").status_code == 401
        inbox.clock.advance(10)
    assert counted.checks == 5
    refused = attempt(c, "fiona", SECRETS["fiona"])
    assert refused.status_code == 429
    assert "Too many failed sign-in attempts" in refused.text
    assert "the secret was not checked" in refused.text
    assert int(refused.headers["retry-after"]) == 900 - 50
    assert counted.checks == 5
    assert c.get("/").status_code == 303  # no session
    other = inbox.client()
    assert attempt(other, "frank", SECRETS["frank"]).status_code == 303
    inbox.clock.advance(900 - 50 - 1)
    assert attempt(c, "fiona", SECRETS["fiona"]).status_code == 429
    inbox.clock.advance(1)  # the first failure has aged out: four left in the window
    assert attempt(c, "fiona", SECRETS["fiona"]).status_code == 303
    assert c.get("/").status_code == 200


def test_twenty_failures_from_one_address_lock_that_address(inbox: Inbox, counted: Counted) -> None:
    """Twenty failures from one client address, spread over many approver ids, refuse that
    address with 429 (no check); another address still signs in; after the window it may again."""
    spray = inbox.client(client=("10.0.0.66", 4000))
    for i in range(20):
        assert attempt(spray, f"guess{i % 10}", "wrong").status_code == 401
    assert counted.checks == 20
    r = attempt(spray, "fiona", SECRETS["fiona"])
    assert r.status_code == 429
    assert counted.checks == 20
    elsewhere = inbox.client(client=("10.0.0.7", 4000))
    assert attempt(elsewhere, "fiona", SECRETS["fiona"]).status_code == 303
    inbox.clock.advance(900)
    assert attempt(spray, "fiona", SECRETS["fiona"]).status_code == 303


def test_a_successful_sign_in_resets_the_approvers_counter(inbox: Inbox, counted: Counted) -> None:
    """After four failures and a success, fiona again has five attempts before the lock."""
    c = inbox.client()
    for _ in range(4):
        assert attempt(c, "fiona", "wrong").status_code == 401
    assert attempt(c, "fiona", SECRETS["fiona"]).status_code == 303
    for _ in range(5):  # without the reset the second of these would already be refused
        assert attempt(c, "fiona", "wrong").status_code == 401
    assert attempt(c, "fiona", SECRETS["fiona"]).status_code == 429
    assert counted.checks == 10


def test_limits_are_configurable(inbox: Inbox) -> None:
    """`create_app`'s login limits are honoured: with one failure allowed, the second attempt is 429."""
    inbox.app = create_app(
        inbox.gate, registry(), secret_key="k", login_failures_per_approver=1, login_window_seconds=60
    )
    c = inbox.client()
    assert attempt(c, "fiona", "wrong").status_code == 401
    r = attempt(c, "fiona", SECRETS["fiona"])
    assert (r.status_code, r.headers["retry-after"]) == (429, "60")
    inbox.clock.advance(60)
    assert attempt(c, "fiona", SECRETS["fiona"]).status_code == 303


def test_a_copied_cookie_stops_working_after_sign_out(inbox: Inbox) -> None:
    """Replaying a session cookie saved before sign-out redirects to /login, and an approve POST
    with it changes nothing."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    stolen = c.cookies[COOKIE]
    replay = inbox.client(cookies={COOKIE: stolen})
    assert replay.get("/").status_code == 200  # the copy works while the session is live
    assert c.post("/logout", data={"csrf": csrf}).headers["location"] == "/login"
    assert c.get("/").status_code == 303
    again = inbox.client(cookies={COOKIE: stolen})
    r = again.get("/")
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    before = snapshot(inbox)
    r = again.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert snapshot(inbox) == before
    assert inbox.store.all_decisions() == []
    assert inbox.shop.receiver.count("refund") == 0


@pytest.mark.parametrize("token", ["stale", "none", "wrong"])
def test_sign_out_ends_the_session_whatever_its_csrf_token(inbox: Inbox, token: str) -> None:
    """Signing out from a tab whose CSRF token is stale (opened before a re-sign-in), or with no
    or a wrong token, ends the session, as the sign-in page it lands on says: a forged sign-out
    can only sign out. A copy of the cookie stops working too, and nothing can be approved."""
    p = propose(inbox)
    c = inbox.client()
    old_tab = login(c, "fiona")
    assert c.post("/logout", data={"csrf": old_tab}).status_code == 303
    current = login(c, "fiona")
    copy = inbox.client(cookies={COOKIE: c.cookies[COOKIE]})
    data = {"stale": {"csrf": old_tab}, "none": {}, "wrong": {"csrf": "x" * 43}}[token]
    r = c.post("/logout", data=data)
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert c.get("/").status_code == 303
    assert copy.get("/").status_code == 303
    before = snapshot(inbox)
    r = copy.post(f"/approvals/{p.approval_id}/approve", data=form(p, current))
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert snapshot(inbox) == before


def test_signing_in_again_ends_the_previous_session(inbox: Inbox) -> None:
    """A new sign-in in the same browser replaces the session: the old cookie no longer works."""
    c = inbox.client()
    login(c, "fiona")
    old = c.cookies[COOKIE]
    login(c, "fiona")
    assert c.get("/").status_code == 200
    assert inbox.client(cookies={COOKIE: old}).get("/").status_code == 303


def test_sessions_expire_on_the_server_after_the_max_age(inbox: Inbox) -> None:
    """A session works until eight hours after sign-in and not after, whatever the cookie says."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    inbox.clock.advance(8 * 3600 - 1)
    assert c.get("/").status_code == 200
    inbox.clock.advance(1)
    r = c.get("/")
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    before = snapshot(inbox)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 303
    assert snapshot(inbox) == before


def test_sso_header_needs_no_session_and_sees_its_roles_cards(inbox: Inbox) -> None:
    """With a trusted proxy header the approver is signed in per request, without a login or a
    session, and the inbox lists only their role's cards."""
    p = propose(inbox)
    app = create_app(
        inbox.gate, registry(), secret_key="k", sso_header="X-Forwarded-User", sso_secret=SSO_SECRET
    )
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False, headers=FROM_PROXY)
    assert c.get("/").status_code == 303
    finance = c.get("/", headers={"X-Forwarded-User": "fiona"})
    assert finance.status_code == 200
    assert p.approval_id in finance.text
    support = c.get("/", headers={"X-Forwarded-User": "sam"})
    assert p.approval_id not in support.text
    csrf = csrf_of(finance.text)
    r = c.post(
        f"/approvals/{p.approval_id}/approve", data=form(p, csrf), headers={"X-Forwarded-User": "fiona"}
    )
    assert r.status_code == 200
    assert inbox.shop.receiver.count("refund") == 0  # no on_grant here: a grant, nothing run
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert row.status == "approved"
