"""The notebook card (and the terminal card it shares its concern with): a record edited
in the database is shown as text too. SQLite keeps whatever text an UPDATE writes into an INTEGER
column, so an edited `version` or `approvals_required` comes back as a str; the card flags the
record as not verifying, and must still print it as text, never as markup or terminal control."""

from __future__ import annotations

import html
from typing import Any

import pytest

from effectgate import Approver, Pending
from effectgate.cli._render import _card_panel
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.outcomes import TAMPERED_WARNING

from ..core.conftest import ShopGate

FINANCE = Approver("fiona", "finance")
MARKUP = "<img src=x onerror=alert(1)>"
OSC = "2\x1b]0;pwned\x07\x1b[2K\r"  # sets the terminal's title, erases the line


def edited_refund(shop_gate: ShopGate, values: dict[str, Any]) -> Pending:
    """A refund proposed, then its sealed integer columns edited to text (SQLite only)."""
    _, gate = shop_gate
    if not gate.store.url.startswith("sqlite"):
        pytest.skip("PostgreSQL's integer columns refuse text: the edit cannot be made there")
    out = gate.call("refund_order", {"order_id": "1042", "amount": 12000, "currency": "GBP"}, context("m3"))
    assert isinstance(out, Pending), out
    with gate.store.transaction() as conn:
        assert gate.store.update_approval(conn, out.approval_id, expect_status=["pending"], values=values)
    return out


def test_an_edited_integer_column_is_escaped_in_the_html_card(shop_gate: ShopGate) -> None:
    """A version and a number of approvers edited to markup are shown escaped: a notebook runs
    the HTML of a cell's output, so markup here would run script beside the kernel."""
    _, gate = shop_gate
    p = edited_refund(shop_gate, {"version": MARKUP, "approvals_required": MARKUP})
    card = approval_card(gate, p.approval_id, approver=FINANCE, widgets=False)
    assert TAMPERED_WARNING in card.card.warnings
    shown = card.html()
    assert "<img" not in shown
    assert html.escape(MARKUP) in shown


def test_an_edited_integer_column_never_drives_the_terminal(shop_gate: ShopGate) -> None:
    """The text card and the CLI's card write out the control characters of an edited version
    and number of approvers instead of printing them."""
    _, gate = shop_gate
    p = edited_refund(shop_gate, {"version": OSC, "approvals_required": OSC})
    card = approval_card(gate, p.approval_id, approver=FINANCE, widgets=False)
    text = card.text()
    panel = _card_panel(gate.card(p.approval_id), now=gate.clock.now()).plain
    for shown in (text, panel, repr(card)):
        assert not {"\x1b", "\r", "\x07"} & set(shown), shown
