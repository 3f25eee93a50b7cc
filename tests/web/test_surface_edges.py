"""The inbox's pages beside the card: what they show from the ledger is verified too."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from effectgate import Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry


def test_history_shows_no_forged_decision(inbox: Inbox) -> None:
    """A decision row inserted in the database (no valid seal) is not shown on the History page
    as someone's decision; the real, sealed denial still is."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="duplicate"))
    assert r.status_code == 200
    with inbox.store.transaction() as conn:
        inbox.store.add_decision(
            conn,
            approval_id=p.approval_id,
            version=p.version,
            grant_round=0,
            approver_id="frank",
            role="finance",
            decision="approve",
            reason="looks fine",
            seal="k1.forged",
        )
    page = c.get("/history").text
    assert "deny: fiona (finance)" in page
    assert "frank" not in page
    assert "looks fine" not in page
    card = c.get(f"/approvals/{p.approval_id}").text  # the card already leaves it out
    assert "frank" not in card


class Declined(Exception):
    """The provider's definite "no"."""


def test_hidden_characters_outside_the_stored_values_are_written_out(inbox: Inbox) -> None:
    """A failure reason quoting a model-written argument, and a warning quoting a model-written key,
    hold a right-to-left override: the card writes it out (`<U+202E>`) there, as it does for a
    key id, so it cannot reorder the reason or the warning; the arguments themselves are shown as
    stored beside their revealed copy."""

    def pay(payee: str, meta: dict[str, str]) -> dict[str, Any]:
        """Pay someone."""
        raise Declined(f"unknown payee {payee}")

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", definite_failures=(Declined,)
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        args = {"payee": "acme\u202eevil", "meta": {"ref\u202e": "1"}}
        p = gate.call("pay", args, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        csrf = login(c, "fiona")
        assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
        html = c.get(f"/approvals/{p.approval_id}").text
    finally:
        gate.close()
    reason = html[html.index('id="reason">') : html.index("</p>", html.index('id="reason">'))]
    assert "unknown payee acme&lt;U+202E&gt;evil" in reason
    warnings = html[html.index('id="warnings"') : html.index("</ul>", html.index('id="warnings"'))]
    assert "\u202e" not in warnings
    assert "ref&lt;U+202E&gt;" in warnings
    assert html.count("\u202e") == 2  # the two stored values, each shown as stored once


def test_a_whole_label_in_a_lookalike_script_is_warned(inbox: Inbox) -> None:
    """An address whose domain label is all Cyrillic lookalikes ("сосо.com" reads as "coco.com")
    mixes scripts within one address even though no single word does: the card warns, as it does
    for one Cyrillic letter inside a Latin word. Prose in two languages, word by word, does not."""
    lookalike = "ceo@\u0441\u043e\u0441\u043e.com"
    args = {"to": [lookalike], "subject": "Привет, John", "body": "Оплата for invoice 12"}
    p = inbox.gate.call("send_email", args, context("m7"))
    assert isinstance(p, Pending), p
    warnings = inbox.gate.card(p.approval_id).warnings
    assert any(w.startswith("/args/to/0: mixed scripts (CYRILLIC, LATIN)") for w in warnings), warnings
    assert not any("/args/subject" in w or "/args/body" in w for w in warnings), warnings
    c = inbox.client()
    login(c, "sam")
    assert 'id="warnings" role="alert"' in c.get(f"/approvals/{p.approval_id}").text
