"""Round 20, a fresh look at today's core changes: a call proposed for approval while its row was
gated never runs as a write once the row is one (`_written.proposed_before`), on every path.
Effects counted at the receiver; records read back. SQLite and PostgreSQL (`store`)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from effectgate import Effect, EffectTable, Executed, Grant, Pending, Refused, ToolSpec, open_store
from effectgate.errors import NeedsReconciliation
from effectgate.mcp._prior import call_once
from effectgate.redact import redact
from effectgate.stores import SQLStore
from effectgate.stores._together import CALL_APPROVALS
from effectgate.testing import EffectRecorder

from .conftest import MakeGate
from .test_round18_keys import FINANCE, blast_table, ctx, pay_table, run

PAY = {"to": "acct", "amount": 5}


def _unsubjected(rec: EffectRecorder, effect: Effect) -> EffectTable:
    """`pay_table`'s row with no subject (keyed by its arguments): a downgrade that also drops it."""
    table = pay_table(rec, effect)
    spec = table.get("pay")
    assert spec is not None
    row = ToolSpec(
        name="pay", effect=effect, fn=spec.fn, approver_role=spec.approver_role, schema=spec.schema
    )
    out = EffectTable([row])
    out.allow_all("support")
    return out


def test_a_paid_call_does_not_run_again_after_a_downgrade_that_drops_its_subject(
    make_gate: MakeGate, store: SQLStore
) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    after = make_gate(_unsubjected(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Executed)
    assert again.replay
    assert again.approval_id == first.approval_id


def test_a_waiting_call_does_not_run_after_a_downgrade_that_gives_it_a_subject(
    make_gate: MakeGate, store: SQLStore
) -> None:
    rec = EffectRecorder()
    before = make_gate(_unsubjected(rec, Effect.MONEY))
    waiting = before.call("pay", PAY, ctx("m1"))
    assert isinstance(waiting, Pending)
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 0, again
    assert isinstance(again, Refused)
    assert again.code == "mismatch"


def test_a_subjectless_waiting_call_is_refused_as_a_write(make_gate: MakeGate, store: SQLStore) -> None:
    rec = EffectRecorder()
    before = make_gate(blast_table(rec, Effect.SEND))
    waiting = before.call("blast", {"text": "hi"}, ctx("m1"))
    assert isinstance(waiting, Pending)
    after = make_gate(blast_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("blast", {"text": "hi"}, ctx("m1"))
    assert isinstance(again, Refused)
    assert again.code == "mismatch"
    assert rec.count("blast") == 0


def test_acall_and_astep_refuse_a_waiting_call_as_a_write(make_gate: MakeGate, store: SQLStore) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    assert isinstance(before.call("pay", PAY, ctx("m1")), Pending)
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    one = asyncio.run(after.acall("pay", PAY, ctx("m1")))
    step = asyncio.run(after.acall_step([("pay", PAY), ("pay", {"to": "acct", "amount": 6})], ctx("m1")))
    assert [getattr(o, "code", None) for o in (one, *step)] == ["mismatch"] * 3
    assert rec.count("pay") == 0


def test_a_redacted_paid_call_does_not_run_again_as_a_write(make_gate: MakeGate, store: SQLStore) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    run(before, before.call("pay", PAY, ctx("m1")))
    redact(store, before.keyring, user_id="u1", by="dpo", reason="erasure")
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", PAY, ctx("m1"))
    assert rec.count("pay") == 1, again


def test_a_paid_call_whose_outcome_is_unknown_is_answered_so_as_a_write(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """m1's payment was granted and its provider timed out (it may have paid); the table then
    makes `pay` a write. The replay was refused as `mismatch`, "Nothing ran": it may have run, and
    the gated replay (and a write's own) answers `needs_reconciliation` ("Outcome unknown")."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(waiting, Pending)
    grant = before.approve(waiting.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        before.execute(grant.token)
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("needs_reconciliation", waiting.approval_id)
    assert "Outcome unknown" in again.for_model()
    assert rec.count("pay") == 1


def test_a_shadow_proposal_does_not_stop_its_call_running_as_a_write(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """m1's payment was recorded in shadow mode (never run, never can be); the row then goes
    live as a write: m1's call runs, once (the same message and arguments name the shadow card)."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY).shadowed())
    assert isinstance(before.call("pay", PAY, ctx("m1")), Refused)
    after = make_gate(_unsubjected(rec, Effect.WRITE), keyring=before.keyring)
    ran = after.call("pay", PAY, ctx("m1"))
    assert isinstance(ran, Executed), ran
    assert not ran.replay
    assert isinstance(after.call("pay", PAY, ctx("m1")), Executed)
    assert rec.count("pay") == 1


def test_a_writes_look_for_its_approval_walks_the_key_and_the_session_index(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'plans.db'}")
    store.setup()
    store.close()
    db = sqlite3.connect(tmp_path / "plans.db")
    sql = re.sub(r":p_\w+", "?", CALL_APPROVALS)
    plan = " | ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, ["x"] * sql.count("?")))
    db.close()
    assert "sqlite_autoindex_eg_intent_keys_1 (key=?)" in plan, plan
    assert "eg_approvals_session (session_id=?)" in plan, plan
    assert "status_created" not in plan, plan


def _read_table(rec: EffectRecorder, subject: tuple[str, ...] = ()) -> EffectTable:
    """`pay` as a read (an `mcp serve` table that no longer gates it), by default with no subject."""
    spec = pay_table(rec).get("pay")
    assert spec is not None

    def pay(to: str, amount: float) -> dict[str, Any]:
        rec.record("pay", amount=amount)
        return {"paid": amount}

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.READ, fn=pay, schema=spec.schema, subject=subject)]
    )
    table.allow_all("support")
    return table


def test_mcp_a_paid_call_does_not_run_again_as_a_read_after_its_subject_was_dropped(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`mcp serve`'s table made `pay` a read without its subject: MCP's own look (`_prior`)
    used the intent key only, so the paid call ran again."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", PAY, ctx("m1")))
    after = make_gate(_read_table(rec), keyring=before.keyring)
    spec = after.table.get("pay")
    again = asyncio.run(call_once(after, "pay", spec, PAY, ctx("m1")))
    assert rec.count("pay") == 1, again
    assert isinstance(again, Executed)
    assert again.approval_id == first.approval_id


def test_mcp_a_paid_call_whose_outcome_is_unknown_is_answered_so_as_a_read(
    make_gate: MakeGate, store: SQLStore
) -> None:
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    waiting = before.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(waiting, Pending)
    grant = before.approve(waiting.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        before.execute(grant.token)
    after = make_gate(_read_table(rec, ("to",)), keyring=before.keyring)
    again = asyncio.run(
        call_once(after, "pay", after.table.get("pay"), {"to": "acct", "amount": 13}, ctx("m1"))
    )
    assert isinstance(again, Refused), again
    assert (again.code, again.approval_id) == ("needs_reconciliation", waiting.approval_id)
    assert rec.count("pay") == 1
