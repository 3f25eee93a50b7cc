"""Review round 3 of the inbox: edited rows, hidden characters on the pages beside the card, and
filters the database cannot hold."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate import Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot


def _email(inbox: Inbox, to: str = "x@example.com") -> Pending:
    p = inbox.gate.call("send_email", {"to": [to], "subject": "s", "body": "b"}, context("m1"))
    assert isinstance(p, Pending), p
    return p


def test_a_card_whose_notes_were_edited_into_other_json_is_shown(inbox: Inbox) -> None:
    """A row edited in the database (it no longer verifies, so the stored notes are what the
    card shows) whose notes hold null, a number and an object: the card page is shown, with the
    "does not verify" warning, instead of a bare 500."""
    p = _email(inbox)
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET notes_json = :n, args_hash = 'x' WHERE id = :i"),
            {"n": '[null, 1, {"a": "<b>"}]', "i": p.approval_id},
        )
    before = snapshot(inbox)
    c = inbox.client(raise_server_exceptions=False)
    login(c, "sam")
    r = c.get(f"/approvals/{p.approval_id}")
    assert r.status_code == 200
    assert 'id="does-not-verify"' in r.text
    assert "<b>" not in r.text
    assert snapshot(inbox) == before


class Declined(Exception):
    """The provider's definite "no"."""


def _pay_gate(inbox: Inbox, confirm: Any = None) -> EffectGate:
    def pay(payee: str) -> dict[str, Any]:
        """Pay someone."""
        raise Declined(f"unknown payee {payee}")

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        definite_failures=(Declined,),
        confirm=confirm,
    )
    table = EffectTable([spec])
    table.allow_all("support")
    return EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)


def test_the_decided_page_writes_out_hidden_characters_of_a_failed_run(inbox: Inbox) -> None:
    """The run after an approval fails with an error quoting a model-written argument that holds
    a right-to-left override: the page shown after Approve writes it out (`<U+202E>`), as the
    card does for the same failure reason, so it cannot reorder what the reviewer reads."""
    gate = _pay_gate(inbox)
    try:
        p = gate.call("pay", {"payee": "acme\u202eevil"}, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
        assert inbox.store.get_approval(p.approval_id).status == "failed"  # type: ignore[union-attr]
    finally:
        gate.close()
    assert r.status_code == 200
    assert "\u202e" not in r.text
    assert "acme&lt;U+202E&gt;evil" in r.text


def test_a_refusal_page_writes_out_hidden_characters(inbox: Inbox) -> None:
    """The table's confirm check refuses at approval time with a reason quoting the model-written
    payee (which holds a right-to-left override): the refusal page writes it out, and nothing
    is recorded."""
    checks = {"refuse": False}

    def confirm(args: Any, conf: Any) -> str | None:
        return f"payee {args['payee']} is not on file" if checks["refuse"] else None

    gate = _pay_gate(inbox, confirm=confirm)
    try:
        p = gate.call("pay", {"payee": "acme\u202eevil"}, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k")
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        checks["refuse"] = True
        before = snapshot(inbox)
        r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    finally:
        gate.close()
    assert r.status_code == 409
    assert snapshot(inbox) == before
    assert "\u202e" not in r.text
    assert "acme&lt;U+202E&gt;evil" in r.text


def test_a_session_filter_holding_nul_lists_nothing(inbox: Inbox) -> None:
    """`/?session=` with a NUL (which PostgreSQL's text cannot hold, so the query failed with a
    500 there) names no session: the inbox lists nothing, on both databases."""
    propose(inbox)
    c = inbox.client(raise_server_exceptions=False)
    login(c, "fiona")
    r = c.get("/", params={"session": "s1\x00"})
    assert r.status_code == 200
    assert "data-approval=" not in r.text
    assert c.get("/", params={"all": "1", "session": "\x00"}).status_code == 200


def _quoting_pay_gate(inbox: Inbox) -> EffectGate:
    """A gate over the inbox's store with one money tool whose result quotes its payee."""

    def pay(payee: str) -> dict[str, Any]:
        """Pay someone."""
        return {"paid": payee}

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow_all("support")
    return EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)


def test_a_result_quoting_model_text_is_written_out_on_every_page(inbox: Inbox) -> None:
    """The tool's result quotes the model-written payee (with a right-to-left override): the page
    after Approve, the card's Result and the History page write it out; only the stored argument
    itself is shown as stored (once, on the card, beside its revealed copy)."""

    gate = _quoting_pay_gate(inbox)
    try:
        p = gate.call("pay", {"payee": "acme\u202eevil"}, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        decided = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).text
        assert inbox.store.get_approval(p.approval_id).status == "executed"  # type: ignore[union-attr]
        card = c.get(f"/approvals/{p.approval_id}").text
        history = c.get("/history").text
    finally:
        gate.close()
    assert "\u202e" not in decided
    assert "\u202e" not in history
    assert card.count("\u202e") == 1  # the stored argument, as stored
    assert "acme&lt;U+202E&gt;evil" in history


@pytest.mark.xfail(
    strict=True,
    reason="a variation selector renders as nothing after a Latin letter but is legitimate after "
    "an emoji, a keycap digit or an ideograph: which contexts to flag is a design decision",
)
def test_a_variation_selector_inside_an_address_is_warned(inbox: Inbox) -> None:
    """ "ceo@acme\ufe0f.com" reads exactly as "ceo@acme.com" on the card, but it is another
    address: the card warns, as it does for a zero-width space in the same place."""
    p = _email(inbox, "ceo@acme\ufe0f.com")
    assert inbox.gate.card(p.approval_id).warnings


def test_a_compatibility_lookalike_inside_an_address_is_warned(inbox: Inbox) -> None:
    """ "ceo@p\U0001d5baypal.com" (a mathematical sans-serif "a") and "ceo@paypa\u217c.com" (a
    Roman numeral fifty) read as "ceo@paypal.com", as a Cyrillic "а" would: the card warns, and
    shows the card's warnings on the page. Text whose symbols only fold to several letters or to
    digits (a trade mark sign, a square metre) is not flagged."""
    for address in ("ceo@p\U0001d5baypal.com", "ceo@paypa\u217c.com"):
        p = _email(inbox, address)
        warnings = inbox.gate.card(p.approval_id).warnings
        assert any(w.startswith("/args/to/0: mixed scripts") for w in warnings), warnings
    args = {"to": ["ops@example.com"], "subject": "Acme\u2122 order", "body": "10 m\u00b2, 2\u00aa entrega"}
    plain = inbox.gate.call("send_email", args, context("m9"))
    assert isinstance(plain, Pending), plain
    assert inbox.gate.card(plain.approval_id).warnings == ()


def test_a_line_separator_in_model_text_is_warned_and_written_out(inbox: Inbox) -> None:
    """U+2028 (and U+2029) break a line inside the web's <pre> where the text shows none: the
    card warns about it, as about a control character, and writes it out in the result."""

    gate = _quoting_pay_gate(inbox)
    try:
        p = gate.call("pay", {"payee": "acme\u2028evil\u2029corp"}, context("m1"))
        assert isinstance(p, Pending), p
        assert any("U+2028" in w and "control character" in w for w in gate.card(p.approval_id).warnings)
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        decided = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).text
        assert inbox.store.get_approval(p.approval_id).status == "executed"  # type: ignore[union-attr]
    finally:
        gate.close()
    assert "\u2028" not in decided
    assert "acme&lt;U+2028&gt;evil&lt;U+2029&gt;corp" in decided
