"""Exactly-once under failure (round 9), on SQLite and PostgreSQL.

- A reconcile hook's answer is checked before anything changes on it. An answer that is not None
  or a `Reconciled` raised a raw AttributeError; a `Reconciled` whose `found` is not a bool was
  read for its truth: `found=None` ("the provider cannot tell", written as a field) ran the
  payment a second time, also from `recover()`, and `found="no"` recorded it as having happened
  with no result, the approval executed; a `provider_ref` that is not text was stored as it was.
  Now each is a TypeError saying what the hook answered, nothing changed.
- A stored result is replayed only for the arguments it was recorded for: an idempotency record
  whose payload hash is not the approval's arguments hash (edited, or inserted, in the database)
  was replayed by `execute` (the approval marked executed, the tool never run) and returned by
  `gate.result`. Now `execute` refuses the grant as tampered and `result` raises StoreError.
- A provider's "not found" is evidence only about the record as it was when the provider was
  asked: a second worker whose lookup was answered before the first worker's run-again (which
  reached the provider) ran the payment a third time (released a write for its next call), on a
  stale answer. Now it is refused (not_reconcilable), the record left awaiting reconciliation.
- `recover()` raised ValueError out of its loop on an in-flight record whose key names a version
  of thousands of digits (inserted in the database); the other records were left unhandled.

Two strict xfails need a decision: the agent's replay of an executed call returns a stored result
whatever its payload hash, and an effect found after a "did not happen" settlement leaves the
approval `failed`.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Effect, EffectTable, Executed, Reconciled, ToolContext, ToolSpec
from effectgate.errors import (
    LeaseLost,
    NeedsReconciliation,
    PolicyViolation,
    StoreError,
    TamperedRecord,
    TokenError,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE, Bank, Tags, exec_key, pay_grant, status
from .conftest import MakeGate


class AnsweringBank(Bank):
    """A payment whose provider lookup answers what the test says."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
        self.asked: list[str] = []

    def lookup(self, key: str) -> Any:
        self.asked.append(key)
        return self.answer


class AnsweringTags(Tags):
    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer

    def lookup(self, key: str) -> Any:
        return self.answer


MALFORMED = [
    pytest.param({"found": True, "result": {"ref": "p1"}}, id="dict"),
    pytest.param(True, id="bool"),
    pytest.param(Reconciled(found=None), id="found-None"),  # type: ignore[arg-type]
    pytest.param(Reconciled(found="no"), id="found-text"),  # type: ignore[arg-type]
    pytest.param(Reconciled(found=1), id="found-int"),  # type: ignore[arg-type]
    pytest.param(Reconciled(found=True, result={"ref": "p1"}, provider_ref=123), id="ref-int"),  # type: ignore[arg-type]
]


def _unknown_payment(gate: Any, bank: Bank) -> Any:
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    return grant


@pytest.mark.parametrize("answer", MALFORMED)
def test_a_malformed_reconcile_answer_changes_nothing_and_says_why(
    store: SQLStore, make_gate: MakeGate, answer: Any
) -> None:
    bank = AnsweringBank(answer)
    gate = make_gate(bank.table())
    grant = _unknown_payment(gate, bank)
    key = exec_key(grant)
    with pytest.raises(TypeError, match="reconcile hook of pay") as raised:
        gate.reconcile(grant.approval_id, approver=FINANCE)
    assert "nothing was changed" in str(raised.value)
    assert bank.receiver.count("pay") == 1
    assert bank.runs == 1
    assert status(store, grant.approval_id) == "approved"
    record = store.get(key)
    assert record is not None
    assert (record.status, record.provider_ref) == ("needs_reconciliation", None)
    assert [e.status for e in store.executions(approval_id=grant.approval_id)] == ["needs_reconciliation"]
    # a person still settles it
    done = gate.settle(grant.approval_id, happened=True, result={"ref": "p1"}, by="fiona")
    assert isinstance(done, Executed)
    assert status(store, grant.approval_id) == "executed"


def test_recover_never_runs_a_died_payment_again_on_an_answer_that_is_no_bool(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The worker died between claim and complete; the provider's client answers
    `Reconciled(found=None)` (it cannot tell). `recover` must leave it needs_reconciliation and
    record why, never run the payment again."""
    bank = AnsweringBank(Reconciled(found=None))  # type: ignore[arg-type]
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    store.claim(exec_key(grant), row.args_hash, lease_seconds=gate.policy.lease_seconds)  # then died
    clock.advance(gate.policy.lease_seconds)
    assert gate.recover() == [exec_key(grant)]
    assert bank.asked == [exec_key(grant)]
    assert bank.runs == 0
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert status(store, grant.approval_id) == "approved"
    [failed] = store.events(kind="reconcile_failed")
    assert "not bool" in str(failed.detail_json)


@pytest.mark.parametrize("answer", MALFORMED)
def test_a_malformed_answer_about_a_write_changes_nothing(
    store: SQLStore, make_gate: MakeGate, answer: Any
) -> None:
    tags = AnsweringTags(answer)
    gate = make_gate(tags.table())
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.call("tag", {"ticket_id": "t1", "tags": ["vip"]}, context("m1"))
    [record] = store.idempotency_records(status="needs_reconciliation")
    with pytest.raises(TypeError, match="reconcile hook of tag"):
        gate.reconcile(record.key)
    again = store.get(record.key)
    assert again is not None
    assert (again.status, again.provider_ref) == ("needs_reconciliation", None)
    assert tags.receiver.count("tag") == 1
    # the same message's call is still refused, never run a second time
    out = gate.call("tag", {"ticket_id": "t1", "tags": ["vip"]}, context("m1"))
    assert not isinstance(out, Executed)
    assert tags.receiver.count("tag") == 1


# -- stored results read back


def _forge(store: SQLStore, key: str, payload_hash: str) -> None:
    """A succeeded record with a result, inserted behind effectgate's back."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                'INSERT INTO eg_idempotency ("key", payload_hash, status, result_json, attempts, '
                "created_at, updated_at) VALUES (:k, :h, 'succeeded', :r, 1, 0, 0)"
            ),
            {"k": key, "h": payload_hash, "r": '{"ref": "forged"}'},
        )


def test_a_stored_result_for_other_arguments_is_refused_not_replayed(
    store: SQLStore, make_gate: MakeGate
) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    _forge(store, exec_key(grant), "0" * 64)
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "tampered"
    assert bank.runs == 0
    assert status(store, grant.approval_id) == "approved"  # never marked executed on it
    assert not store.executions(approval_id=grant.approval_id)
    assert [e.kind for e in store.events(kind="token_refused")] == ["token_refused"]


def test_the_result_of_an_approval_whose_record_was_edited_is_refused(
    store: SQLStore, make_gate: MakeGate
) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_idempotency SET payload_hash = :h, result_json = :r"),
            {"h": "0" * 64, "r": '{"ref": "forged"}'},
        )
    with pytest.raises(StoreError, match="other arguments"):
        gate.result(grant.approval_id)
    assert bank.runs == 1


def test_the_agents_replay_of_an_executed_call_never_returns_a_result_for_other_arguments(
    store: SQLStore, make_gate: MakeGate
) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_idempotency SET payload_hash = :h, result_json = :r"),
            {"h": "0" * 64, "r": '{"ref": "forged"}'},
        )
    with pytest.raises(TamperedRecord, match="recorded for other arguments"):
        gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert bank.runs == 1


# -- a stale "not found": the provider's answer predates a run another worker made meanwhile


class SlowLookupProvider:
    """A payment provider that does not dedupe; `lookup` can be made slow: while it answers, what
    `meanwhile` does runs (another worker reconciling the same key)."""

    def __init__(self) -> None:
        self.charged: list[str] = []  # one per charge, by idempotency key
        self.runs = 0
        self.reach = [False]  # per run, whether the request reaches the provider (default: it does)
        self.meanwhile: list[Any] = []

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        self.runs += 1
        reaches = self.reach.pop(0) if self.reach else True
        if not reaches:
            raise TimeoutError("the request never reached the provider")
        self.charged.append(tool_context.idempotency_key)
        raise TimeoutError("the reply was lost")

    def lookup(self, key: str) -> Reconciled:
        answer = Reconciled(found=key in self.charged)
        while self.meanwhile:  # the answer is on its way back; another worker acts meanwhile
            self.meanwhile.pop(0)()
        return answer

    def table(self) -> EffectTable:
        spec = ToolSpec(
            name="pay",
            effect=Effect.MONEY,
            fn=self.pay,
            approver_role="finance",
            subject=("account",),
            reconcile=self.lookup,
        )
        table = EffectTable([spec])
        table.allow_all("support")
        return table


def test_a_stale_not_found_never_runs_a_payment_another_worker_ran_meanwhile(
    store: SQLStore, make_gate: MakeGate
) -> None:
    provider = SlowLookupProvider()
    first = make_gate(provider.table())
    second = make_gate(provider.table(), keyring=first.keyring)
    grant = pay_grant(first)
    with pytest.raises(NeedsReconciliation):
        first.execute(grant.token)  # never reached the provider
    assert provider.charged == []

    def first_reconciles() -> None:  # its lookup is fresh: not found, so it runs again
        with pytest.raises(NeedsReconciliation):  # it reached the provider; the reply was lost
            first.reconcile(grant.approval_id, approver=FINANCE)

    provider.meanwhile.append(first_reconciles)
    with pytest.raises(PolicyViolation) as raised:
        second.reconcile(grant.approval_id, approver=FINANCE)  # its "not found" is stale now
    assert raised.value.code == "not_reconcilable"
    assert provider.runs == 2
    assert provider.charged == [exec_key(grant)]
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    # asked again, the provider has it: it happened, once
    done = second.reconcile(grant.approval_id, approver=FINANCE)
    assert isinstance(done, Executed)
    assert provider.charged == [exec_key(grant)]
    assert status(store, grant.approval_id) == "executed"


class SlowLookupNotes(SlowLookupProvider):
    """The same provider behind a write (no approval): a note sent to a ticket, not deduped."""

    def note(self, ticket_id: str, text: str, tool_context: ToolContext) -> dict[str, Any]:
        """Add a note to a ticket."""
        return self.pay(ticket_id, 0, tool_context)

    def table(self) -> EffectTable:
        spec = ToolSpec(
            name="note", effect=Effect.WRITE, fn=self.note, subject=("ticket_id",), reconcile=self.lookup
        )
        table = EffectTable([spec])
        table.allow_all("support")
        return table


def test_a_stale_not_found_never_releases_a_write_that_ran_meanwhile(
    store: SQLStore, make_gate: MakeGate
) -> None:
    provider = SlowLookupNotes()
    first = make_gate(provider.table())
    second = make_gate(provider.table(), keyring=first.keyring)
    args = {"ticket_id": "t1", "text": "refund sent"}
    provider.reach = [False]
    with pytest.raises(NeedsReconciliation) as unknown:
        first.call("note", args, context("m1"))  # never reached the provider
    key = unknown.value.key

    def first_reconciles_and_the_agent_retries() -> None:
        assert first.reconcile(key) is None  # fresh: not found, released
        with pytest.raises(NeedsReconciliation):  # the retry reached the provider; reply lost
            first.call("note", args, context("m1"))

    provider.meanwhile.append(first_reconciles_and_the_agent_retries)
    with pytest.raises(PolicyViolation) as raised:
        second.reconcile(key)  # its "not found" is stale now
    assert raised.value.code == "not_reconcilable"
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    out = first.call("note", args, context("m1"))  # the same message again: never a third run
    assert not isinstance(out, Executed)
    assert provider.runs == 2
    assert provider.charged == [key]


def test_recover_handles_the_other_records_after_one_whose_key_names_a_huge_version(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """An in-flight record inserted in the database with a key `eg_<id>_v<5000 digits>`: parsing
    its version raised ValueError (Python's limit on int() of long text) out of `recover()`, after
    its lease was expired and before the payment whose worker really died was looked at."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                'INSERT INTO eg_idempotency ("key", payload_hash, status, lease_owner, lease_expires_at, '
                "attempts, created_at, updated_at) VALUES (:k, 'x', 'in_progress', 'w', 0, 1, 0, 0)"
            ),
            {"k": "eg_a1_v" + "9" * 5000},
        )
    grant = pay_grant(gate)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    store.claim(exec_key(grant), row.args_hash, lease_seconds=gate.policy.lease_seconds)  # then died
    clock.advance(gate.policy.lease_seconds)
    touched = gate.recover()
    assert exec_key(grant) in touched
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert bank.runs == 0


@pytest.mark.xfail(
    strict=True,
    reason="`failed` is terminal (README); an effect found to have happened after a person settled it "
    "'did not happen' leaves the approval failed: whether it may become executed is a design decision",
)
def test_a_late_run_found_after_a_did_not_happen_settlement_marks_the_approval_executed(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """The worker's lease ran out while the payment ran; `recover` in another worker made it
    needs_reconciliation, and a person settled it "did not happen" (approval failed). Then the
    payment returned: its run is recorded as needing reconciliation again. Settled "happened",
    the record succeeds and a succeeded execution is appended, but the approval stays `failed`
    (its compare-and-set expects `approved`), its card saying the payment did not happen."""
    gates: list[Any] = []
    granted: list[str] = []

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay an account (slowly: the lease runs out, and a person settles it meanwhile)."""
        clock.advance(gates[0].policy.lease_seconds + 1)
        gates[1].recover()
        gates[1].settle(granted[0], happened=False, by="fiona")
        return {"paid": amount}

    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))
    table = EffectTable([spec])
    table.allow_all("support")
    first = make_gate(table)
    gates += [first, make_gate(table, keyring=first.keyring)]
    grant = pay_grant(first)
    granted.append(grant.approval_id)
    with pytest.raises(LeaseLost):
        first.execute(grant.token)
    assert isinstance(
        first.settle(grant.approval_id, happened=True, result={"paid": 500}, by="fiona"), Executed
    )
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "succeeded"
    assert status(store, grant.approval_id) == "executed"
