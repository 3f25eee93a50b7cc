"""The inbox over the shop's gate, with registered approvers, for the ASGI client and the browser;
on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient

from effectgate import EffectGate, Grant, Keyring, Pending, open_store
from effectgate.examples.shop import Shop, app, context
from effectgate.outcomes import Executed
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

from . import browser as chromium

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

SECRETS = {"fiona": "fiona-pw", "frank": "frank-pw", "sam": "sam-pw", "pia": "pia-pw", "pete": "pete-pw"}
ROLES = {"fiona": "finance", "frank": "finance", "sam": "support_lead", "pia": "privacy", "pete": "privacy"}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
SSO_SECRET = "the proxy's shared secret"
#: What the fronting proxy adds to every request it forwards (an SSO header counts only beside it).
FROM_PROXY = {"X-Effectgate-Proxy-Secret": SSO_SECRET}


@functools.cache
def _hashed(secret: str) -> str:
    """Each secret hashed once per session: scrypt costs ~40 ms a call, five per registry."""
    return hash_secret(secret)


def registry() -> ApproverRegistry:
    return ApproverRegistry(
        RegisteredApprover(i, ROLES[i], _hashed(SECRETS[i]), name=i.title()) for i in SECRETS
    )


@dataclass
class Inbox:
    shop: Shop
    gate: EffectGate
    store: SQLStore
    clock: FakeClock
    app: Starlette
    executed: list[Executed] = field(default_factory=list)

    def client(self, **kwargs: Any) -> TestClient:
        return TestClient(self.app, base_url="http://127.0.0.1", follow_redirects=False, **kwargs)


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def login(client: TestClient, approver: str) -> str:
    """Sign `approver` in; returns the CSRF token of the signed-in session."""
    token = csrf_of(client.get("/login").text)
    r = client.post("/login", data={"csrf": token, "approver": approver, "secret": SECRETS[approver]})
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/").text)


def propose(inbox: Inbox, args: dict[str, Any] = REFUND, message: str = "m3", **ctx: Any) -> Pending:
    """The shop's agent proposes a refund (by default 120.00 GBP on order 1042)."""
    outcome = inbox.gate.call("refund_order", args, context(message, **ctx))
    assert isinstance(outcome, Pending), outcome
    return outcome


def snapshot(inbox: Inbox) -> Any:
    """Everything a refused request must leave unchanged: approvals, decisions, executions, effects."""
    store = inbox.store
    return (
        [(a.id, a.status, a.version, a.token_hash) for a in store.approvals()],
        [d.model_dump() for d in store.all_decisions()],
        [e.model_dump() for e in store.executions()],
        inbox.shop.receiver.effects,
    )


def form(p: Pending, csrf: str, **extra: Any) -> dict[str, Any]:
    """The approve/deny form fields for the version and arguments the reviewer saw."""
    return {"csrf": csrf, "version": p.version, "args_hash": p.card.args_hash, **extra}


@pytest.fixture
def inbox(store_url: str, clock: FakeClock) -> Iterator[Inbox]:
    """The shop's gate and its inbox on each backend (SQLite and PostgreSQL)."""
    store = open_store(store_url, clock=clock)
    store.setup()
    shop = Shop()
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop)
    parts = Inbox(shop, gate, store, clock, app=None)  # type: ignore[arg-type]

    def execute(grant: Grant) -> Executed:
        done = gate.execute(grant.token)
        parts.executed.append(done)
        return done

    parts.app = create_app(gate, registry(), secret_key="test-secret", on_grant=execute)
    try:
        yield parts
    finally:
        gate.close()
        store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's headless chromium, driven by Playwright (skips without it, fails under CI)."""
    from playwright.sync_api import sync_playwright

    path = chromium.ensure()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: the browser tests need Debian's chromium (apt-get install chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=chromium.ARGS)
        yield b
        b.close()


@pytest.fixture
def server(inbox: Inbox) -> Iterator[str]:
    """The inbox served by uvicorn on a free loopback port, in a thread."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(inbox.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(500):  # bounded wait for the socket, no sleep: the event's timeout paces it
        if srv.started:
            break
        started.wait(0.01)
    assert srv.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def sign_in(page: Page, base: str, approver: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=approver]", approver)
    page.fill("input[name=secret]", SECRETS[approver])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
