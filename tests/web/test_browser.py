"""The inbox end to end in headless Chromium (Debian's), driven by Playwright.

A scripted agent proposes a refund; an approver signs in and approves in the browser; the
receiver counts exactly one refund. Refusals (an old tab's stale version, a form without its
CSRF token, the wrong role) change nothing. A screenshot of the inbox is saved as an artifact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser

from effectgate import Outcome, Pending
from effectgate.examples.shop import context
from effectgate.testing import Say, Script, Step, call, say

from .conftest import Inbox, sign_in

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
