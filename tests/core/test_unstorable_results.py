"""A tool whose result (or a snapshot) has no JSON form still ran: its record ends succeeded, with
the value stored as its type's name, never left in flight with nobody told (found by a review: a
money tool returning a plain object moved the money, raised a serializer error, and left the
record `in_progress`, the approval `approved`, no execution row and a clean audit). A snapshot
taken before the tool runs that has no JSON form is a definite failure: nothing ran. On SQLite
and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, Executed, Grant, Pending, ToolSpec
from effectgate.examples.shop import context
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")


class Receipt:
    """What a provider's SDK might return: a plain object, no JSON form."""


def table_of(receiver: EffectRecorder, *, effect: Effect, snapshot: Any = None) -> EffectTable:
    def pay(account: str, amount: int) -> Receipt:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        return Receipt()

    options: dict[str, Any] = {"approver_role": "finance"} if effect is Effect.MONEY else {}
    table = EffectTable(
        [ToolSpec(name="pay", effect=effect, fn=pay, subject=("account",), snapshot=snapshot, **options)]
    )
    table.allow("support", ["pay"])
    return table


def test_a_gated_result_with_no_json_form_is_recorded_as_executed(make_gate: MakeGate) -> None:
    receiver = EffectRecorder()
    gate = make_gate(table_of(receiver, effect=Effect.MONEY))
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    out = gate.execute(grant.token)
    assert isinstance(out, Executed)
    assert out.result == {"unserializable": "Receipt"}
    assert receiver.count("pay") == 1
    assert gate.card(pending.approval_id).status == "executed"
    key = f"eg_{pending.approval_id}_v1"
    with gate.store.reading() as conn:
        record = gate.store.load(conn, key)
    assert record is not None
    assert record.status == "succeeded"
    [execution] = gate.store.executions(approval_id=pending.approval_id)
    assert execution.status == "succeeded"
    assert gate.audit().clean
    # the grant is spent and the stored result answers a replay of the message
    again = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert receiver.count("pay") == 1


def test_a_write_result_with_no_json_form_is_recorded_as_executed(make_gate: MakeGate) -> None:
    receiver = EffectRecorder()
    gate = make_gate(table_of(receiver, effect=Effect.WRITE))
    out = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(out, Executed)
    assert out.result == {"unserializable": "Receipt"}
    again = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert receiver.count("pay") == 1


def test_a_before_snapshot_with_no_json_form_fails_before_anything_runs(make_gate: MakeGate) -> None:
    receiver = EffectRecorder()
    gate = make_gate(table_of(receiver, effect=Effect.MONEY, snapshot=lambda args: Receipt()))
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(Exception, match=r"Unable to serialize"):
        gate.execute(grant.token)
    assert receiver.count("pay") == 0
    assert gate.card(pending.approval_id).status == "failed"
