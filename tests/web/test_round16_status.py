"""Round 16: the status a page shows is what the executions and sealed decisions say, on SQLite
and PostgreSQL. The status column is not sealed: a card showed it as stored, and the history
showed a claimed run or denial that nothing recorded, unflagged."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate import Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.examples.shop import app, context
from effectgate.redact import redact
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot


def _edit_status(inbox: Inbox, approval_id: str, status: str) -> None:
    """The approval's status column edited in the database, behind effectgate's back."""
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :v WHERE id = :i"), {"v": status, "i": approval_id}
        )


def _card_badge(html: str) -> str:
    """The status badge of a card page (the third badge of its heading)."""
    heading = re.search(r"<h2>(.*?)</h2>", html, re.S)
    assert heading, html
    return re.findall(r'<span class="badge">([^<]*)</span>', heading.group(1))[2]


def test_a_refund_that_ran_edited_to_denied_shows_executed_on_its_card(inbox: Inbox) -> None:
    """A refund that ran keeps showing as executed on its card, flagged, whatever its column says."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    _edit_status(inbox, p.approval_id, "denied")
    before = snapshot(inbox)
    page = c.get(f"/approvals/{p.approval_id}").text
    assert _card_badge(page) == "executed"
    assert 'id="status-edited"' in page
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 1


@pytest.mark.parametrize("claimed", ["executed", "failed", "denied"])
def test_a_claimed_run_or_denial_nothing_recorded_is_flagged(inbox: Inbox, claimed: str) -> None:
    """A pending refund whose column was edited to say it ran (or failed, or was denied) with no
    execution and no sealed denial recorded: the history and its card show it as pending, flagged
    as edited, never as a refund that was paid or refused."""
    p = propose(inbox)
    c = inbox.client()
    login(c, "fiona")
    _edit_status(inbox, p.approval_id, claimed)
    before = snapshot(inbox)
    history = c.get("/history").text
    assert f'pending <span class="badge warned" data-status-edited="{p.approval_id}"' in history
    card = c.get(f"/approvals/{p.approval_id}").text
    assert _card_badge(card) == "pending"
    assert 'id="status-edited"' in card
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_a_decided_card_as_recorded_is_not_flagged(inbox: Inbox, decision: str) -> None:
    """A decision left as recorded: the card shows its column, with no edit flag."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/{decision}", data=form(p, csrf, reason="no"))
    assert r.status_code == 200
    card = c.get(f"/approvals/{p.approval_id}").text
    assert _card_badge(card) == ("executed" if decision == "approve" else "denied")
    assert 'id="status-edited"' not in card
    assert "data-status-edited" not in c.get("/history").text


class Declined(Exception):
    """The provider's definite "no"."""


def test_a_definite_failure_as_recorded_is_not_flagged(inbox: Inbox) -> None:
    """A payment the provider declined ends failed, and its card and history say so, unflagged."""

    def pay(payee: str) -> dict[str, Any]:
        """Pay someone."""
        raise Declined(f"declined for {payee}")

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", definite_failures=(Declined,)
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        p = gate.call("pay", {"payee": "acme"}, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
        assert inbox.store.get_approval(p.approval_id).status == "failed"  # type: ignore[union-attr]
        card = c.get(f"/approvals/{p.approval_id}").text
        assert _card_badge(card) == "failed"
        assert 'id="status-edited"' not in card
        assert "data-status-edited" not in c.get("/history").text
    finally:
        gate.close()


def test_a_denial_under_another_keyring_is_not_called_an_edit(inbox: Inbox) -> None:
    """An inbox served with another keyring than the ledger's cannot check the sealed denial: a
    denied card stays shown as denied (flagged as not verifying), never accused of an edit."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="no")).status_code == 200
    other = app(inbox.store, keyring=Keyring.generate(), clock=inbox.clock, shop=inbox.shop)
    try:
        served = TestClient(
            create_app(other, registry(), secret_key="k"), base_url="http://127.0.0.1", follow_redirects=False
        )
        login(served, "fiona")
        card = served.get(f"/approvals/{p.approval_id}").text
        assert _card_badge(card) == "denied"
        assert 'id="status-edited"' not in card
        history = served.get("/history").text
        assert f'data-unverified="{p.approval_id}"' in history
        assert "data-status-edited" not in history
    finally:
        other.close()


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_a_decided_call_whose_user_was_erased_is_not_flagged(inbox: Inbox, decision: str) -> None:
    """A decided refund whose user's personal values were erased keeps its status, unflagged."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/{decision}", data=form(p, csrf, reason="no"))
    assert r.status_code == 200
    redact(inbox.store, inbox.gate.keyring, user_id="u1", by="dpo", reason="erasure")
    card = c.get(f"/approvals/{p.approval_id}").text
    assert _card_badge(card) == ("executed" if decision == "approve" else "denied")
    assert 'id="status-edited"' not in card
    assert "data-status-edited" not in c.get("/history").text
