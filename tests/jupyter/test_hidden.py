"""What the notebook card prints is what is stored: hidden characters (bidirectional controls,
zero-width) written out where the approver decides, terminal control sequences never printed raw,
and a grant's token never shown."""

from __future__ import annotations

import html
import unicodedata
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Grant, Pending, ToolSpec
from effectgate._display import pretty
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card

from ..core.conftest import MakeGate, ShopGate

SAM = Approver("sam", "support_lead")
FINANCE = Approver("fiona", "finance")
RLO, ZWSP = "\u202e", "\u200b"
BODY = f"Pay to acct 12{ZWSP}34 {RLO}GBP 00001\u202c"
ADDRESS = f"a{ZWSP}@example.test"
# A tool's exception quoting a model-written argument: erase the line, return to its start, and
# print a fake green "Executed" line over it.
SPOOF = "x\x1b[2K\r\x1b[32mExecuted: refund sent, nothing to do\x1b[0m \u202eevil"
OSC_USER = "u1\x1b]0;pwned\x07"  # sets the terminal's title
MULTI_LINE = "not eligible\nstatus: executed\u2028approvals: 1 of 1"


def hidden_email(shop_gate: ShopGate, **ids: str) -> Pending:
    _, gate = shop_gate
    args = {"to": [ADDRESS], "subject": f"hi{RLO}gnp.exe", "body": BODY}
    out = gate.call("send_email", args, context("m1", **ids))
    assert isinstance(out, Pending), out
    return out


def raw_hidden(text: str) -> set[str]:
    """The characters of `text` that render as nothing, reorder it or drive a terminal."""
    return {c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c not in "\n\t"}


def test_html_card_shows_stored_arguments_and_a_copy_with_hidden_characters_shown(
    shop_gate: ShopGate,
) -> None:
    """Arguments and subject with a bidi override and zero-width spaces are shown as stored and, next
    to them, with each hidden character written out, as on the web card; clean values get no copy."""
    _, gate = shop_gate
    card = approval_card(gate, hidden_email(shop_gate), approver=SAM)
    shown = card.html()
    for stored in (pretty(BODY), pretty([ADDRESS])):
        assert f"<pre>{html.escape(stored)}</pre>" in shown  # the value as it is
    revealed = '"Pay to acct 12<U+200B>34 <U+202E>GBP 00001<U+202C>"'
    assert f"body with hidden characters shown<pre>{html.escape(revealed)}</pre>" in shown
    assert html.escape(pretty({"to": ["a<U+200B>@example.test"]})) in shown  # the subject's copy
    assert shown.count("with hidden characters shown") == 4  # to, subject and body; the subject
    assert card._body.value == shown
    args = {"to": ["b@x.test"], "subject": "s", "body": "b"}
    clean = gate.call("send_email", args, context("m2"))
    assert isinstance(clean, Pending), clean
    assert "with hidden characters shown" not in approval_card(gate, clean, approver=SAM).html()


def test_a_folded_argument_says_it_has_hidden_characters(shop_gate: ShopGate) -> None:
    """A long argument folded behind its size says in its summary that it holds hidden characters,
    and the copy with them written out is inside the fold."""
    _, gate = shop_gate
    args = {"to": ["b@x.test"], "subject": "s", "body": "x" * 3000 + RLO}
    out = gate.call("send_email", args, context("m1"))
    assert isinstance(out, Pending), out
    shown = approval_card(gate, out, approver=SAM).html()
    summary = shown[shown.index("<summary>body") : shown.index("</summary>")]
    assert "has hidden characters" in summary
    fold = shown[shown.index("<details>") : shown.index("</details>")]
    assert "with hidden characters shown" in fold
    assert "x&lt;U+202E&gt;" in fold


def test_html_card_reveals_ids_reasons_decisions_and_messages(shop_gate: ShopGate) -> None:
    """Session and user ids, a denial's reason (banner and decision) and the card's message have no
    raw hidden character in the HTML: each is written out (`<U+202E>`), never markup."""
    _, gate = shop_gate
    args = {"to": ["b@x.test"], "subject": "s", "body": "b"}
    out = gate.call("send_email", args, context("m1", user_id=f"u{RLO}1", session_id=f"s{ZWSP}1"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=SAM)
    card.deny(f"<b>no</b> {RLO}evil{ZWSP}")
    card._say(f"note {RLO}x\x1b[2K")
    for shown in (card.html(), card._status.value):
        assert raw_hidden(shown) == set(), shown
        assert "<b>no</b>" not in shown
    shown = card.html()
    assert "s&lt;U+200B&gt;1 / u&lt;U+202E&gt;1" in shown
    assert "&lt;b&gt;no&lt;/b&gt; &lt;U+202E&gt;evil&lt;U+200B&gt;" in shown
    assert shown.count("&lt;U+202E&gt;evil") == 2  # the Denied banner and the decision
    assert "&lt;U+001B&gt;[2K" in card._status.value


def test_text_card_never_prints_control_sequences(make_gate: MakeGate) -> None:
    """A failed card whose reason (the tool's exception) quotes terminal control sequences, a user id
    that sets the terminal title, and the message repeating the exception: the text card prints
    each character written out, on its own line, and nothing but newlines and tabs as controls."""

    def pay(payee: str, amount: int) -> dict[str, Any]:
        """Pay someone."""
        raise ValueError(f"unknown payee {payee}")

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", definite_failures=(ValueError,)
    )
    table = EffectTable([spec])
    table.allow_all("agent")
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id=OSC_USER, agent_id="agent", run_id="r")
    out = gate.call("pay", {"payee": SPOOF, "amount": 5}, ctx)
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, widgets=False, on_grant=lambda g: gate.execute(g.token))
    with pytest.raises(ValueError, match="unknown payee"):
        card.approve()
    assert card.card.status == "failed"
    text = card.text()
    assert raw_hidden(text) == set(), text
    lines = text.splitlines()
    assert not any(line.startswith("\x1b") or line.startswith("Executed") for line in lines)
    failed = [line for line in lines if line.startswith("!! Failed: ")]
    assert failed == [
        "!! Failed: ValueError: unknown payee x<U+001B>[2K<U+000D><U+001B>[32mExecuted: refund sent, "
        "nothing to do<U+001B>[0m <U+202E>evil"
    ]
    assert "session/user: s1 / u1<U+001B>]0;pwned<U+0007>" in text
    assert any(line.startswith("> Approved version 1") and "<U+001B>[2K<U+000D>" in line for line in lines)


def test_text_card_keeps_each_decision_reason_on_one_line(shop_gate: ShopGate) -> None:
    """A denial's reason with line breaks cannot pass for more fields of the text card."""
    _, gate = shop_gate
    card = approval_card(gate, hidden_email(shop_gate), approver=SAM, widgets=False)
    card.deny(MULTI_LINE)
    lines = card.text().splitlines()
    assert "status: executed" not in lines
    assert not any(line.startswith("approvals: 1 of 1") for line in lines)
    spelled = "not eligible<U+000A>status: executed<U+2028>approvals: 1 of 1"
    assert f"!! Denied: {spelled}" in lines
    assert any(line.startswith("decision: v1 deny by sam") and line.endswith(spelled) for line in lines)


def test_a_grant_never_shows_its_token(shop_gate: ShopGate) -> None:
    """A Grant's repr (what a notebook cell prints as its value) leaves the token out, and the card
    never shows it, even when on_grant returns it; the token is still the grant's field and works."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 100, "currency": "GBP"}, context("m3"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, on_grant=lambda g: g.token)
    grant = card.approve()
    assert isinstance(grant, Grant)
    assert grant.token
    assert grant.token not in repr(grant)
    assert repr(grant).startswith(f"Grant(approval_id='{out.approval_id}', version=1")
    bundle = card._repr_mimebundle_()
    for shown in (
        str(card),
        card.html(),
        card.message,
        card._status.value,
        repr(card),
        *map(str, bundle.values()),
    ):
        assert grant.token not in shown
    assert "<grant token>" in card.message
    assert type(gate.execute(grant.token)).__name__ == "Executed"
