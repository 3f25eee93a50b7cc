"""Core flows at their edges: sequences of public calls (and database edits behind the gate's
back) that must keep the gate's promises, on SQLite and PostgreSQL. Each test's docstring tells
the defect it was written against (it failed before its fix): an executed grant run again after
its unsealed columns were edited, an executed approval amended into a second run, a replay
skipping `scope`, a lapsed grant answered as pending for ever, a genuine lapsed grant refused as
forged, bad approver ids, versions and approval ids; and races of decisions that hold."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Refused,
    ToolSpec,
)
from effectgate.errors import (
    ApprovalExpired,
    EffectGateError,
    NeedsReconciliation,
    TamperedRecord,
    TokenError,
    UnknownApproval,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from ._bank import FINANCE, Bank, exec_key, pay_grant, status
from .conftest import MakeGate

# -- bad input to a decision


def test_an_approver_whose_id_is_not_text_is_refused_and_changes_nothing(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """`Approver(1, "finance")` (an application passing its numeric user id) is accepted: the
    decision is sealed over the number, stored as text, and a grant is minted; the grant is then
    refused `tampered` at execute (the stored decision no longer verifies), and the approval sits
    `approved` with a grant no one can use. Bad input must be refused before anything changes."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    with pytest.raises((TypeError, ValueError)):
        gate.approve(out.approval_id, version=1, approver=Approver(1, "finance"))  # type: ignore[arg-type]
    assert status(store, out.approval_id) == "pending"
    with store.reading() as conn:
        assert store.decisions(conn, out.approval_id) == []


@pytest.mark.parametrize("version", ["1", None])
def test_a_version_that_is_not_an_integer_is_a_clear_refusal(
    store: SQLStore, make_gate: MakeGate, version: Any
) -> None:
    """approve(version="1") (a version read from a form or a CLI argument) raises a bare
    TypeError from inside StaleApproval's message (`'<' not supported between 'str' and 'int'`)
    rather than an ApprovalError saying what is wrong; nothing changes."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    with pytest.raises(EffectGateError):
        gate.approve(out.approval_id, version=version, approver=FINANCE)
    assert status(store, out.approval_id) == "pending"


@pytest.mark.parametrize("approval_id", [123, "a\x00b", b"abc"])
def test_an_approval_id_that_cannot_exist_is_unknown_on_every_backend(
    store: SQLStore, make_gate: MakeGate, approval_id: Any
) -> None:
    """On SQLite an id that is not text (or holds NUL) is UnknownApproval; on PostgreSQL the
    same call raises the driver's ProgrammingError / DataError (the CLI's exit 5, "store
    unavailable"; a 500 in a server)."""
    bank = Bank()
    gate = make_gate(bank.table())
    for decide in (
        lambda: gate.approve(approval_id, version=1, approver=FINANCE),
        lambda: gate.deny(approval_id, approver=FINANCE, reason="no"),
        lambda: gate.card(approval_id),
        lambda: gate.reconcile(approval_id),
    ):
        with pytest.raises(UnknownApproval):
            decide()


# -- what ran is read from the append-only executions, also at execute time


def test_an_executed_grant_does_not_run_again_after_its_unsealed_columns_are_edited(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The payment ran (a `succeeded` execution is in the append-only log). An owner of the
    database then edits only unsealed state: the approval's status back to 'approved', its
    token_used_at to NULL, and the idempotency record away. Presenting the same grant again (it
    is still within its signed expiry) runs the payment a second time: execute decides from the
    status column, token_used_at and the idempotency record, and never reads the executions that
    say this version already ran."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    with store.engine.begin() as conn:  # behind effectgate's back
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'approved', token_used_at = NULL WHERE id = :id"),
            {"id": grant.approval_id},
        )
        conn.execute(sa.text('DELETE FROM eg_idempotency WHERE "key" = :k'), {"k": exec_key(grant)})
    with contextlib.suppress(TokenError, NeedsReconciliation):
        gate.execute(grant.token)
    assert bank.runs == 1
    assert [e.status for e in store.executions()] == ["succeeded"]


# -- refusal codes of a grant that was superseded


def test_a_lapsed_grant_presented_after_its_regrant_is_refused_expired_not_forged(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A grant lapses unpresented and is granted again. The first token is genuine (its MAC
    verifies under the gate's keyring) and past its signed expiry, yet execute refuses it as
    `forged` (the stored token hash was replaced), before and after the new grant ran: an alarm
    for an attack where there is only a late client."""
    bank = Bank()
    gate = make_gate(bank.table())
    old = pay_grant(gate)
    clock.advance(gate.policy.token_ttl + 1)
    new = gate.approve(old.approval_id, version=1, approver=Approver("frank", "finance"))
    assert isinstance(new, Grant)
    for ran in (False, True):
        if ran:
            assert isinstance(gate.execute(new.token), Executed)
        with pytest.raises(TokenError) as raised:
            gate.execute(old.token)
        assert raised.value.reason == "expired"
    assert bank.runs == 1


# -- concurrent decisions (boundaries that hold; no existing test races them)


class Disks:
    """A destructive tool: two distinct `ops` approvers."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()

    def wipe(self, volume: str) -> dict[str, Any]:
        """Wipe a volume."""
        self.receiver.record("wipe", volume=volume)
        return {"volume": volume}

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="wipe",
                    effect=Effect.DESTRUCTIVE,
                    fn=self.wipe,
                    approver_role="ops",
                    subject=("volume",),
                )
            ]
        )
        table.allow_all("support")
        return table


def race(*fns: Any) -> list[Any]:
    """Run `fns` on threads released together; each one's return value or exception."""
    barrier = threading.Barrier(len(fns))
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fns[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_two_approvers_at_once_mint_exactly_one_grant(store: SQLStore, make_gate: MakeGate) -> None:
    disks = Disks()
    gate = make_gate(disks.table())
    out = gate.call("wipe", {"volume": "v1"}, context("m1"))
    assert isinstance(out, Pending)
    a, b = Approver("olga", "ops"), Approver("omar", "ops")
    results = race(
        lambda: gate.approve(out.approval_id, version=1, approver=a),
        lambda: gate.approve(out.approval_id, version=1, approver=b),
    )
    assert sorted(type(r).__name__ for r in results) == ["Grant", "PartialApproval"]
    [grant] = [r for r in results if isinstance(r, Grant)]
    gate.execute(grant.token)
    assert disks.receiver.count("wipe") == 1


def test_one_approver_twice_at_once_counts_once(store: SQLStore, make_gate: MakeGate) -> None:
    disks = Disks()
    gate = make_gate(disks.table())
    out = gate.call("wipe", {"volume": "v1"}, context("m1"))
    assert isinstance(out, Pending)
    a = Approver("olga", "ops")
    results = race(*[lambda: gate.approve(out.approval_id, version=1, approver=a)] * 2)
    assert sorted(type(r).__name__ for r in results) == ["PartialApproval", "WrongApprover"]
    assert status(store, out.approval_id) == "pending"
    with store.reading() as conn:
        assert len(store.decisions(conn, out.approval_id)) == 1


def test_two_sessions_proposing_on_one_subject_at_once_get_one_approval(
    store: SQLStore, make_gate: MakeGate
) -> None:
    disks = Disks()
    gate = make_gate(disks.table())
    results = race(
        lambda: gate.call("wipe", {"volume": "v1"}, context("m1", session_id="s1")),
        lambda: gate.call("wipe", {"volume": "v1"}, context("m1", session_id="s2")),
    )
    kinds = sorted(type(r).__name__ for r in results)
    assert kinds == ["Pending", "Refused"], results
    [refused] = [r for r in results if not isinstance(r, Pending)]
    assert refused.code == "subject_busy"
    assert len(store.approvals()) == 1


def test_approve_and_deny_at_once_never_run(store: SQLStore, make_gate: MakeGate) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    results = race(
        lambda: gate.approve(out.approval_id, version=1, approver=FINANCE),
        lambda: gate.deny(out.approval_id, approver=Approver("frank", "finance"), reason="no"),
    )
    assert status(store, out.approval_id) == "denied"
    for r in results:
        if isinstance(r, Grant):
            with pytest.raises(TokenError) as raised:
                gate.execute(r.token)
            assert raised.value.reason == "revoked"
    assert bank.runs == 0


# -- a grant that lapsed after the approval's deadline


def test_a_replay_of_a_call_whose_grant_lapsed_past_its_deadline_is_told_it_expired(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """Approved, but the grant was never presented and both it and the approval's deadline
    passed: the call can never run (execute: expired; approve again: ApprovalExpired). A replay
    of its message is still answered `Pending(status="approved")`, so the agent waits for a
    grant that cannot come, instead of being told it expired (a new request proposes afresh)."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    clock.advance(gate.policy.pending_ttl + 1)
    with pytest.raises(ApprovalExpired):
        gate.approve(grant.approval_id, version=1, approver=Approver("frank", "finance"))
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Refused), out
    assert out.code == "expired"
    assert bank.runs == 0


def test_an_executed_approval_edited_back_to_pending_cannot_be_amended_into_a_second_run(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """Only unsealed columns are edited: status 'executed' -> 'pending' and token_used_at
    cleared (the idempotency record is left alone). A replay of the message with
    other arguments then amends the executed approval to version 2 (the amendment reads the
    status column, not the executions that say version 1 ran), an approver shown an ordinary
    pending card approves it, and the payment runs a second time under a new key."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    with store.engine.begin() as conn:  # behind effectgate's back
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'pending', token_used_at = NULL WHERE id = :id"),
            {"id": grant.approval_id},
        )
    with pytest.raises(TamperedRecord, match="sealed count of grants"):
        gate.call("pay", {"account": "a1", "amount": 700}, context("m1"))
    with pytest.raises(TamperedRecord):  # nor can it be approved again as it stands
        gate.approve(grant.approval_id, version=1, approver=Approver("frank", "finance"))
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert row.version == 1
    assert bank.runs == 1


# -- scope on every path to a card


def test_a_replay_with_other_arguments_is_scope_checked_before_it_reaches_a_card(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """`scope` decides per call (here: the caller may pay up to 1000). A new message with an
    out-of-scope amount is refused, but a replay of the first message with that amount amends
    the waiting approval to version 2 without running `scope` (`_propose_in` checks it only when
    no approval exists for the intent key): the out-of-scope call reaches the reviewer's card."""
    bank = Bank()

    def up_to_1000(args: Any, ctx: Any) -> bool:
        return bool(args["amount"] <= 1000)

    spec = dataclasses.replace(bank.table()["pay"], scope=up_to_1000)
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table)
    first = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(first, Pending)
    other = gate.call("pay", {"account": "a1", "amount": 5000}, context("m2"))
    assert isinstance(other, Refused)
    assert other.code == "out_of_scope"
    replay = gate.call("pay", {"account": "a1", "amount": 5000}, context("m1"))
    assert isinstance(replay, Refused), replay
    assert replay.code == "out_of_scope"
    assert [c.args["amount"] for c in gate.pending()] == [500]
