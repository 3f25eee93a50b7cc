"""The notebook approval card: the stored fields, escaped; its buttons decide through the gate with
the version shown; refusals change nothing; without ipywidgets it is a plain-text card."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Approver, EffectGate, Executed, Grant, PartialApproval, Pending
from effectgate.errors import EffectGateError
from effectgate.examples.shop import context
from effectgate.jupyter import ApprovalCard, _card, approval_card, widgets_available
from effectgate.stores import SQLStore

from ..core.conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def propose(
    gate: EffectGate, tool: str = "refund_order", args: dict[str, Any] = REFUND, message: str = "m3"
) -> Pending:
    out = gate.call(tool, args, context(message))
    assert isinstance(out, Pending), out
    return out


def execute(gate: EffectGate) -> Any:
    return lambda grant: gate.execute(grant.token)


def test_widgets_are_available_here() -> None:
    """The dev environment installs the jupyter extra, so the button card is what these tests see."""
    assert widgets_available()


def test_card_shows_the_stored_fields(shop_gate: ShopGate) -> None:
    """The card carries tool, effect, reversibility, role, version, approvals, hash and arguments from
    the record, and the subject's balance; text and HTML show the same record."""
    _, gate = shop_gate
    out = propose(gate)
    card = approval_card(gate, out, approver=FINANCE)
    stored = gate.card(out.approval_id)
    html, text = card.html(), card.text()
    for shown in (html, text):
        for fact in ("refund_order", "money", stored.reversibility, "finance", stored.args_hash, "12000"):
            assert fact in shown
    assert "0 of 1" in html
    assert "subject balance" in html
    assert card.widget is not None
    assert card.approve_button.description == "Approve v1"


def test_model_written_values_are_escaped(shop_gate: ShopGate) -> None:
    """HTML in the arguments is shown as text: no tag of it reaches the card's markup."""
    _, gate = shop_gate
    out = propose(gate, "send_email", {"to": ["ada@example.test"], "subject": EVIL, "body": EVIL}, "m1")
    html = approval_card(gate, out, approver=Approver("sam", "support_lead")).html()
    assert "<script" not in html
    assert "<img" not in html
    assert "&lt;script&gt;" in html


def test_approve_button_executes_once(shop_gate: ShopGate, store: SQLStore) -> None:
    """Pressing Approve mints a grant for the shown version, on_grant runs it, the provider counts one
    refund and the buttons are disabled; pressing again refunds nothing more."""
    shop, gate = shop_gate
    card = approval_card(gate, propose(gate), approver=FINANCE, on_grant=execute(gate))
    card.approve_button.click()
    assert isinstance(card.grant, Grant)
    assert isinstance(card.result, Executed)
    assert shop.receiver.count("refund", order_id="1042") == 1
    assert card.card.status == "executed"
    assert card.approve_button.disabled
    assert card.deny_button.disabled
    card.approve_button.click()  # a disabled button in a live notebook; here the handler still runs
    assert shop.receiver.count("refund") == 1
    assert "Nothing was changed" in card.message


def test_a_card_left_open_across_an_amendment_is_stale(shop_gate: ShopGate, store: SQLStore) -> None:
    """A card showing version 1 refuses once the call was amended to version 2; nothing is decided."""
    shop, gate = shop_gate
    out = propose(gate, message="m3")
    card = approval_card(gate, out, approver=FINANCE, on_grant=execute(gate))
    propose(gate, args={**REFUND, "amount": 6000}, message="m5")
    card.approve_button.click()
    assert card.grant is None
    assert "version 1" in card.message
    assert "version 2" in card.message
    assert store.all_decisions() == []
    assert gate.card(out.approval_id).status == "pending"
    assert shop.receiver.count("refund") == 0
    assert card.approve_button.disabled


def test_the_wrong_role_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """A support lead's card cannot approve a finance refund; nothing is recorded."""
    _, gate = shop_gate
    out = propose(gate)
    card = approval_card(gate, out, approver=Approver("sam", "support_lead"))
    assert card.approve() is None
    assert card.message.startswith("Refused")
    assert store.all_decisions() == []
    assert gate.card(out.approval_id).status == "pending"


def test_deny_needs_a_reason_and_then_denies(shop_gate: ShopGate, store: SQLStore) -> None:
    """Deny without a reason changes nothing; with the reason typed in, the approval is denied."""
    shop, gate = shop_gate
    out = propose(gate)
    card = approval_card(gate, out, approver=FINANCE)
    card.deny_button.click()
    assert gate.card(out.approval_id).status == "pending"
    card._reason.value = "order not eligible"
    card.deny_button.click()
    assert gate.card(out.approval_id).status == "denied"
    [decision] = store.all_decisions()
    assert (decision.decision, decision.reason) == ("deny", "order not eligible")
    assert shop.receiver.count("refund") == 0


def test_destructive_needs_two_distinct_approvers(shop_gate: ShopGate, store: SQLStore) -> None:
    """The first privacy approval shows 1 of 2; the same approver again is refused; a second one grants."""
    shop, gate = shop_gate
    out = propose(gate, "delete_customer_data", {"customer_id": "u1"}, "m1")
    first = approval_card(gate, out, approver=Approver("pia", "privacy"))
    assert isinstance(first.approve(), PartialApproval)
    assert "1 of 2" in first.html()
    again = approval_card(gate, out, approver=Approver("pia", "privacy"))
    assert again.approve() is None
    assert len(store.all_decisions()) == 1
    second = approval_card(gate, out, approver=Approver("pete", "privacy"), on_grant=execute(gate))
    assert isinstance(second.approve(), Grant)
    assert shop.receiver.count("delete", customer_id="u1") == 1


def test_mimebundle_offers_the_widget_and_static_fallbacks(shop_gate: ShopGate) -> None:
    """As a cell's value the card offers the widget view, the HTML card and the text card."""
    _, gate = shop_gate
    bundle = approval_card(gate, propose(gate), approver=FINANCE)._repr_mimebundle_()
    assert {WIDGET_VIEW, "text/html", "text/plain"} <= set(bundle)
    assert "args sha256" in bundle["text/plain"]


def test_text_card_decides_the_same_way(shop_gate: ShopGate) -> None:
    """With widgets=False there is no widget, the bundle is static, and approve() still executes once."""
    shop, gate = shop_gate
    card = approval_card(gate, propose(gate), approver=FINANCE, on_grant=execute(gate), widgets=False)
    assert card.widget is None
    assert WIDGET_VIEW not in card._repr_mimebundle_()
    assert "arguments:" in str(card)
    assert isinstance(card.approve(), Grant)
    assert shop.receiver.count("refund") == 1
    assert "Approved version 1" in str(card)


def test_without_ipywidgets_the_card_degrades_to_text(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ipywidgets is missing the default card is text; asking for widgets names the install."""
    _, gate = shop_gate
    monkeypatch.setattr(_card, "_widgets", None)
    out = propose(gate)
    assert not widgets_available()
    assert ApprovalCard(gate, out, approver=FINANCE).widget is None
    with pytest.raises(EffectGateError, match=r'pip install "effectgate\[jupyter\]"'):
        ApprovalCard(gate, out, approver=FINANCE, widgets=True)
