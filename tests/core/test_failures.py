"""How a gated call ends when its tool raises: every failure kind of a money tool, counted at the
receiver, ends in the documented state.

- a failure the row declares definite: the record and the approval end `failed`, the subject is
  free, the card says why, the grant is spent, a replay of the message is told it failed, and a
  new message is a new proposal;
- anything else (a connection reset, an HTTP client's timeout, a bug): `needs_reconciliation`,
  the approver role is notified, and the same grant never runs it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    ReconciliationNotice,
    Refused,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

FINANCE = Approver("fiona", "finance")


class CardDeclined(Exception):
    """The provider refused the payment: nothing happened."""


class ReadTimeout(Exception):
    """An HTTP client's timeout type (not a TimeoutError subclass, like httpx.ReadTimeout)."""


class Payments:
    """A money tool that fails as told, then succeeds; the provider records what it applied."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.failures: list[BaseException] = []

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay `amount` to an account."""
        if self.failures:
            raise self.failures.pop(0)
        self.receiver.record("pay", account=account, amount=amount, key=tool_context.idempotency_key)
        return {"paid": amount}

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    definite_failures=(CardDeclined,),
                )
            ]
        )
        table.allow_all("support")
        return table


class Setup:
    def __init__(self, gate: EffectGate, payments: Payments, notices: list[ReconciliationNotice]) -> None:
        self.gate = gate
        self.payments = payments
        self.notices = notices

    def granted(self, message: str = "m1", session: str = "s-ada") -> Grant:
        out = self.gate.call("pay", {"account": "a1", "amount": 500}, context(message, session_id=session))
        assert isinstance(out, Pending), out
        grant = self.gate.approve(out.approval_id, version=out.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        return grant


@pytest.fixture
def setup(store: SQLStore, clock: FakeClock) -> Iterator[Setup]:
    payments = Payments()
    notices: list[ReconciliationNotice] = []
    gate = EffectGate(
        payments.table(),
        store,
        keyring=Keyring.generate(),
        clock=clock,
        on_needs_reconciliation=notices.append,
    )
    yield Setup(gate, payments, notices)
    gate.close()


def approval_status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status


def test_declared_failure_ends_the_approval_failed(setup: Setup, store: SQLStore) -> None:
    """A declared definite failure: record and approval `failed`, the card says why, the grant is
    spent, the replayed message is told it failed, and nobody is paged."""
    grant = setup.granted()
    setup.payments.failures = [CardDeclined("card declined")]
    with pytest.raises(CardDeclined):
        setup.gate.execute(grant.token)
    assert approval_status(store, grant.approval_id) == "failed"
    record = store.get(f"eg_{grant.approval_id}_v1")
    assert record is not None
    assert record.status == "failed"
    card = setup.gate.card(grant.approval_id)
    assert (card.status, card.reason) == ("failed", "CardDeclined: card declined")
    with pytest.raises(TokenError) as raised:
        setup.gate.execute(grant.token)
    assert raised.value.reason == "used"
    replay = setup.gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(replay, Refused)
    assert (replay.code, replay.approval_id) == ("failed", grant.approval_id)
    assert setup.payments.receiver.count("pay") == 0
    assert setup.notices == []


def test_failed_approval_frees_the_subject(setup: Setup) -> None:
    """After a definite failure another session may propose on the same subject, and it runs once."""
    first = setup.granted()
    setup.payments.failures = [CardDeclined("declined")]
    with pytest.raises(CardDeclined):
        setup.gate.execute(first.token)
    other = setup.granted(message="m9", session="s-other")
    setup.gate.execute(other.token)
    assert setup.payments.receiver.count("pay") == 1


def test_failed_grant_that_expires_does_not_keep_the_subject_busy(setup: Setup, clock: FakeClock) -> None:
    """A failed execution whose grant then expires leaves nothing in flight on the subject."""
    first = setup.granted()
    setup.payments.failures = [CardDeclined("declined")]
    with pytest.raises(CardDeclined):
        setup.gate.execute(first.token)
    clock.advance(setup.gate.policy.token_ttl + 1)
    out = setup.gate.call("pay", {"account": "a1", "amount": 500}, context("m2", session_id="s-2"))
    assert isinstance(out, Pending)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("connection reset by peer"),
        ReadTimeout("read timed out"),
        TimeoutError("timed out"),
        RuntimeError("a bug in the tool"),
        ValueError("bad response body"),
    ],
    ids=["reset", "client-timeout", "timeout", "bug", "value"],
)
def test_undeclared_exception_is_an_unknown_outcome(setup: Setup, store: SQLStore, error: Exception) -> None:
    """Any exception the row does not declare definite parks the call for reconciliation: finance
    is paged, the subject stays busy, and the same grant never runs the tool again."""
    grant = setup.granted()
    setup.payments.failures = [error]
    with pytest.raises(NeedsReconciliation):
        setup.gate.execute(grant.token)
    record = store.get(f"eg_{grant.approval_id}_v1")
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert approval_status(store, grant.approval_id) == "approved"
    assert [(n.approval_id, n.approver_role) for n in setup.notices] == [(grant.approval_id, "finance")]
    with pytest.raises(NeedsReconciliation):
        setup.gate.execute(grant.token)
    busy = setup.gate.call("pay", {"account": "a1", "amount": 500}, context("m2", session_id="s-2"))
    assert isinstance(busy, Refused)
    assert busy.code == "subject_busy"
    assert setup.payments.receiver.count("pay") == 0
    assert setup.gate.audit().clean


def test_settled_unknown_outcome_that_happened_runs_nothing_more(setup: Setup, store: SQLStore) -> None:
    """Settled as happened, the approval is executed with the given result; nothing runs again."""
    grant = setup.granted()
    setup.payments.failures = [ConnectionResetError("reset")]
    with pytest.raises(NeedsReconciliation):
        setup.gate.execute(grant.token)
    done = setup.gate.settle(grant.approval_id, happened=True, result={"paid": 500}, by="fiona")
    assert done is not None
    assert approval_status(store, grant.approval_id) == "executed"
    with pytest.raises(TokenError):
        setup.gate.execute(grant.token)
    assert setup.payments.receiver.count("pay") == 0


def test_a_write_still_fails_definitely_on_an_ordinary_exception(store: SQLStore, clock: FakeClock) -> None:
    """Writes keep their rule: an ordinary exception is a definite failure the same call may retry."""
    receiver = EffectRecorder()
    calls = {"n": 0}

    def tag(ticket_id: str) -> dict[str, str]:
        """Tag a ticket."""
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("first attempt fails")
        receiver.record("tag", ticket_id=ticket_id)
        return {"ticket_id": ticket_id}

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all("support")
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    try:
        with pytest.raises(ValueError, match="first attempt"):
            gate.call("tag", {"ticket_id": "t-17"}, context("m1"))
        gate.call("tag", {"ticket_id": "t-17"}, context("m1"))
        assert receiver.count("tag") == 1
    finally:
        gate.close()
