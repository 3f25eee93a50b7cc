"""Cards show exactly what will run: the gate's warnings beside the values (text that is not what
it looks like, a record that does not verify), why an approval failed or was denied, and every
model-written value escaped."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import sqlalchemy as sa
from markupsafe import escape
from starlette.testclient import TestClient

from effectgate import Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate._display import keyring_warnings
from effectgate._seal import mismatch
from effectgate.errors import ForeignSeal
from effectgate.examples.shop import app, context
from effectgate.outcomes import TAMPERED_WARNING
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot

BIDI = "ada@exa\u202eelpmax.com"  # shows as "ada@example.com" but is not
ZWSP = "bob\u200b@example.com"
CYRILLIC = "ada@ex\u0430mple.com"  # a Cyrillic "а"
SCRIPT = '<script>alert(1)</script><form action="/approvals/x/approve">'


def hostile_email(inbox: Inbox) -> Pending:
    """The agent proposes an email whose recipients hide characters and whose body is markup."""
    args = {"to": [BIDI, ZWSP, CYRILLIC], "subject": "Your <b>refund</b>", "body": SCRIPT}
    p = inbox.gate.call("send_email", args, context("m7"))
    assert isinstance(p, Pending), p
    return p


def test_card_page_shows_each_warning_escaped_beside_the_arguments(inbox: Inbox) -> None:
    """The card lists every warning the gate found (bidi override, zero-width space, mixed
    scripts), escaped, before the arguments, shows where the hidden characters are, and renders
    the markup in the arguments as text; viewing changes nothing."""
    p = hostile_email(inbox)
    warnings = inbox.gate.card(p.approval_id).warnings
    assert any("U+202E RIGHT-TO-LEFT OVERRIDE" in w for w in warnings)
    assert any("U+200B ZERO WIDTH SPACE" in w for w in warnings)
    assert any("mixed scripts (CYRILLIC, LATIN)" in w for w in warnings)
    c = inbox.client()
    login(c, "sam")
    before = snapshot(inbox)
    html = c.get(f"/approvals/{p.approval_id}").text
    assert 'id="warnings" role="alert"' in html
    assert f"{len(warnings)} warnings" in html
    for w in warnings:
        assert f"<li>{escape(w)}</li>" in html, w
    assert html.index('id="warnings"') < html.index("arguments (stored)")
    assert "&lt;U+202E&gt;" in html  # the revealed form of the recipient
    assert "&lt;U+200B&gt;" in html
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>refund</b>" not in html
    assert 'action="/approvals/x/approve"' not in html
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("email") == 0


def test_inbox_list_marks_cards_with_warnings(inbox: Inbox) -> None:
    """In the inbox the hostile email carries a warning count and its warnings; a clean refund
    card carries none."""
    p = hostile_email(inbox)
    clean = propose(inbox)
    warnings = inbox.gate.card(p.approval_id).warnings
    c = inbox.client()
    login(c, "sam")
    html = c.get("/").text
    assert f"⚠ {len(warnings)} warnings" in html
    for w in warnings:
        assert str(escape(w)) in html
    assert "<script>" not in html
    login(c, "fiona")
    finance = c.get("/").text
    assert clean.approval_id in finance
    assert "⚠" not in finance


def test_an_approved_hostile_email_sends_the_stored_recipients(inbox: Inbox) -> None:
    """Approving the warned card sends exactly the stored recipients, hidden characters and all,
    once: the reviewer saw what runs."""
    p = hostile_email(inbox)
    c = inbox.client()
    csrf = login(c, "sam")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    assert inbox.shop.receiver.count("email", to=[BIDI, ZWSP, CYRILLIC]) == 1
    assert inbox.shop.receiver.count("email") == 1
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert row.status == "executed"


def tamper(inbox: Inbox, p: Pending, args: dict[str, Any]) -> None:
    """Edit the stored arguments behind effectgate's back (as someone with database access could)."""
    with inbox.store.transaction() as conn:
        assert inbox.store.update_approval(
            conn, p.approval_id, expect_status=["pending"], values={"args_json": json.dumps(args)}
        )


def test_a_record_that_does_not_verify_is_flagged_and_cannot_be_decided(inbox: Inbox) -> None:
    """A stored approval edited outside effectgate shows the does-not-verify warning in the list
    and on the card, offers no forms, and a forged approve or deny is refused; nothing runs."""
    p = propose(inbox)
    tamper(inbox, p, {"order_id": "1042", "amount": 1, "currency": "GBP"})
    c = inbox.client()
    csrf = login(c, "fiona")
    assert str(escape(TAMPERED_WARNING)) in c.get("/").text
    html = c.get(f"/approvals/{p.approval_id}").text
    assert f"<li>{escape(TAMPERED_WARNING)}</li>" in html
    assert f'action="/approvals/{p.approval_id}/' not in html
    assert "does not verify" in html
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 409
    assert "does not verify" in r.text
    assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="x")).status_code == 409
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


def approve_refused(inbox: Inbox, c: TestClient, p: Pending, csrf: str, title: str) -> str:
    """A forged approve is refused (409, under `title`) and changes nothing; the page's text."""
    before = snapshot(inbox)
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 409
    assert f"<h2>{title}</h2>" in r.text
    assert snapshot(inbox) == before
    return r.text


def still_pending(inbox: Inbox, p: Pending) -> None:
    """The approval is as proposed: pending at its version, no decision and no effect recorded."""
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert (row.status, row.version, row.token_hash) == ("pending", p.version, None)
    assert [d for d in inbox.store.all_decisions() if d.approval_id == p.approval_id] == []
    assert inbox.store.executions(approval_id=p.approval_id) == []
    assert inbox.shop.receiver.count("refund") == 0


def test_a_record_sealed_under_another_keyring_shows_the_keyring_mismatch(inbox: Inbox) -> None:
    """An inbox served with another keyring than the ledger's shows a card sealed under a key it
    lacks as the keyring mismatch it most likely is (the key id, and to use the ledger's keyring),
    not as an edited record, in the list and on the card; it offers no forms, and approve and deny
    are refused as a keyring mismatch: nothing changes, and the ledger's own keyring still finds
    the record intact."""
    p = propose(inbox)
    kid = inbox.gate.keyring.current
    explained = f'<li class="keyring-mismatch">{escape(mismatch(kid))}</li>'
    other = app(inbox.store, keyring=Keyring.generate(), clock=inbox.clock, shop=inbox.shop)
    try:
        served = create_app(other, registry(), secret_key="k")
        c = TestClient(served, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        listed = c.get("/").text
        assert f'data-approval="{p.approval_id}"' in listed
        assert explained in listed
        assert str(escape(TAMPERED_WARNING)) not in listed
        html = c.get(f"/approvals/{p.approval_id}").text
        assert 'id="warnings" role="alert"' in html
        assert explained in html
        said = (
            f'<p class="warn" id="keyring-mismatch" role="alert">This record is sealed with key <code>{kid}'
        )
        assert said in html
        assert "EFFECTGATE_KEYRING" in html
        assert str(escape(TAMPERED_WARNING)) not in html
        assert 'id="does-not-verify"' not in html
        assert f'action="/approvals/{p.approval_id}/' not in html
        assert 'class="approve"' not in html
        before = snapshot(inbox)
        r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
        assert r.status_code == 409
        assert "<h2>Keyring mismatch</h2>" in r.text
        assert str(escape(mismatch(kid))) in r.text
        assert "changed outside effectgate" not in r.text
        r = c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="x"))
        assert r.status_code == 409
        assert "<h2>Keyring mismatch</h2>" in r.text
        assert snapshot(inbox) == before
    finally:
        other.close()
    still_pending(inbox, p)
    assert inbox.gate.card(p.approval_id).warnings == ()


def test_an_edited_sealed_column_shows_the_tampering_warning_not_a_mismatch(inbox: Inbox) -> None:
    """A sealed column edited in the database, under the inbox's own keyring, is an edit: the list
    and the card show the does-not-verify warning (no keyring mismatch), no forms, and approve is
    refused as a record that does not verify; nothing changes."""
    p = propose(inbox)
    edit(inbox, p, user_id="mallory")  # the seal is left as it was
    c = inbox.client()
    csrf = login(c, "fiona")
    listed = c.get("/").text
    assert f"<li>{escape(TAMPERED_WARNING)}</li>" in listed
    assert "keyring-mismatch" not in listed
    html = c.get(f"/approvals/{p.approval_id}").text
    assert f"<li>{escape(TAMPERED_WARNING)}</li>" in html
    assert '<p class="warn" id="does-not-verify" role="alert">This record does not verify' in html
    assert "keyring-mismatch" not in html
    assert "keyring mismatch" not in html
    assert f'action="/approvals/{p.approval_id}/' not in html
    text = approve_refused(inbox, c, p, csrf, "Record does not verify")
    assert "changed outside effectgate" in text
    assert "keyring mismatch" not in text
    still_pending(inbox, p)


def edit(inbox: Inbox, p: Pending, kid: str | None = None, **columns: str) -> None:
    """Behind effectgate's back: `columns` edited, and the seal's key id rewritten to `kid`."""
    if kid is not None:
        row = inbox.store.get_approval(p.approval_id)
        assert row is not None
        columns["seal"] = f"{kid}.{row.seal.partition('.')[2]}"
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    with inbox.store.engine.begin() as conn:
        done = conn.execute(
            sa.text(f"UPDATE eg_approvals SET {sets} WHERE id = :id"), {"id": p.approval_id, **columns}
        )
        assert done.rowcount == 1


def test_an_edit_that_renames_the_seals_key_is_still_shown_as_an_edit(inbox: Inbox) -> None:
    """An owner who edits a record and writes an unknown key id into its seal, while the inbox runs
    with the ledger's keyring, does not get the keyring-mismatch explanation (which would send the
    reviewer after the wrong problem): the key id is the row's own text; the ledger's newest
    seals verify under this keyring, so it is an edit."""
    untouched = propose(inbox, {"order_id": "1043", "amount": 3500, "currency": "GBP"}, message="m1")
    p = propose(inbox)
    edit(inbox, p, "k-rotated", user_id="mallory")
    c = inbox.client()
    csrf = login(c, "fiona")
    for html in (c.get("/").text, c.get(f"/approvals/{p.approval_id}").text):
        assert f"<li>{escape(TAMPERED_WARNING)}</li>" in html
        assert "keyring-mismatch" not in html
    text = approve_refused(inbox, c, p, csrf, "Record does not verify")
    assert "edited outside effectgate" in text
    assert "k-rotated" not in text
    still_pending(inbox, p)
    assert inbox.gate.card(untouched.approval_id).warnings == ()


def test_a_foreign_key_id_is_shown_with_its_hidden_characters_revealed(inbox: Inbox) -> None:
    """The key id a card names is the row's text: under a foreign keyring it is shown, with a
    bidirectional control written out, never rendered."""
    p = propose(inbox)
    edit(inbox, p, "k\u202eevil")
    other = app(inbox.store, keyring=Keyring.generate(), clock=inbox.clock, shop=inbox.shop)
    try:
        served = create_app(other, registry(), secret_key="k")
        c = TestClient(served, base_url="http://127.0.0.1", follow_redirects=False)
        login(c, "fiona")
        html = c.get(f"/approvals/{p.approval_id}").text
    finally:
        other.close()
    assert 'id="keyring-mismatch"' in html
    assert "<code>k&lt;U+202E&gt;evil</code>" in html
    assert "\u202e" not in html
    still_pending(inbox, p)


def test_a_card_with_a_keyring_mismatch_copies_and_pickles(inbox: Inbox) -> None:
    """A card carrying the mismatch (a `ForeignSeal` warning) is a plain value like any card."""
    p = propose(inbox)
    other = app(inbox.store, keyring=Keyring.generate(), clock=inbox.clock, shop=inbox.shop)
    try:
        [card] = keyring_warnings(other, [other.card(p.approval_id)])
    finally:
        other.close()
    [warning] = card.warnings
    assert isinstance(warning, ForeignSeal)
    for copied in (copy.deepcopy(card), pickle.loads(pickle.dumps(card))):
        assert copied == card
        [copied_warning] = copied.warnings
        assert isinstance(copied_warning, ForeignSeal)
        assert copied_warning.key_id == warning.key_id
    assert dataclasses.asdict(card)["warnings"] == (str(warning),)


def test_denied_card_shows_the_reason_escaped(inbox: Inbox) -> None:
    """A denial's reason is on the card and in the history, as text."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    reason = "duplicate <img src=x onerror=alert(1)> refund"
    assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason=reason)).status_code == 200
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    assert (row.status, row.reason) == ("denied", reason)
    html = c.get(f"/approvals/{p.approval_id}").text
    assert f'<p class="warn" id="reason">{escape(reason)}</p>' in html
    assert "<img" not in html
    assert str(escape(reason)) in c.get("/history").text
    assert inbox.shop.receiver.count("refund") == 0


class Declined(Exception):
    """The provider's definite "no": nothing happened downstream."""


def test_failed_card_shows_why_it_failed(inbox: Inbox) -> None:
    """An approved charge the provider declines ends `failed`; the approve page says so (no
    error page), and the card and history show the failure, escaped, with no forms."""

    def charge(amount: int) -> dict[str, Any]:
        """Charge the customer's card."""
        raise Declined(f"card declined for {amount} <b>insufficient funds</b>")

    table = EffectTable(
        [
            ToolSpec(
                name="charge_card",
                effect=Effect.MONEY,
                fn=charge,
                approver_role="finance",
                definite_failures=(Declined,),
            )
        ]
    )
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    p = gate.call("charge_card", {"amount": 500}, context("m1"))
    assert isinstance(p, Pending)
    app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    assert "could not use the grant: Declined" in r.text
    row = gate.store.get_approval(p.approval_id)
    assert row is not None
    assert row.status == "failed"
    card = gate.card(p.approval_id)
    assert card.reason is not None
    assert "Declined" in card.reason
    html = c.get(f"/approvals/{p.approval_id}").text
    assert f'<td>failure</td><td><p class="warn" id="reason">{escape(card.reason)}</p>' in html
    assert "<b>insufficient" not in html
    assert f'action="/approvals/{p.approval_id}/' not in html
    history = c.get("/history").text
    assert p.approval_id in history
    assert str(escape(card.reason)) in history
    gate.close()
