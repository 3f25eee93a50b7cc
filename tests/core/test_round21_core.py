"""Round 21, core loose ends: `audit(chain=True)` without a keyring, the one `mismatch` wording
of a call proposed while its tool was gated and re-run as a write or a read, and a fresh look at
a write's look for its call's approval (`_written`, `_intent`). Effects counted at the receiver;
records read back. SQLite and PostgreSQL (`store`)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from effectgate import Effect, Executed, Grant, Pending, Refused
from effectgate.audit import audit
from effectgate.errors import NeedsReconciliation
from effectgate.mcp._prior import call_once
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_round18_keys import FINANCE, ctx, pay_table, run
from .test_round20_today import _read_table, _unsubjected

PAY = {"to": "acct", "amount": 5}


# -- 1. audit(chain=True) without a keyring ------------------------------------------------------


def test_audit_asked_for_the_chain_without_a_keyring_raises_before_it_reads(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It skipped the chain check and answered clean: a caller who asked for the check must be
    told it cannot be made, before anything is read."""

    def unread() -> None:
        raise AssertionError("read before the arguments were checked")

    assert audit(store).clean  # without the chain check, no keyring is needed (seals unchecked)
    monkeypatch.setattr(store, "reading", unread)
    with pytest.raises(ValueError, match="keyring"):
        audit(store, chain=True)
    with pytest.raises(ValueError, match="keyring"):
        audit(store, pinned={})


# -- 2. one mismatch wording for a write and for a read ------------------------------------------


def test_a_waiting_call_rerun_as_a_write_or_a_read_is_refused_in_one_wording(
    make_gate: MakeGate, store: SQLStore
) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", PAY, ctx("m1"))
    assert isinstance(waiting, Pending)
    as_write = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    wrote = as_write.call("pay", PAY, ctx("m1"))
    as_read = make_gate(_read_table(rec, ("to",)), keyring=before.keyring)
    read = asyncio.run(call_once(as_read, "pay", as_read.table.get("pay"), PAY, ctx("m1")))
    assert isinstance(wrote, Refused), wrote
    assert isinstance(read, Refused), read
    assert (wrote.code, read.code) == ("mismatch", "mismatch")
    assert wrote.message.replace("a write", "a read") == read.message, (wrote.message, read.message)
    assert rec.count("pay") == 0


# -- 3. a write's look for its call's approval ---------------------------------------------------


def test_a_shadow_proposal_newer_than_the_paid_one_does_not_let_the_write_run_again(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """m1's payment was paid live; the row then went into shadow mode and m1 was replayed (a
    shadow card, newer); then the row became a write without its subject (the intent key moved).
    The write's look took only the newest approval of the message with these arguments, the
    shadow one, dropped it, and ran the payment a second time."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    clock.advance(1)
    shadow = make_gate(pay_table(rec, Effect.MONEY).shadowed(), keyring=before.keyring)
    assert isinstance(shadow.call("pay", PAY, ctx("m1")), Refused)
    clock.advance(1)
    after = make_gate(_unsubjected(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Executed)
    assert again.replay
    assert again.approval_id == first.approval_id


def test_a_shadow_proposal_newer_than_the_waiting_one_does_not_let_the_write_run(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", PAY, ctx("m1"))
    assert isinstance(waiting, Pending)
    clock.advance(1)
    shadow = make_gate(pay_table(rec, Effect.MONEY).shadowed(), keyring=before.keyring)
    assert isinstance(shadow.call("pay", PAY, ctx("m1")), Refused)
    clock.advance(1)
    after = make_gate(_unsubjected(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 0, again
    assert isinstance(again, Refused)
    assert (again.code, again.approval_id) == ("mismatch", waiting.approval_id)


def test_mcp_a_shadow_proposal_newer_than_the_paid_one_does_not_let_the_read_run_again(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """The same look, for a read an `mcp serve` table no longer gates (`mcp._prior`)."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    clock.advance(1)
    shadow = make_gate(pay_table(rec, Effect.MONEY).shadowed(), keyring=before.keyring)
    assert isinstance(shadow.call("pay", PAY, ctx("m1")), Refused)
    clock.advance(1)
    after = make_gate(_read_table(rec), keyring=before.keyring)
    again = asyncio.run(call_once(after, "pay", after.table.get("pay"), PAY, ctx("m1")))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Executed)
    assert again.approval_id == first.approval_id


def _set_status(store: SQLStore, approval_id: str, status: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :i"), {"s": status, "i": approval_id}
        )


def test_a_paid_call_whose_status_was_edited_back_is_answered_from_what_ran(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The status column is not sealed: m1's paid approval edited back to `pending` made the
    write's replay a `mismatch` ("Nothing ran"), though it paid: the model is told it did not
    happen. What ran (its execution record) answers: the stored result, nothing runs again."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    _set_status(store, str(first.approval_id), "pending")
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Executed), again
    assert (again.replay, again.approval_id, again.result) == (True, first.approval_id, first.result)


def test_an_unknown_outcome_whose_status_was_edited_is_still_answered_as_unknown(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """m1's grant ran with an unknown outcome; its status edited to `executed` made the write's
    replay a `mismatch` ("Nothing ran"), though it may have paid."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(waiting, Pending)
    grant = before.approve(waiting.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        before.execute(grant.token)
    _set_status(store, waiting.approval_id, "executed")
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("needs_reconciliation", waiting.approval_id)


def test_mcp_an_unknown_outcome_whose_status_was_edited_is_still_answered_as_unknown(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The same for a read an `mcp serve` table no longer gates (`mcp._prior`)."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(waiting, Pending)
    grant = before.approve(waiting.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        before.execute(grant.token)
    _set_status(store, waiting.approval_id, "executed")
    after = make_gate(_read_table(rec, ("to",)), keyring=before.keyring)
    args = {"to": "acct", "amount": 13}
    again = asyncio.run(call_once(after, "pay", after.table.get("pay"), args, ctx("m1")))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("needs_reconciliation", waiting.approval_id)
