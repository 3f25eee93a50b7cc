"""Round 23 of the review of the reviewer surfaces (inbox, notebook card, CLI, text checks), on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    PartialApproval,
    Pending,
    ToolSpec,
)
from effectgate.cli import main
from effectgate.examples.shop import context
from effectgate.jupyter import approval_card
from effectgate.web import create_app

from .conftest import Inbox, login, propose, registry


def pay(payee: str, account: str, amount: int) -> dict[str, Any]:
    """Pay someone."""
    return {"paid": payee}


def _pay_gate(inbox: Inbox) -> EffectGate:
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    table = EffectTable([spec])
    table.allow_all("support")
    return EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)


def _card_html(gate: EffectGate, approval_id: str) -> str:
    c = TestClient(
        create_app(gate, registry(), secret_key="k"), base_url="http://127.0.0.1", follow_redirects=False
    )
    login(c, "fiona")
    return c.get(f"/approvals/{approval_id}").text


@pytest.mark.parametrize("zero", ["\uff10", "\U0001d7f6"])
def test_a_digit_of_another_block_among_digits_is_flagged(inbox: Inbox, zero: str) -> None:
    """An account number written with a FULLWIDTH or MATHEMATICAL (monospace, bold) DIGIT ZERO in
    place of "0" ("6０16") reads as "6016" in the card's <pre> but is another account: round 20
    flagged a Cyrillic О there, but a decimal digit of another block has no script, so no surface
    warned. It is flagged, naming the character; a superscript ("100m²") and Arabic-Indic digits
    (drawn unlike ASCII ones) are not."""
    gate = _pay_gate(inbox)
    try:
        p = gate.call("pay", {"payee": "acme", "account": f"GB29 NWBK 6{zero}16", "amount": 5}, context("m1"))
        q = gate.call(
            "pay", {"payee": "100m\u00b2 \u0663\u0664 12", "account": "6016", "amount": 5}, context("m2")
        )
        assert isinstance(p, Pending), p
        assert isinstance(q, Pending), q
        [warning] = gate.card(p.approval_id).warnings
        assert f"U+{ord(zero):04X}" in warning
        assert "drawn as a digit" in warning
        assert gate.card(q.approval_id).warnings == ()
        assert 'id="warnings"' in _card_html(gate, p.approval_id)
    finally:
        gate.close()


def test_combining_marks_stacked_over_the_amount_are_flagged(inbox: Inbox) -> None:
    """A payee with 40 combining marks stacked on one letter ("Zalgo" text) is drawn far above and
    below its line, over the amount in the row beside it (browsers and notebooks paint glyphs past
    their box): the amount the reviewer reads is covered, and no surface warned (each mark is a
    printable, visible character). It is flagged with the count; Vietnamese written with two marks
    on a letter ("Nguyễn" decomposed) is not."""
    gate = _pay_gate(inbox)
    try:
        zalgo = "acme" + "\u0351\u0300" * 20
        p = gate.call("pay", {"payee": zalgo, "account": "6016", "amount": 900000}, context("m1"))
        q = gate.call("pay", {"payee": "Nguye\u0302\u0303n", "account": "6016", "amount": 5}, context("m2"))
        assert isinstance(p, Pending), p
        assert isinstance(q, Pending), q
        [warning] = gate.card(p.approval_id).warnings
        assert "40 combining marks stacked" in warning
        assert gate.card(q.approval_id).warnings == ()
        assert 'id="warnings"' in _card_html(gate, p.approval_id)
    finally:
        gate.close()


def test_a_ligature_of_latin_letters_in_an_address_is_flagged(inbox: Inbox) -> None:
    """ "finance@oﬃce.example" with U+FB03 LATIN SMALL LIGATURE FFI reads as "office" but is another
    address: a lookalike was only a variant of one letter (𝖺, ａ), and a ligature, a letter of
    the Latin script to Unicode, kept the word in one script, so no surface warned. A character
    that is a letter whose compatibility form is Latin letters is a lookalike (a trade mark sign
    is not), and the mixed word is flagged."""
    gate = _pay_gate(inbox)
    try:
        p = gate.call(
            "pay", {"payee": "finance@o\ufb03ce.example", "account": "6016", "amount": 5}, context("m1")
        )
        assert isinstance(p, Pending), p
        [warning] = gate.card(p.approval_id).warnings
        assert "LATIN LOOKALIKE" in warning
        assert 'id="warnings"' in _card_html(gate, p.approval_id)
    finally:
        gate.close()


def wipe(account: str, scope: str) -> dict[str, Any]:
    """Wipe an account's data."""
    return {"wiped": scope}


def test_history_never_credits_an_approver_of_an_amended_version_with_the_one_granted(inbox: Inbox) -> None:
    """A destructive wipe: pia approves version 1 (scope "logs", 1 of 2); the agent amends it
    to version 2 (scope "everything"), which pete and sam approve and a grant is minted. The
    History page listed the row as version 2, "decided by" pia, pete and sam with no version: pia,
    who never saw "everything", was shown as one of its three approvers. Each decision names its
    version, and one of an amended version says it is not of the version the row shows."""
    spec = ToolSpec(
        name="wipe", effect=Effect.DESTRUCTIVE, fn=wipe, approver_role="privacy", subject=("account",)
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        p = gate.call("wipe", {"account": "a1", "scope": "logs"}, context("m1"))
        assert isinstance(p, Pending), p
        first = gate.approve(p.approval_id, version=1, approver=Approver("pia", "privacy"))
        assert isinstance(first, PartialApproval)
        amended = gate.call("wipe", {"account": "a1", "scope": "everything"}, context("m2"))
        assert isinstance(amended, Pending), amended
        assert amended.version == 2
        gate.approve(p.approval_id, version=2, approver=Approver("pete", "privacy"))
        assert isinstance(gate.approve(p.approval_id, version=2, approver=Approver("sam", "privacy")), Grant)
        c = TestClient(
            create_app(gate, registry(), secret_key="k"), base_url="http://127.0.0.1", follow_redirects=False
        )
        login(c, "fiona")
        page = c.get("/history").text
    finally:
        gate.close()
    decided = {
        who: (version, note)
        for version, who, note in re.findall(r"v(\d+) approve: (\w+) \(privacy\)[^<]*(<em>)?", page)
    }
    assert decided == {"pia": ("1", "<em>"), "pete": ("2", ""), "sam": ("2", "")}
    assert "(of version 1, which was amended: not of version 2)" in page


def _edit_status(inbox: Inbox, approval_id: str, status: str) -> None:
    with inbox.store.transaction() as conn:
        assert inbox.store.update_approval(
            conn, approval_id, expect_status=["pending"], values={"status": status}
        )


@pytest.mark.parametrize("edited", ["executed", "denied", "failed"])
def test_a_notebook_card_shows_the_status_the_executions_say_not_an_edited_column(
    inbox: Inbox, edited: str
) -> None:
    """A pending refund whose status column (no seal covers it) was edited to 'executed' (or
    'denied', 'failed'): the inbox's card shows "pending", flagged, but the notebook card read
    the column, and said "status: executed" (or "Denied: no reason recorded") with no warning,
    of a refund that never ran: the reviewer moves on and it waits unseen. The notebook card
    shows what the executions and sealed decisions say (pending), and that the column says
    otherwise; nothing is decided or run."""
    p = propose(inbox)
    _edit_status(inbox, p.approval_id, edited)
    card = approval_card(inbox.gate, p, approver=Approver("fiona", "finance"), widgets=False)
    text, page = card.text(), card.html()
    assert "status: pending" in text
    assert f"Its status column says {edited}, but the executions and sealed decisions say pending" in text
    assert f"status column says {edited}" in page
    assert "no reason recorded" not in text
    assert inbox.store.all_decisions() == []
    assert inbox.shop.receiver.count("refund") == 0


def test_cli_show_says_the_status_the_executions_say_not_an_edited_column(
    inbox: Inbox, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same edit read by `effectgate show`: it printed "status executed, version 1" for a
    refund that never ran. It prints the status the executions say, with a WARNING naming the
    column's claim, and `--json` gives it as `shown_status` beside the column's `status`."""
    p = propose(inbox)
    _edit_status(inbox, p.approval_id, "executed")
    monkeypatch.setenv("EFFECTGATE_KEYRING", inbox.gate.keyring.dumps())
    assert main(["--db", inbox.store.url, "show", p.approval_id]) == 0
    out = capsys.readouterr().out
    assert "status          pending, version 1" in out
    assert "WARNING         its status column says executed, but the executions and sealed" in out
    assert main(["--db", inbox.store.url, "show", p.approval_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["shown_status"]) == ("executed", "pending")
    assert inbox.shop.receiver.count("refund") == 0


def test_a_card_shows_the_result_of_a_run_whose_status_column_was_edited_back(inbox: Inbox) -> None:
    """An executed refund whose status column was edited back to 'pending': the card said
    "executed" (from the executions) but showed no result, as it looked for one only when the
    column said 'executed'. What ran is read from the executions: the result is shown."""
    p = propose(inbox)
    grant = inbox.gate.approve(p.approval_id, version=1, approver=Approver("fiona", "finance"))
    assert isinstance(grant, Grant)
    inbox.gate.execute(grant.token)
    with inbox.store.transaction() as conn:
        values = {"status": "pending"}
        assert inbox.store.update_approval(conn, p.approval_id, expect_status=["executed"], values=values)
    c = inbox.client()
    login(c, "frank")
    page = c.get(f"/approvals/{p.approval_id}").text
    assert 'id="status-edited"' in page
    assert "re_1" in page  # the refund's result, as the provider returned it
    assert inbox.shop.receiver.count("refund") == 1
