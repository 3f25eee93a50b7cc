"""The inbox over a ledger someone edited behind effectgate's back: one stored approval whose JSON
columns (arguments, subject, notes) no longer hold JSON, or hold JSON of another shape, is flagged
on its own card and cannot be decided; it never takes the inbox, the other cards or the decisions
on them down with it (on SQLite and PostgreSQL)."""

from __future__ import annotations

import html
import json

import pytest
from markupsafe import escape

from effectgate import Approver, Pending
from effectgate.jupyter import approval_card
from effectgate.outcomes import TAMPERED_WARNING, UNSEALED_WARNING

from .conftest import REFUND, Inbox, form, login, propose, snapshot


def edit(inbox: Inbox, p: Pending, column: str, value: str) -> None:
    """Edit one stored column of an approval (as someone with database access could)."""
    with inbox.store.transaction() as conn:
        assert inbox.store.update_approval(
            conn, p.approval_id, expect_status=["pending"], values={column: value}
        )


def other_refund(inbox: Inbox) -> Pending:
    """A second, untouched refund waiting for finance (another order)."""
    return propose(inbox, {**REFUND, "order_id": "1043", "amount": 3500}, message="m4")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("args_json", "not json"),
        ("args_json", "[1]"),
        ("subject_json", "not json"),
        ("notes_json", "not json"),
    ],
)
def test_an_edited_json_column_leaves_the_inbox_and_the_other_cards_working(
    inbox: Inbox, column: str, value: str
) -> None:
    """The inbox still lists every pending card, the edited one is flagged and cannot be decided,
    and the untouched card is approved and runs once."""
    edited, clean = propose(inbox), other_refund(inbox)
    edit(inbox, edited, column, value)
    c = inbox.client()
    csrf = login(c, "fiona")
    listing = c.get("/")
    assert listing.status_code == 200
    assert f"/approvals/{clean.approval_id}" in listing.text
    assert f"/approvals/{edited.approval_id}" in listing.text
    card = c.get(f"/approvals/{edited.approval_id}")
    assert card.status_code == 200
    warning = TAMPERED_WARNING if column == "args_json" else UNSEALED_WARNING
    assert str(escape(warning)) in card.text
    if column == "args_json":  # what decides does not verify: no forms, and a forged POST changes nothing
        assert f'action="/approvals/{edited.approval_id}/' not in card.text
        before = snapshot(inbox)
        assert c.post(f"/approvals/{edited.approval_id}/approve", data=form(edited, csrf)).status_code == 409
        assert snapshot(inbox) == before
    assert c.post(f"/approvals/{clean.approval_id}/approve", data=form(clean, csrf)).status_code == 200
    assert inbox.shop.receiver.count("refund") == 1
    assert [e.payload["order_id"] for e in inbox.shop.receiver.effects if e.kind == "refund"] == ["1043"]
    row = inbox.store.get_approval(edited.approval_id)
    assert row is not None
    assert (row.status, row.token_hash) == ("pending", None)


@pytest.mark.parametrize("value", ["not json", "[1]", '"\\u001b]0;pwned\\u0007"'])
def test_the_notebook_card_of_an_edited_arguments_column_is_flagged_and_refuses(
    inbox: Inbox, value: str
) -> None:
    """The notebook card (text and HTML) of arguments edited into text that is not JSON, or into
    JSON that is not an object, shows the record as not verifying; approving it changes nothing."""
    p = propose(inbox)
    edit(inbox, p, "args_json", value)
    card = approval_card(inbox.gate, p.approval_id, approver=Approver("fiona", "finance"), widgets=False)
    text, markup = card.text(), card.html()
    assert TAMPERED_WARNING in text
    assert html.escape(TAMPERED_WARNING) in markup
    assert "\x1b" not in text
    before = snapshot(inbox)
    assert card.approve() is None
    assert snapshot(inbox) == before


@pytest.mark.parametrize(("column", "value"), [("grants", "x"), ("expires_at", "soon")])
def test_text_edited_into_a_number_column_leaves_the_inbox_working(
    inbox: Inbox, column: str, value: str
) -> None:
    """SQLite keeps text an UPDATE writes into a numeric column: the inbox still lists every card,
    the edited one is shown (its value as text), and the untouched card is decided as usual."""
    if not inbox.store.url.startswith("sqlite"):
        pytest.skip("PostgreSQL's numeric columns refuse text: the edit cannot be made there")
    edited, clean = propose(inbox), other_refund(inbox)
    edit(inbox, edited, column, value)
    c = inbox.client()
    csrf = login(c, "fiona")
    listing = c.get("/")
    assert listing.status_code == 200
    assert f"/approvals/{clean.approval_id}" in listing.text
    assert c.get(f"/approvals/{edited.approval_id}").status_code == 200
    assert c.post(f"/approvals/{clean.approval_id}/approve", data=form(clean, csrf)).status_code == 200
    assert [e.payload["order_id"] for e in inbox.shop.receiver.effects if e.kind == "refund"] == ["1043"]


@pytest.mark.parametrize(("column", "value"), [("args_json", "not json"), ("args_json", "[1]")])
def test_the_json_card_of_an_edited_record_is_written(inbox: Inbox, column: str, value: str) -> None:
    """`effectgate pending --json` / `show --json` write each card's `to_dict()`: an edited record's
    is written too (its stored value as it is, and the warning), not a traceback."""
    p = propose(inbox)
    edit(inbox, p, column, value)
    written = json.loads(json.dumps(inbox.gate.card(p.approval_id).to_dict()))
    assert TAMPERED_WARNING in written["warnings"]
    assert written["args"] == (value if value == "not json" else [1])
