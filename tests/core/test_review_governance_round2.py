"""Governance, second review round: erasure, retention and legal holds at their edges (each test
failed on the code before its fix), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectTable, Keyring, ToolSpec
from effectgate.redact import RedactionError, hold, holds, redact, release, retain

from .conftest import MakeGate, ShopGate
from .test_redact import everything, refund

ODD = ["u\x00x", "u\ud800x"]  # a NUL (PostgreSQL stores none) and a lone surrogate (no UTF-8 form)


@pytest.mark.parametrize("user", ODD)
def test_a_hold_on_a_user_id_no_database_stores_is_refused_alike(shop_gate: ShopGate, user: str) -> None:
    """A hold's user id holding NUL raised the driver's DataError on PostgreSQL but was stored on
    SQLite (a hold on a user no call can have: CallContext refuses such ids); a lone surrogate
    raised a bare UnicodeEncodeError on both (`effectgate hold --user $'\\xff'` printed the codec's
    message). Now a RedactionError on both backends, nothing placed."""
    gate = shop_gate.gate
    with pytest.raises(RedactionError, match="NUL character or a lone surrogate"):
        hold(gate.store, user_id=user, by="legal", reason="case 14")
    with pytest.raises(RedactionError, match="NUL character or a lone surrogate"):
        hold(gate.store, user_id="u1", by="legal", reason=f"case {user}")
    assert holds(gate.store, active=False) == []


@pytest.mark.parametrize("user", ODD)
def test_a_redaction_of_a_user_id_no_database_stores_is_refused_alike(shop_gate: ShopGate, user: str) -> None:
    """redact(user_id='u\\x00x') raised psycopg's DataError from inside the erasure's transaction
    on PostgreSQL, and a lone surrogate a UnicodeEncodeError on both: a RedactionError now (a
    refusal, nothing erased or recorded), as every other bad argument of `redact`."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    before = everything(gate.store)
    with pytest.raises(RedactionError, match="NUL character or a lone surrogate"):
        redact(gate.store, gate.keyring, user_id=user, by="dpo", reason="r")
    with pytest.raises(RedactionError, match="NUL character or a lone surrogate"):
        redact(gate.store, gate.keyring, user_id="u1", by=user, reason="r")
    with pytest.raises(RedactionError, match="NUL character or a lone surrogate"):
        retain(gate.store, gate.keyring, {"money": 0}, by=user)
    assert everything(gate.store) == before


@pytest.mark.parametrize("hold_id", ["h-\x00", "h-\ud800"])
def test_releasing_a_hold_id_no_database_stores_is_refused(shop_gate: ShopGate, hold_id: str) -> None:
    """release('h-\\x00') raised the driver's DataError on PostgreSQL (a surrogate: a codec error
    on both): refused as a RedactionError, as an unknown hold id is; the active hold stays."""
    gate = shop_gate.gate
    placed = hold(gate.store, user_id="u1", by="legal", reason="case 14")
    with pytest.raises(RedactionError):
        release(gate.store, hold_id, by="legal")
    assert [h.id for h in holds(gate.store)] == [placed.id]


@pytest.mark.xfail(
    strict=True,
    reason="read records wait in the gate's in-process buffer (ReadLog) and redact() is given only "
    "the store: a failed read's error text written after the erasure is not erased. A fix needs a "
    "design decision (the store flushing its gates' buffers, or a redaction re-checked on flush); "
    "a redaction run from another process cannot reach the buffer at all",
)
def test_a_read_buffered_before_a_redaction_is_erased_too(make_gate: MakeGate) -> None:
    """A read of u1 that failed with their e-mail in its error is buffered (not yet written);
    u1's erasure then reports done, and the buffered record lands afterwards with the e-mail."""

    def look_up(email: str) -> dict[str, Any]:
        raise LookupError(f"no customer {email}")

    table = EffectTable([ToolSpec(name="look_up", effect=Effect.READ, fn=look_up)])
    table.allow("support", ["look_up"])
    gate = make_gate(table)
    gate._reads._interval = 3600.0  # the background writer waits: the record stays buffered
    ctx = CallContext(session_id="s1", origin_message_id="m0", user_id="u1", agent_id="support")
    with pytest.raises(LookupError):
        gate.call("look_up", {"email": "ada.lovelace@example.com"}, ctx)
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request 77")
    gate.flush()
    assert "ada.lovelace@example.com" not in everything(gate.store)


def test_odd_ids_do_not_reach_the_keyring_check(shop_gate: ShopGate) -> None:
    """The refusal comes before the keyring is checked: a wrong keyring and a bad id name the id."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    with pytest.raises(RedactionError):
        redact(gate.store, Keyring.generate(), user_id="u\x00", by="dpo", reason="r")


@pytest.mark.parametrize("now", [float("nan"), float("inf")])
def test_an_erasure_at_a_time_that_is_not_finite_erases_nothing(shop_gate: ShopGate, now: float) -> None:
    """retain(..., now=nan) cut off at NaN: PostgreSQL orders NaN above every number, so a one-day
    rule erased a refund made a moment ago (on SQLite the pass failed inserting its event, an
    IntegrityError); now=inf erased it on both. Ages are checked to be finite, the time was not:
    a RedactionError now, nothing erased, as for redact, hold and release."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    before = everything(gate.store)
    with pytest.raises(RedactionError, match="finite"):
        retain(gate.store, gate.keyring, {"money": 1}, by="nightly", now=now)
    with pytest.raises(RedactionError, match="finite"):
        redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="r", now=now)
    with pytest.raises(RedactionError, match="finite"):
        hold(gate.store, user_id="u1", by="legal", reason="case 14", now=now)
    assert everything(gate.store) == before
    assert '"$redacted"' not in gate.store.approvals()[0].args_json
