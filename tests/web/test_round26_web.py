"""Round 26: the reviewer inbox, on SQLite and PostgreSQL.

A call that ran (or was denied) whose status column was edited to a word that is no status at all
('on_hold', '') left the History page, which selected rows by that unsealed column: it was on no
page. A grant handed to `on_grant` (which the page then does not show) was shown after all
when the application's return value or error quoted its token. And a form's version was read
with `int()`, which also takes other scripts' digits, signs and spaces: a version no card writes
decided the call."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate import Grant
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot


def _edit_status(inbox: Inbox, approval_id: str, status: str) -> None:
    """The approval's status column edited in the database, behind effectgate's back."""
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :v WHERE id = :i"), {"v": status, "i": approval_id}
        )


@pytest.mark.parametrize("column", ["on_hold"])
@pytest.mark.parametrize("decision", ["deny", "approve"])
def test_a_decided_call_edited_to_no_status_stays_in_the_history(
    inbox: Inbox, decision: str, column: str
) -> None:
    """A refund denied (or approved and run), its status column then edited to a word that is
    neither 'pending' nor a decided status: it is listed in the history as what the ledger says,
    flagged as not what its column says, and the page changes nothing."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert (
        c.post(f"/approvals/{p.approval_id}/{decision}", data=form(p, csrf, reason="no")).status_code == 200
    )
    _edit_status(inbox, p.approval_id, column)
    before = snapshot(inbox)
    page = c.get("/history").text
    shown = "denied" if decision == "deny" else "executed"
    assert f'{shown} <span class="badge warned" data-status-edited="{p.approval_id}"' in page
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == (1 if decision == "approve" else 0)


@pytest.mark.parametrize("how", ["returns", "raises"])
def test_a_grant_handed_to_on_grant_never_shows_its_token(inbox: Inbox, how: str) -> None:
    """`on_grant` runs the refund and then returns (or raises with) text quoting the grant's
    token, as an agent runtime's reply or error may: the page says what happened with the token
    written as <grant token>, and the refund ran once."""
    tokens: list[str] = []

    def on_grant(grant: Grant) -> Any:
        tokens.append(grant.token)
        inbox.gate.execute(grant.token)
        if how == "raises":
            raise ConnectionError(f"POST /resume?grant={grant.token} failed")
        return {"resumed_with": grant.token}

    app = create_app(inbox.gate, registry(), secret_key="k", on_grant=on_grant)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    p = propose(inbox)
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    [token] = tokens
    assert token not in r.text
    assert "&lt;grant token&gt;" in r.text
    assert inbox.shop.receiver.count("refund") == 1


@pytest.mark.parametrize(
    ("action", "version"), [("approve", "\u0661"), ("approve", "+1"), ("deny", "\uff11 ")]
)
def test_a_version_a_card_never_writes_is_refused(inbox: Inbox, action: str, version: str) -> None:
    """Version 1 waits; a form names it as an Arabic-Indic or fullwidth one, with a sign, a space
    or an underscore: refused (400) before the gate is asked, and nothing is decided or run."""
    p = propose(inbox)
    assert p.version == 1
    c = inbox.client()
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/{action}", data=form(p, csrf, version=version, reason="no"))
    assert r.status_code == 400
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0
