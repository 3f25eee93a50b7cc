"""Round 9: `effectgate serve` follows its approvers file. Revoking an approver (removing them,
or giving them another role) in approvers.toml takes effect on their next request, without a
restart; a file that no longer loads refuses everyone until it is fixed, never falling back to
the list it replaced (which would keep the revoked approver). Asserted on the recorded decisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.testclient import TestClient

from effectgate import Keyring, Pending, open_store
from effectgate.cli import main
from effectgate.cli._store import keyring_for
from effectgate.examples.shop import app, context
from effectgate.web import hash_secret

from .conftest import REFUND, SECRETS, Inbox, csrf_of, login, propose, snapshot
from .serving import free_port

APP = "effectgate.examples.shop:app"


HASHES = {a: hash_secret(secret) for a, secret in SECRETS.items()}  # each approver's one secret


def entries(**roles: str) -> str:
    return "".join(
        f'[[approver]]\nid = "{a}"\nrole = "{role}"\nsecret = "{HASHES[a]}"\n\n' for a, role in roles.items()
    )


class Served:
    """`effectgate serve` on a fresh SQLite ledger (uvicorn.run patched: nothing listens)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db = f"sqlite:///{tmp_path}/eg.db"
        assert main(["--db", self.db, "setup"]) == 0
        self.file = tmp_path / "approvers.toml"
        self.file.write_text(entries(fiona="finance", frank="finance"))
        ran: dict[str, Any] = {}
        monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(app=app))
        argv = ["--db", self.db, "serve", "--app", APP, "--approvers", str(self.file)]
        assert main([*argv, "--port", str(free_port())]) == 0
        self.app = ran["app"]
        self.keyring: Keyring = keyring_for(self.db, create=False)

    def client(self) -> TestClient:
        return TestClient(self.app, base_url="http://127.0.0.1", follow_redirects=False)

    def sign_in(self, c: TestClient, approver: str) -> int:
        csrf = csrf_of(c.get("/login").text)
        data = {"csrf": csrf, "approver": approver, "secret": SECRETS[approver]}
        return c.post("/login", data=data).status_code

    def propose(self) -> Pending:
        with open_store(self.db) as store:
            gate = app(store, keyring=self.keyring)
            outcome = gate.call("refund_order", REFUND, context("m1"))
            gate.close()
        assert isinstance(outcome, Pending), outcome
        return outcome

    def approve(self, c: TestClient, p: Pending) -> None:
        csrf = csrf_of(c.get("/login").text)
        data = {"csrf": csrf, "version": p.version, "args_hash": p.card.args_hash}
        c.post(f"/approvals/{p.approval_id}/approve", data=data)

    def decided(self, p: Pending) -> list[tuple[str, str]]:
        with open_store(self.db) as store:
            [row] = [a for a in store.approvals() if a.id == p.approval_id]
            decisions = [(d.approver_id, d.role) for d in store.all_decisions()]
        return [("status", row.status), *decisions]


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Served:
    return Served(tmp_path, monkeypatch)


def test_an_approver_removed_from_the_file_stops_deciding_without_a_restart(served: Served) -> None:
    """fiona is signed in; the operator removes her from approvers.toml. Her open session can no
    longer approve the refund, and she cannot sign in again; the approvers the file now lists can."""
    p = served.propose()
    fiona = served.client()
    assert served.sign_in(fiona, "fiona") == 303
    served.file.write_text(entries(frank="finance", pia="privacy"))
    served.approve(fiona, p)
    assert served.decided(p) == [("status", "pending")]
    assert served.sign_in(served.client(), "fiona") == 401
    assert served.sign_in(served.client(), "pia") == 303  # an approver added: no restart either
    # put back with the same secret, fiona signs in afresh: the session seen revoked stays ended
    served.file.write_text(entries(fiona="finance", frank="finance"))
    served.approve(fiona, p)
    assert served.decided(p) == [("status", "pending")]


def test_an_approver_given_another_role_decides_only_as_that_role(served: Served) -> None:
    """fiona moves from finance to support: her open session no longer approves a refund that
    needs finance, and nothing is recorded in the role she lost."""
    p = served.propose()
    fiona = served.client()
    assert served.sign_in(fiona, "fiona") == 303
    served.file.write_text(entries(fiona="support_lead", frank="finance"))
    served.approve(fiona, p)
    assert served.decided(p) == [("status", "pending")]


def test_a_file_that_no_longer_loads_refuses_everyone_until_it_is_fixed(served: Served) -> None:
    """An edit that breaks the file (here while removing fiona) must not leave the old list in
    force: no one signs in or decides until the file loads again, and then the new list holds
    (the refused sign-ins meanwhile did not lock anyone out)."""
    p = served.propose()
    fiona = served.client()
    assert served.sign_in(fiona, "fiona") == 303
    served.file.write_text(entries(frank="finance") + '[[approver]]\nid = "fiona"\n')  # no role
    served.approve(fiona, p)
    assert served.decided(p) == [("status", "pending")]
    refused = served.client()
    csrf = csrf_of(refused.get("/login").text)
    for _ in range(6):  # more than the per-approver limit: none counts as a failed guess
        r = refused.post("/login", data={"csrf": csrf, "approver": "frank", "secret": SECRETS["frank"]})
        assert r.status_code == 503
    assert "approvers file" in r.text
    served.file.write_text(entries(frank="finance"))
    assert served.sign_in(served.client(), "fiona") == 401
    frank = served.client()
    assert served.sign_in(frank, "frank") == 303
    served.approve(frank, p)
    assert served.decided(p) == [("status", "approved"), ("frank", "finance")]


def test_a_new_secret_for_an_approver_ends_the_sessions_signed_in_with_the_old_one(
    served: Served,
) -> None:
    """fiona's secret leaked and someone signed in with it; the operator writes her a new one.
    The session signed in with the old secret no longer decides; fiona signs in with the new one."""
    p = served.propose()
    thief = served.client()
    assert served.sign_in(thief, "fiona") == 303
    text = served.file.read_text().replace(hash_secret_of(served.file.read_text(), "fiona"), NEW_FIONA)
    served.file.write_text(text)
    served.approve(thief, p)
    assert served.decided(p) == [("status", "pending")]
    fiona = served.client()
    csrf = csrf_of(fiona.get("/login").text)
    r = fiona.post("/login", data={"csrf": csrf, "approver": "fiona", "secret": "fiona's new secret"})
    assert r.status_code == 303
    served.approve(fiona, p)
    assert served.decided(p) == [("status", "approved"), ("fiona", "finance")]


NEW_FIONA = hash_secret("fiona's new secret")


def hash_secret_of(text: str, approver: str) -> str:
    """The secret hash of `approver`'s entry in an approvers file's text."""
    entry = text.split(f'id = "{approver}"', 1)[1]
    return entry.split('secret = "', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("field", ["reason", "version", "args_hash"])
def test_a_file_upload_in_place_of_a_form_field_decides_nothing(inbox: Inbox, field: str) -> None:
    """A deny posted as multipart with the reason sent as a file recorded the denial with the
    reason `UploadFile(filename='r.txt', ...)`, which the model is then told. A file where a
    field's text belongs is refused with 400, and nothing is recorded."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    fields = {"csrf": csrf, "version": str(p.version), "args_hash": p.card.args_hash, "reason": "no"}
    parts: dict[str, Any] = {k: (None, v) for k, v in fields.items()}
    parts[field] = ("r.txt", fields[field].encode())
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/deny", files=parts)
    assert r.status_code == 400
    assert inbox.store.all_decisions() == []
    assert snapshot(inbox) == before
