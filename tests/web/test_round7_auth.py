"""Round 7: authentication and authorisation of the reviewer inbox. Who decides is asserted on
the recorded decisions and effects, not on page text."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from starlette.testclient import TestClient

from effectgate.web import ApproverRegistry, _auth, create_app, hash_secret

from .conftest import FROM_PROXY, SSO_SECRET, Inbox, csrf_of, form, propose, registry, sign_in, snapshot

SSO = "X-Remote-User"


def test_a_client_copy_of_the_sso_header_beside_the_proxys_names_no_one(inbox: Inbox) -> None:
    """A proxy that appends its SSO header (rather than replacing the client's) forwards the
    client's copy first: `X-Remote-User: fiona` typed by sam, then the proxy's `sam`. The inbox
    must not take the first value: two values name no one, and nothing is decided."""
    p = propose(inbox)  # a refund for finance: sam (support_lead) may not decide it, fiona may
    app = create_app(inbox.gate, registry(), secret_key="k", sso_header=SSO, sso_secret=SSO_SECRET)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    csrf = csrf_of(c.get("/login").text)
    before = snapshot(inbox)
    headers = [(SSO, "fiona"), (SSO, "sam"), *FROM_PROXY.items()]
    c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf), headers=headers)
    assert inbox.store.all_decisions() == []
    assert snapshot(inbox) == before
    # the proxy's single value still names its approver
    ok = c.get("/", headers=[(SSO, "fiona"), *FROM_PROXY.items()])
    assert ok.status_code == 200


@pytest.mark.parametrize("params", ["16348$8$1", "1048576$8$1", "16384$8$4096"])
def test_a_hash_with_parameters_hash_secret_never_writes_is_refused_at_load(
    tmp_path: Path, params: str
) -> None:
    """A mistyped N (not a power of two), one over scrypt's memory limit, or a cost far from the
    one every other id pays was loaded, then refused every sign-in of that approver as a wrong
    secret (and an id whose check does no scrypt work answers faster than an unknown one). The
    file is refused at load, naming the line, as the README promises for a malformed file."""
    good = hash_secret("a long secret").split("$")
    stored = "$".join(["scrypt", *params.split("$"), good[4], good[5]])
    path = tmp_path / "approvers.toml"
    path.write_text(f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{stored}"\n')
    with pytest.raises(ValueError, match=r"approvers\.toml:1:"):
        ApproverRegistry.from_toml(path)


def test_a_wrong_id_and_a_wrong_secret_derive_the_same_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: a wrong secret for a registered id, an unknown id and an id with no
    secret (SSO only) each run one scrypt derivation with the same parameters."""
    calls: list[tuple[int, int, int]] = []
    real = hashlib.scrypt

    def counting(password: bytes, **kw: Any) -> bytes:
        calls.append((kw["n"], kw["r"], kw["p"]))
        return real(password, **kw)

    monkeypatch.setattr(_auth.hashlib, "scrypt", counting)
    reg = registry()
    for approver_id in ("fiona", "nobody"):
        calls.clear()
        assert reg.check_secret(approver_id, "wrong") is None
        assert calls == [(2**14, 8, 1)], approver_id


def test_following_a_notification_link_from_another_site_keeps_the_reviewer_signed_in(
    inbox: Inbox, server: str, browser: Browser
) -> None:
    """Signed in, fiona follows the card link a notification carries from another site: she
    stays signed in (the inbox still opens for her), instead of being signed out by the visit."""
    p = propose(inbox)
    context = browser.new_context()
    try:
        page = context.new_page()
        sign_in(page, server, "fiona")
        link = f"{server}/approvals/{p.approval_id}"
        page.goto(f"data:text/html,<a id=go href='{link}'>the card</a>")  # another site
        page.click("#go")
        page.wait_for_load_state()
        page.goto(f"{server}/")
        assert page.url == f"{server}/"
    finally:
        context.close()
