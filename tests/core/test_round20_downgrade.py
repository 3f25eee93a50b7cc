"""Round 20: a call proposed for approval while its row was gated, replayed after the table made
the row a write, never runs as a write: it answers the approval's stored result when that ran
these arguments, else it is refused (`mismatch`, recorded) and nothing runs. Effects counted at
the receiver; records read back. SQLite and PostgreSQL (`store`)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from effectgate import Effect, Executed, Pending, Refused
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate
from .test_round18_keys import ctx, pay_table, run

PAY = {"to": "acct", "amount": 5}


def _refusals(store: SQLStore) -> list[dict[str, object]]:
    return [json.loads(e.detail_json) for e in store.events(kind="refused")]


def test_a_waiting_call_does_not_run_as_a_write_after_its_tool_was_downgraded(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """m1's payment waits for finance; the table then makes `pay` a write. Its replay ran at once,
    with nobody's approval, while its card still waited: refused, nothing ran, still pending."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", PAY, ctx("m1"))
    assert isinstance(waiting, Pending)
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("mismatch", waiting.approval_id)
    assert rec.count("pay") == 0
    assert store.executions() == []
    assert store.get_approval(waiting.approval_id).status == "pending"  # type: ignore[union-attr]
    assert [r["code"] for r in _refusals(store)] == ["mismatch"]
    # another message is another operation: it runs as the write it now is
    assert isinstance(after.call("pay", PAY, ctx("m2")), Executed)
    assert rec.count("pay") == 1


def test_a_paid_call_replayed_with_other_arguments_is_refused_after_the_downgrade(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The same message and subject with another amount: the approval ran other arguments, so
    it is neither answered as this call's result nor run as a write."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 7}, ctx("m1"))
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("mismatch", first.approval_id)
    assert rec.count("pay") == 1


def test_an_approval_whose_seal_does_not_verify_is_not_answered_from(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """An approval edited outside effectgate (its sealed args hash changed) is no record of this
    call: the write neither replays its result nor is refused on its account (the audit reports
    the edit); it runs as the write its row now is."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET approver_role = 'ops' WHERE id = :i"), {"i": first.approval_id}
        )
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert isinstance(again, Executed), again
    assert again.replay is False
    assert rec.count("pay") == 2


def test_a_subject_key_edited_to_a_blob_does_not_crash_the_write(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """SQLite keeps a BLOB written into a text column: the write's look for its call's approval
    read it as text (it raised a raw TypeError). The row no longer verifies, so it is not
    answered from: the write runs as what its row now is (the audit reports the edit)."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a BLOB in a text column")
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", PAY, ctx("m1"))
    assert isinstance(waiting, Pending)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET subject_key = x'313233' WHERE id = :i"),
            {"i": waiting.approval_id},
        )
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert isinstance(again, Executed), again
    assert rec.count("pay") == 1
