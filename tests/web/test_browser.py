"""The inbox end to end in headless Chromium (Debian's), driven by Playwright.

A scripted agent proposes a refund; an approver signs in and approves in the browser; the
receiver counts exactly one refund. Refusals (an old tab's stale version, a form without its
CSRF token, the wrong role) change nothing. A screenshot of the inbox is saved as an artifact.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright

from effectgate import Outcome, Pending
from effectgate.examples.shop import context
from effectgate.testing import Say, Script, Step, call, say

from . import browser as chromium
from .conftest import SECRETS, Inbox

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
ARTIFACTS = Path(os.environ.get("EFFECTGATE_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts"))


def agent_turn(inbox: Inbox, script: Script, message_id: str) -> list[Outcome]:
    """Drive the scripted agent for one user message through the gate."""
    outcomes: list[Outcome] = []
    while script.remaining:
        turn = script.next_turn(outcomes[-1].for_model() if outcomes else None)
        if isinstance(turn, Say):
            continue
        assert isinstance(turn, Step)
        outcomes += inbox.gate.call_step([(c.name, c.args, c.id) for c in turn.calls], context(message_id))
    script.assert_complete()
    return outcomes


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
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


def decisions(inbox: Inbox) -> list[Any]:
    return [(d.approver_id, d.decision) for d in inbox.store.all_decisions()]


def test_refund_is_approved_in_the_browser_and_lands_once(
    inbox: Inbox, server: str, browser: Browser
) -> None:
    """The scripted agent's refund appears in the inbox; fiona approves it in the browser; the
    provider receives exactly one refund and the approval is executed."""
    [pending] = agent_turn(inbox, Script([call("refund_order", **REFUND), say("Waiting.")]), "m3")
    assert isinstance(pending, Pending)
    page = browser.new_page(viewport={"width": 1100, "height": 640})
    sign_in(page, server, "fiona")
    card = page.locator(f"[data-approval='{pending.approval_id}']")
    assert card.count() == 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inbox.png"), full_page=True)
    card.get_by_role("link", name="Review").click()
    assert pending.card.args_hash in page.content()
    page.screenshot(path=str(ARTIFACTS / "card.png"), full_page=True)
    page.get_by_role("button", name="Approve version 1").click()
    assert "single-use grant was minted" in page.locator("[role=status]").inner_text()
    assert inbox.shop.receiver.count("refund", order_id="1042") == 1
    row = inbox.store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "executed"
    assert decisions(inbox) == [("fiona", "approve")]
    page.close()


def test_stale_version_from_an_old_tab_is_refused(inbox: Inbox, server: str, browser: Browser) -> None:
    """A card opened at version 1, amended to version 2 meanwhile, cannot be approved from the old
    tab; nothing is decided or refunded."""
    [pending] = agent_turn(inbox, Script([call("refund_order", **REFUND), say("Waiting.")]), "m3")
    assert isinstance(pending, Pending)
    page = browser.new_page()
    sign_in(page, server, "fiona")
    page.goto(f"{server}/approvals/{pending.approval_id}")
    [amended] = agent_turn(
        inbox, Script([call("refund_order", order_id="1042", amount=6000, currency="GBP"), say("ok")]), "m5"
    )
    assert isinstance(amended, Pending)
    assert amended.version == 2
    page.get_by_role("button", name="Approve version 1").click()
    assert "Stale card" in page.content()
    assert decisions(inbox) == []
    assert inbox.shop.receiver.count("refund") == 0
    page.close()


def test_post_without_csrf_token_is_refused(inbox: Inbox, server: str, browser: Browser) -> None:
    """The approve form with its CSRF field removed is refused with 403; nothing changes."""
    [pending] = agent_turn(inbox, Script([call("refund_order", **REFUND), say("Waiting.")]), "m3")
    assert isinstance(pending, Pending)
    ctx = browser.new_context(bypass_csp=True)  # the page forbids scripts; the test removes a field
    page = ctx.new_page()
    sign_in(page, server, "fiona")
    page.goto(f"{server}/approvals/{pending.approval_id}")
    page.locator("input[name=csrf]").evaluate_all("els => els.forEach(e => e.remove())")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.get_by_role("button", name="Approve version 1").click()
    assert answer.value.status == 403
    assert decisions(inbox) == []
    assert inbox.shop.receiver.count("refund") == 0
    ctx.close()


def test_wrong_role_cannot_approve(inbox: Inbox, server: str, browser: Browser) -> None:
    """A support lead sees the refund only read-only (no approve button, not in their inbox), and
    an approve request forged from their session is refused; nothing changes."""
    [pending] = agent_turn(inbox, Script([call("refund_order", **REFUND), say("Waiting.")]), "m3")
    assert isinstance(pending, Pending)
    page = browser.new_page()
    sign_in(page, server, "sam")
    assert page.locator(f"[data-approval='{pending.approval_id}']").count() == 0
    page.goto(f"{server}/?all=1")
    assert page.locator(f"[data-approval='{pending.approval_id}'][data-read-only='1']").count() == 1
    page.goto(f"{server}/approvals/{pending.approval_id}")
    assert page.get_by_role("button", name="Approve version 1").count() == 0
    assert "Read-only" in page.locator("#read-only").inner_text()
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    assert csrf
    form = {"csrf": csrf, "version": "1", "args_hash": pending.card.args_hash}
    answer = page.request.post(f"{server}/approvals/{pending.approval_id}/approve", form=form)
    assert answer.status == 403
    assert "Not yours to decide" in answer.text()
    assert decisions(inbox) == []
    assert inbox.shop.receiver.count("refund") == 0
    page.close()
