"""Round 14 of the review of the inbox's guard and history, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot

# What an operator may well choose: 16+ characters, one of them not ASCII.
UMLAUT_SECRET = "ein Geheimnis für den Proxy, lang genug"


def _edit_status(inbox: Inbox, approval_id: str, status: str) -> None:
    """The approval's status column edited in the database, behind effectgate's back."""
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :v WHERE id = :i"), {"v": status, "i": approval_id}
        )


def test_a_proxy_secret_with_a_non_ascii_character_is_honoured(inbox: Inbox) -> None:
    """The proxy sends its shared secret as UTF-8 bytes; the server decodes header bytes as
    Latin-1, and the check then encoded that text as UTF-8 again: a secret with an umlaut never
    matched, so the SSO header named no one and the approver could not decide anything. The
    header's bytes are compared with the secret's: the approval is decided and runs once."""
    p = propose(inbox)
    app = create_app(
        inbox.gate,
        registry(),
        secret_key="k",
        sso_header="X-Remote-User",
        sso_secret=UMLAUT_SECRET,
        on_grant=lambda grant: inbox.gate.execute(grant.token),
    )
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    headers = {"X-Remote-User": b"fiona", "X-Effectgate-Proxy-Secret": UMLAUT_SECRET.encode()}
    page = c.get("/", headers=headers)
    assert page.status_code == 200
    csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf), headers=headers)
    assert r.status_code == 200
    [approval] = inbox.store.approvals()
    assert approval.status == "executed"
    assert inbox.shop.receiver.count("refund") == 1
    # another secret still names no one
    wrong = {"X-Remote-User": b"fiona", "X-Effectgate-Proxy-Secret": UMLAUT_SECRET.replace("ü", "u").encode()}
    assert c.get("/", headers=wrong).status_code == 303


@pytest.mark.parametrize("pattern", ["*example.com", "in*box.example.com", "**.example.com"])
def test_a_malformed_host_wildcard_is_a_value_error(inbox: Inbox, pattern: str) -> None:
    """A wildcard that is not `*.example.com` reached Starlette's `assert`: an AssertionError
    traceback, and under `python -O` (asserts stripped) "*example.com" served
    "rebind-attacker-example.com" too, the DNS-rebinding guard gone. It is a ValueError at creation."""
    with pytest.raises(ValueError, match=r"\*\.example\.com"):
        create_app(inbox.gate, registry(), secret_key="k", allowed_hosts=["localhost", pattern])


def test_a_malformed_host_wildcard_is_refused_under_python_o() -> None:
    """Under `python -O` the malformed wildcard is refused as well, never served as a suffix."""
    code = (
        "from effectgate import Keyring, open_store\n"
        "from effectgate.examples.shop import app\n"
        "from effectgate.web import create_app, ApproverRegistry\n"
        "s = open_store('sqlite://'); s.setup()\n"
        "g = app(s, keyring=Keyring.generate())\n"
        "try:\n"
        "    a = create_app(g, ApproverRegistry(), secret_key='k', allowed_hosts=['*example.com'])\n"
        "except ValueError:\n"
        "    print('refused')\n"
        "else:\n"
        "    from starlette.testclient import TestClient\n"
        "    r = TestClient(a, base_url='http://evilexample.com').get('/login')\n"
        "    print('served' if r.status_code == 200 else 'not served')\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "refused", out.stderr


@pytest.mark.parametrize("decision", ["deny", "approve"])
def test_a_decided_call_edited_back_to_pending_stays_in_the_history(inbox: Inbox, decision: str) -> None:
    """A refund denied (or approved and run), its status column then edited back to 'pending':
    the inbox rightly does not offer it (the sealed decision, the executions say it was decided),
    and the History page selected rows by that unsealed column, so the record vanished from every
    page. It is listed in the history, flagged as not what its status column says."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/{decision}", data=form(p, csrf, reason="no"))
    assert r.status_code == 200
    _edit_status(inbox, p.approval_id, "pending")
    before = snapshot(inbox)
    page = c.get("/history").text
    assert f'href="/approvals/{p.approval_id}"' in page
    shown = "denied" if decision == "deny" else "executed"  # what the ledger says, not the column
    assert f'{shown} <span class="badge warned" data-status-edited="{p.approval_id}"' in page
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == (1 if decision == "approve" else 0)
