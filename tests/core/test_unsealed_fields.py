"""A card shows what the seal vouches for: the subject, notes, reversibility and owner are not
sealed (they follow from the table row and the arguments, which are), so the card re-derives them
from the table row the seal names and the verified arguments. An owner who edits them in the
database (a review swapped a mass email's recipients for one address and marked it reversible)
gets the derived values on the card and a warning, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import sqlalchemy as sa

from effectgate import EffectGate, Pending
from effectgate.examples.shop import context
from effectgate.outcomes import TAMPERED_WARNING, UNSEALED_WARNING

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def propose(gate: EffectGate) -> Pending:
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    return pending


def edit(gate: EffectGate, approval_id: str, **columns: object) -> None:
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text(f"UPDATE eg_approvals SET {sets} WHERE id = :id"), {"id": approval_id, **columns}
        )
        assert done.rowcount == 1


def test_an_untouched_card_shows_the_stored_fields_without_a_warning(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    card = gate.card(propose(gate).approval_id)
    assert card.warnings == ()
    assert (card.subject, card.reversibility, card.owner) == ({"order_id": "1042"}, "compensable", "payments")


def test_edited_unsealed_fields_are_shown_as_derived_with_a_warning(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    p = propose(gate)
    proposed = gate.card(p.approval_id)
    edit(
        gate,
        p.approval_id,
        subject_json=json.dumps({"order_id": "9999"}),
        notes_json=json.dumps(["pre-cleared by legal; low risk"]),
        reversibility="reversible",
        owner="nobody",
    )
    card = gate.card(p.approval_id)
    assert UNSEALED_WARNING in card.warnings
    assert TAMPERED_WARNING not in card.warnings  # the seal still verifies: what runs is unchanged
    assert (card.subject, card.notes, card.reversibility, card.owner) == (
        proposed.subject,
        proposed.notes,
        proposed.reversibility,
        proposed.owner,
    )
    listed = [c for c in gate.pending() if c.approval_id == p.approval_id]
    assert [c.subject for c in listed] == [{"order_id": "1042"}]
    assert all(UNSEALED_WARNING in c.warnings for c in listed)


def test_one_edited_field_is_enough(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    p = propose(gate)
    edit(gate, p.approval_id, reversibility="reversible")
    card = gate.card(p.approval_id)
    assert card.reversibility == "compensable"
    assert UNSEALED_WARNING in card.warnings


def test_forged_decision_and_history_rows_are_not_the_cards(shop_gate: ShopGate) -> None:
    """A decision row and an "executed" approval of the same subject inserted in the database
    (no valid seal) are neither shown beside the card nor history for the subject."""
    from effectgate._display import card_view

    gate = shop_gate.gate
    p = propose(gate)
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        conn.execute(
            sa.text(
                "INSERT INTO eg_decisions (approval_id, version, grant_round, approver_id, role, "
                "decision, reason, at, seal) VALUES (:id, 1, 0, 'ceo', 'finance', 'approve', "
                "'verified by phone', 0, 'forged')"
            ),
            {"id": p.approval_id},
        )
        row = (
            conn.execute(sa.text("SELECT * FROM eg_approvals WHERE id = :id"), {"id": p.approval_id})
            .mappings()
            .one()
        )
        forged = {**row, "id": "f" * 32, "status": "executed", "session_id": "s-other", "seal": "k.forged"}
        columns = ", ".join(forged)
        conn.execute(
            sa.text(f"INSERT INTO eg_approvals ({columns}) VALUES ({', '.join(':' + c for c in forged)})"),
            forged,
        )
    view = card_view(gate, p.approval_id)
    assert view["decisions"] == []
    assert [e.approval_id for e in view["view"].history] == []
    assert gate.subject_view(p.approval_id).history == ()


def test_a_stored_time_no_calendar_holds_is_shown_not_raised() -> None:
    from effectgate._display import pretty, when

    assert when(1e20).endswith("(not a date)")
    assert '"1.5"' in pretty({"balance": __import__("decimal").Decimal("1.5")})
