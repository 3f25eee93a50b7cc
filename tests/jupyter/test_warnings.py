"""The notebook card puts the record's warnings (text that is not what it looks like) above
everything else, escaped, and says why a failed or denied card ended."""

from __future__ import annotations

import html
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card

from ..core.conftest import MakeGate, ShopGate

SAM = Approver("sam", "support_lead")
FINANCE = Approver("fiona", "finance")
RLO_ADDRESS = "ad\u202egpj.exe@example.test"  # shows as "ad" + "tset.elpmaxe@exe.jpg"
ZWSP_SUBJECT = "pay\u200bpal <script>alert(1)</script>"


def hostile_email(shop_gate: ShopGate) -> Pending:
    _, gate = shop_gate
    args = {"to": [RLO_ADDRESS], "subject": ZWSP_SUBJECT, "body": "<img src=x onerror=alert(2)>"}
    out = gate.call("send_email", args, context("m1"))
    assert isinstance(out, Pending), out
    return out


def test_hostile_arguments_put_warnings_first_in_the_widget(shop_gate: ShopGate) -> None:
    """A bidi override and a zero-width space in the arguments give warnings, shown in a box above
    the fields of the widget view, with every tag of the arguments escaped."""
    _, gate = shop_gate
    card = approval_card(gate, hostile_email(shop_gate), approver=SAM)
    warnings = card.card.warnings
    assert any("U+202E" in w and "/args/to/0" in w for w in warnings)
    assert any("U+200B" in w and "/args/subject" in w for w in warnings)
    assert card.widget is not None
    shown = card._body.value
    assert shown == card.html()
    box_at, table_at = shown.index("effectgate-warnings"), shown.index("<table>")
    assert box_at < table_at
    assert f"{len(warnings)} warning" in shown[box_at:table_at]
    for w in warnings:
        assert html.escape(w) in shown[box_at:table_at]
    assert "<script" not in shown
    assert "<img" not in shown
    assert "&lt;script&gt;" in shown


def test_the_text_card_lists_warnings_before_the_fields(shop_gate: ShopGate) -> None:
    """The plain-text card opens with the warning count and one WARNING line per warning, each once."""
    _, gate = shop_gate
    card = approval_card(gate, hostile_email(shop_gate), approver=SAM, widgets=False)
    warnings = card.card.warnings
    lines = str(card).splitlines()
    assert lines[0].startswith(f"!! {len(warnings)} warning")
    assert lines[1 : 1 + len(warnings)] == [f"WARNING: {w}" for w in warnings]
    assert lines[1 + len(warnings)].startswith("send_email  [send, irreversible]")
    assert sum(line.startswith("WARNING:") for line in lines) == len(warnings)


def test_a_warning_quoting_markup_is_escaped(make_gate: MakeGate) -> None:
    """A warning naming a model-written key full of markup shows the key as text, never as a tag."""

    def tag(labels: dict[str, str]) -> dict[str, Any]:
        """Tag something."""
        return labels

    table = EffectTable([ToolSpec(name="tag", effect=Effect.SEND, fn=tag, approver_role="support_lead")])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("tag", {"labels": {"<script>x\u200b</script>": "v"}}, context("m1"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=SAM)
    assert any("<script>" in w for w in card.card.warnings)
    shown = card.html()
    assert "<script" not in shown
    assert "&lt;script&gt;x" in shown[shown.index("effectgate-warnings") : shown.index("<table>")]


def test_a_clean_card_has_no_warnings(shop_gate: ShopGate) -> None:
    """Plain ASCII arguments raise no warning: no box, no WARNING line."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 100, "currency": "GBP"}, context("m3"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE)
    assert card.card.warnings == ()
    assert "effectgate-warnings" not in card.html()
    assert "WARNING" not in card.text()


def test_a_denied_card_says_why(shop_gate: ShopGate) -> None:
    """Once denied, the card shows "Denied" with the reason (escaped) above the fields, once in text."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 100, "currency": "GBP"}, context("m3"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE)
    card.deny("not eligible <b>per policy</b>")
    assert card.card.status == "denied"
    shown = card.html()
    assert "Denied: not eligible &lt;b&gt;per policy&lt;/b&gt;" in shown
    assert shown.index("effectgate-outcome") < shown.index("<table>")
    assert "<b>per policy" not in shown
    text = card.text()
    assert "!! Denied: not eligible <b>per policy</b>" in text.splitlines()
    assert text.count("not eligible") == 2  # the banner and the decision line
    assert card.approve_button.disabled


def test_a_failed_card_says_why(make_gate: MakeGate) -> None:
    """A call that failed before its tool ran shows "Failed" and the reason on the card at once, the
    error still reaches the caller, and no button is live."""

    def snapshot_fails(args: Any) -> int:
        raise ConnectionError("ledger unavailable")

    def withdraw(account: str, amount: int) -> dict[str, Any]:
        """Withdraw from an account."""
        raise AssertionError("the tool must not run")

    spec = ToolSpec(
        name="withdraw", effect=Effect.MONEY, fn=withdraw, approver_role="finance", snapshot=snapshot_fails
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("withdraw", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending), out
    card = approval_card(gate, out, approver=FINANCE, on_grant=lambda grant: gate.execute(grant.token))
    with pytest.raises(ConnectionError):
        card.approve()
    assert "Running it raised ConnectionError" in card.message
    assert card.card.status == "failed"
    assert "Failed: " in card.html()
    assert "ledger unavailable" in card.html()
    assert any(
        line.startswith("!! Failed: ") and "ledger unavailable" in line for line in card.text().splitlines()
    )
    assert card.approve_button.disabled
    assert card.deny_button.disabled
