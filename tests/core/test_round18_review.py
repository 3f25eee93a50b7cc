"""Round 18 review of the new rules (SQLite and PostgreSQL through `ledger`), reproduced first.

1. A legal hold stands by its chained `hold` event, not by its unsealed row (`_holds_sql`), but
   only `released_at` was read from the event's side: the row's `user_id` edited in the database
   (u1 to someone else) moved the hold off u1, and the next redaction erased the held user's
   records (not undoable). A hold its event placed and no `hold_released` event ended holds the
   user the event names, whatever the row says.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import EffectGate
from effectgate.redact import RedactionError, hold, holds, redact, release

from .test_redact import ledger as ledger


def _approval_args(gate: EffectGate) -> list[str]:
    return sorted(a.args_json for a in gate.store.approvals())


def _edit_hold(gate: EffectGate, hold_id: str, sets: str) -> None:
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(sa.text(f"UPDATE eg_holds SET {sets} WHERE id = :id"), {"id": hold_id})
        assert done.rowcount == 1


@pytest.mark.parametrize("sets", ["user_id = 'u2'", "user_id = 'u2', released_at = 1, released_by = 'x'"])
def test_a_hold_whose_row_names_another_user_still_holds_the_user_it_was_placed_on(
    ledger: EffectGate, sets: str
) -> None:
    placed = hold(ledger.store, user_id="u1", by="legal", reason="case 18")
    _edit_hold(ledger, placed.id, sets)
    before = _approval_args(ledger)
    with pytest.raises(RedactionError, match="legal hold"):
        redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) == before
    assert "u1" in {h.user_id for h in holds(ledger.store)}
    release(ledger.store, placed.id, by="legal", reason="case closed")  # released through `release`
    assert holds(ledger.store) == []
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) != before


@pytest.mark.xfail(
    strict=True,
    reason="the append-only trigger lets any event's detail_json take a redaction marker, and no "
    "legitimate erasure reaches a hold event (it names no user or approval in its columns): a hold "
    "or hold_released event whose detail is a marker is forged, but `_holds_sql._hold_events` skips "
    "it as unreadable. Deciding what it holds (refuse every erasure until an operator checks it, or "
    "keep the held user in a column the trigger never lets change) is a design decision",
)
def test_a_hold_event_overwritten_with_a_marker_and_its_row_released_still_holds(ledger: EffectGate) -> None:
    placed = hold(ledger.store, user_id="u1", by="legal", reason="case 18")
    with ledger.store.engine.begin() as conn:  # both allowed by the append-only triggers
        conn.execute(
            sa.text("UPDATE eg_events SET detail_json = :m WHERE kind = 'hold'"), {"m": '{"$redacted":"r-x"}'}
        )
    _edit_hold(ledger, placed.id, "released_at = 1, released_by = 'x'")
    before = _approval_args(ledger)
    with pytest.raises(RedactionError, match="legal hold"):
        redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) == before
