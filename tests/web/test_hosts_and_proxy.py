"""Who may reach the inbox and speak for an approver: only allowed Host names are served (a page
on another name re-pointed at 127.0.0.1 by DNS rebinding gets nothing), an SSO header counts only
beside the proxy's shared secret, and `effectgate serve` believes X-Forwarded-For from no one
unless told which proxy to trust (else any local client escapes the per-client sign-in limit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from effectgate.cli import main
from effectgate.web import create_app, hash_secret

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
from .serving import free_port, login_page

ROOT = Path(__file__).resolve().parents[2]
APP = "effectgate.examples.shop:app"


def test_a_page_under_another_host_name_gets_nothing(inbox: Inbox) -> None:
    """A request for a name that is not the inbox's (a rebinding attacker's page) is refused with
    400 before any page: no sign-in form, no CSRF token, no decision."""
    p = propose(inbox)
    signed_in = inbox.client()
    csrf = login(signed_in, "fiona")
    before = snapshot(inbox)
    rebound = TestClient(inbox.app, base_url="http://rebind.attacker.example:8765", follow_redirects=False)
    r = rebound.get("/login")
    assert r.status_code == 400
    assert 'name="csrf"' not in r.text
    assert rebound.get("/").status_code == 400
    assert rebound.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 400
    assert snapshot(inbox) == before


@pytest.mark.parametrize("base", ["http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"])
def test_the_loopback_names_are_served(inbox: Inbox, base: str) -> None:
    """By default the inbox answers under the loopback names, with or without a port."""
    c = TestClient(inbox.app, base_url=base, follow_redirects=False)
    assert c.get("/login").status_code == 200


def test_allowed_hosts_names_the_hosts_served(inbox: Inbox) -> None:
    """`allowed_hosts` replaces the loopback names: the proxy's name is served, others are not."""
    app = create_app(inbox.gate, registry(), secret_key="k", allowed_hosts=["inbox.example.com", "::1"])
    assert TestClient(app, base_url="https://inbox.example.com").get("/login").status_code == 200
    assert TestClient(app, base_url="http://[::1]:8765").get("/login").status_code == 200
    assert TestClient(app, base_url="http://127.0.0.1").get("/login").status_code == 400


def test_an_sso_header_without_the_proxy_secret_names_no_one(inbox: Inbox) -> None:
    """A local process that sets the SSO header itself (no secret, or a wrong one) is not signed
    in and cannot approve; the same header beside the proxy's secret is honoured."""
    p = propose(inbox)
    app = create_app(
        inbox.gate, registry(), secret_key="k", sso_header="X-Remote-User", sso_secret=SSO_SECRET
    )
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    before = snapshot(inbox)
    for extra in ({}, {"X-Effectgate-Proxy-Secret": "guess"}, {"X-Effectgate-Proxy-Secret": ""}):
        headers = {"X-Remote-User": "fiona", **extra}
        assert c.get("/", headers=headers).status_code == 303
        csrf = csrf_of(c.get("/login").text)
        r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf), headers=headers)
        assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert snapshot(inbox) == before
    page = c.get("/", headers={"X-Remote-User": "fiona", **FROM_PROXY})
    assert page.status_code == 200
    assert p.approval_id in page.text


@pytest.mark.parametrize("secret", [None, "", "short"])
def test_create_app_refuses_an_sso_header_without_a_proxy_secret(inbox: Inbox, secret: str | None) -> None:
    """An SSO header with no shared secret (or one under 16 characters) is refused at creation."""
    with pytest.raises(ValueError, match="sso_header needs sso_secret"):
        create_app(inbox.gate, registry(), secret_key="k", sso_header="X-Remote-User", sso_secret=secret)


# -- `effectgate serve`


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, Any]]:
    """The argv start of `effectgate serve` on a fresh ledger, and what it hands to uvicorn.run
    (patched: nothing listens)."""
    db = f"sqlite:///{tmp_path}/eg.db"
    assert main(["--db", db, "setup"]) == 0
    approvers = tmp_path / "approvers.toml"
    approvers.write_text(
        f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{hash_secret(SECRETS["fiona"])}"\n'
    )
    ran: dict[str, Any] = {}

    def run(app: Any, **options: Any) -> None:
        ran.update(options, app=app)

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.delenv("EFFECTGATE_SSO_SECRET", raising=False)
    return ["--db", db, "serve", "--app", APP, "--approvers", str(approvers), "--port", str(free_port())], ran


def test_serve_with_sso_header_needs_the_proxy_secret(
    served: tuple[list[str], dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`serve --sso-header` without EFFECTGATE_SSO_SECRET (or with a short one) exits 2 naming
    it, before it listens; with it, the header is honoured only beside the secret."""
    argv, ran = served
    capsys.readouterr()
    assert main([*argv, "--sso-header", "X-Remote-User"]) == 2
    assert "EFFECTGATE_SSO_SECRET" in capsys.readouterr().err
    monkeypatch.setenv("EFFECTGATE_SSO_SECRET", "short")
    assert main([*argv, "--sso-header", "X-Remote-User"]) == 2
    assert ran == {}
    monkeypatch.setenv("EFFECTGATE_SSO_SECRET", SSO_SECRET)
    assert main([*argv, "--sso-header", "X-Remote-User"]) == 0
    c = TestClient(ran["app"], base_url="http://127.0.0.1", follow_redirects=False)
    assert c.get("/", headers={"X-Remote-User": "fiona"}).status_code == 303
    assert c.get("/", headers={"X-Remote-User": "fiona", **FROM_PROXY}).status_code == 200


def test_serve_answers_its_own_names_and_allowed_hosts_only(served: tuple[list[str], dict[str, Any]]) -> None:
    """`serve` answers the bind address, the loopback names and each --allowed-host; any other
    Host gets 400."""
    argv, ran = served
    extra = ["--allowed-host", "inbox.example.com", "--allowed-host", "*.corp.example"]
    assert main([*argv, "--host", "127.0.0.2", *extra]) == 0
    for name, status in [
        ("127.0.0.2:8765", 200),
        ("localhost:8765", 200),
        ("[::1]:8765", 200),
        ("inbox.example.com", 200),
        ("a.corp.example", 200),
        ("rebind.attacker.example:8765", 400),
        ("127.0.0.2.nip.io", 400),
    ]:
        c = TestClient(ran["app"], base_url=f"http://{name}")
        assert c.get("/login").status_code == status, name


@pytest.mark.parametrize(
    "bad", ["*", "inbox.example.com:443", "http://inbox.example.com", "a*.example.com", ""]
)
def test_serve_refuses_a_malformed_allowed_host(
    served: tuple[list[str], dict[str, Any]], capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    """A wildcard for every name, a port, a scheme or a misplaced * is a usage error (exit 2)."""
    argv, ran = served
    capsys.readouterr()
    assert main([*argv, "--allowed-host", bad]) == 2
    assert "--allowed-host" in capsys.readouterr().err
    assert ran == {}


def test_serve_believes_forwarded_addresses_only_from_a_trusted_proxy(
    served: tuple[list[str], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --trusted-proxy uvicorn's proxy headers are off; with it they are believed from
    that address only. A malformed address is a usage error."""
    argv, ran = served
    assert main(argv) == 0
    assert ran["proxy_headers"] is False
    assert "forwarded_allow_ips" not in ran
    ran.clear()
    assert main([*argv, "--trusted-proxy", "10.0.0.7", "--trusted-proxy", "192.168.0.0/16"]) == 0
    assert (ran["proxy_headers"], ran["forwarded_allow_ips"]) == (True, ["10.0.0.7/32", "192.168.0.0/16"])
    ran.clear()
    capsys.readouterr()
    assert main([*argv, "--trusted-proxy", "*"]) == 2
    assert "--trusted-proxy" in capsys.readouterr().err
    assert ran == {}


def test_a_forwarded_for_header_does_not_escape_the_per_client_limit(tmp_path: Path) -> None:
    """Against the real `effectgate serve`: 20 wrong sign-ins from 127.0.0.1, each claiming
    another address in X-Forwarded-For, still lock 127.0.0.1 out (the 21st gets 429)."""
    db = f"sqlite:///{tmp_path}/eg.db"
    assert main(["--db", db, "setup"]) == 0
    approvers = tmp_path / "approvers.toml"
    approvers.write_text(f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{hash_secret("pw")}"\n')
    port = free_port()
    command = [sys.executable, "-m", "effectgate.cli", "--db", db, "serve", "--app", APP]
    command += ["--approvers", str(approvers), "--port", str(port)]
    env = {**os.environ, "EFFECTGATE_WEB_SECRET": "s" * 32}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        first = login_page(base, proc)
        token = re.search(r'name="csrf" value="([^"]+)"', first.text)
        assert token
        codes = []
        with httpx.Client(base_url=base, cookies=first.cookies) as c:
            for i in range(21):
                data = {"csrf": token.group(1), "approver": f"guess{i}", "secret": "wrong"}
                r = c.post("/login", data=data, headers={"X-Forwarded-For": f"203.0.113.{i}"})
                codes.append(r.status_code)
        assert codes == [401] * 20 + [429]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
