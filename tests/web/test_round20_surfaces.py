"""Round 20 of the review of the reviewer surfaces (inbox, notebook card, text checks), on SQLite
and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from effectgate import Approver, Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry, snapshot

FINANCE = Approver("fiona", "finance")
AMENDED = {"order_id": "1042", "amount": 9000, "currency": "GBP"}


def test_a_version_column_edited_to_text_is_refused_not_a_server_error(inbox: Inbox) -> None:
    """A pending refund's version column edited to text (SQLite keeps it): its card is flagged
    and offers no form, but a form posted from a tab opened before the edit compared the form's
    number with the column's text and answered a bare 500 (TypeError). The gate refuses it as a
    record that does not verify (409) and nothing changes, for approve and deny alike."""
    if not inbox.store.url.startswith("sqlite"):
        pytest.skip("PostgreSQL's integer columns refuse text: the edit cannot be made there")
    p = propose(inbox)
    with inbox.store.transaction() as conn:
        values = {"version": "1 (edited)"}
        assert inbox.store.update_approval(conn, p.approval_id, expect_status=["pending"], values=values)
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    for action, extra in (("approve", {}), ("deny", {"reason": "duplicate"})):
        r = c.post(f"/approvals/{p.approval_id}/{action}", data=form(p, csrf, **extra))
        assert r.status_code == 409, (action, r.status_code)
        assert "does not verify" in r.text
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


def test_a_notebook_card_for_a_pending_decides_that_version_not_a_newer_one(inbox: Inbox) -> None:
    """The notebook reviewed `out` (version 1, 120.00) and asks for its card; the agent amended
    the call meanwhile (version 2, 90.00). The card read the version from the store, not from
    the Pending it was given, so `approve()` approved and ran version 2, which no one reviewed.
    It asks about the Pending's version: the approval refuses as stale and nothing runs (an
    approval id alone still asks about the current version)."""
    out = propose(inbox)
    amended = propose(inbox, AMENDED, "m5")
    assert (amended.approval_id, amended.version) == (out.approval_id, 2)
    ran: list[Any] = []
    card = approval_card(
        inbox.gate,
        out,
        approver=FINANCE,
        on_grant=lambda g: ran.append(inbox.gate.execute(g.token)),
        widgets=False,
    )
    assert card.version == 1
    assert "asked about version 1" in card.text()
    assert card.approve() is None
    assert "version 1" in card.message
    assert "version 2" in card.message
    assert ran == []
    assert inbox.shop.receiver.count("refund") == 0
    assert inbox.store.all_decisions() == []
    by_card = approval_card(inbox.gate, out.card, approver=FINANCE, widgets=False)
    assert by_card.version == 1
    by_id = approval_card(inbox.gate, out.approval_id, approver=FINANCE, widgets=False)
    assert by_id.version == 2


def pay(payee: str) -> dict[str, Any]:
    """Pay someone."""
    return {"paid": payee}


@pytest.mark.parametrize("blank", ["\u2800", "\U0001d159"])
def test_a_character_that_renders_as_a_blank_is_flagged_and_written_out(inbox: Inbox, blank: str) -> None:
    """U+2800 BRAILLE PATTERN BLANK renders as a plain space and U+1D159 MUSICAL SYMBOL NULL
    NOTEHEAD as nothing, yet neither is a space to a program (as U+3164 HANGUL FILLER, which the
    checks flag): a payee written with one carried no warning, and the card showed no revealed
    copy. Both are flagged and written out (`<U+2800>`)."""
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        p = gate.call("pay", {"payee": f"acme{blank}ltd"}, context("m1"))
        assert isinstance(p, Pending), p
        assert any(f"U+{ord(blank):04X}" in w for w in gate.card(p.approval_id).warnings)
        app = create_app(gate, registry(), secret_key="k")
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        login(c, "fiona")
        html = c.get(f"/approvals/{p.approval_id}").text
    finally:
        gate.close()
    assert f"acme&lt;U+{ord(blank):04X}&gt;ltd" in html


def test_a_letter_drawn_as_a_digit_among_digits_is_flagged(inbox: Inbox) -> None:
    """An account number written with a Cyrillic О in place of a zero ("6О16") looks like
    "6016" but is another account: digits have no script, so the token held one script and the
    mixed-script check passed it; no surface warned. It is flagged on the card (every surface
    shows the card's warnings), naming the character; Russian text with numbers ("5кг") is not."""
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        p = gate.call("pay", {"payee": "GB29 NWBK 6\u041e16 1331 9268 19"}, context("m1"))
        q = gate.call("pay", {"payee": "5кг, 1-й"}, context("m2"))
        assert isinstance(p, Pending), p
        assert isinstance(q, Pending), q
        [warning] = gate.card(p.approval_id).warnings
        assert "U+041E CYRILLIC CAPITAL LETTER O" in warning
        assert gate.card(q.approval_id).warnings == ()
        app = create_app(gate, registry(), secret_key="k")
        c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
        login(c, "fiona")
        assert 'id="warnings"' in c.get(f"/approvals/{p.approval_id}").text
    finally:
        gate.close()
