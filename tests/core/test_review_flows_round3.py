"""Core flows, third review round: each test's docstring tells the defect it was written against
(it failed before its fix), on SQLite and PostgreSQL where a store is involved: a read that raised
a non-transient error left no record; a gated call whose before-snapshot failed (nothing ran)
stayed in effect in its subject's history for ever; a denial landed on a grant that was presented
(its unsealed token_used_at cleared); proposing again after the table row changed replayed the
version no one could approve; a user who amended another's call in a shared session could approve
it; a step given as an iterator dropped every call; the gate's errors could not cross a process
boundary (pickle)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import pickle
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Confirmation,
    Effect,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    Refused,
    ToolSpec,
)
from effectgate import errors as E
from effectgate.errors import AlreadyDecided, NeedsReconciliation, PolicyViolation, WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from ._bank import FINANCE, Bank, exec_key, pay_grant, status
from .conftest import MakeGate

# -- reads


def _failing_read_gate(make_gate: MakeGate) -> Any:
    def look(order_id: str) -> Any:
        raise KeyError(order_id)  # not transient (the row lists none)

    table = EffectTable([ToolSpec(name="look", effect=Effect.READ, fn=look)])
    table.allow_all("support")
    return make_gate(table)


def test_a_read_that_raises_a_non_transient_error_is_recorded_as_failed(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A read tool that raised anything but one of its row's transient errors was re-raised with
    no record at all (only a transient error past its retries was a `read_failed`), so the read
    log, the record of what the agent read, had no trace of the call (sync and async alike)."""
    gate = _failing_read_gate(make_gate)
    with pytest.raises(KeyError):
        gate.call("look", {"order_id": "1"}, context("m1"))
    with pytest.raises(KeyError):
        asyncio.run(gate.acall("look", {"order_id": "2"}, context("m2")))
    gate.flush()
    failed = store.events(kind="read_failed")
    assert [e.origin_message_id for e in failed] == ["m1", "m2"]
    assert all("KeyError" in (e.detail_json or "") for e in failed)
    assert store.events(kind="read") == []


# -- a definite failure before anything ran


def test_a_gated_call_whose_before_snapshot_failed_is_not_in_effect_for_the_next_proposal(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The before-snapshot of a payment raised: nothing ran, the approval ended `failed` and the
    README says the subject is free and a new attempt is a new proposal. But no execution row was
    recorded for the presented grant, so the subject's history read it as an unknown outcome
    ("presented": in effect, shown as approved) for ever, and a `confirm` check allowing one
    payment per account refused the new attempt."""
    receiver = EffectRecorder()

    def pay(account: str, amount: int) -> str:
        receiver.record("pay", account=account)
        return "paid"

    def snapshot(args: Any) -> Any:
        raise ConnectionError("ledger unreachable")

    def once(args: Any, seen: Confirmation) -> str | None:
        return "already paid" if any(e.in_effect for e in seen.history) else None

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        subject=("account",),
        snapshot=snapshot,
        confirm=once,
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(ConnectionError):
        gate.execute(grant.token)
    assert receiver.count("pay") == 0
    assert status(store, out.approval_id) == "failed"
    assert [(x.status, x.approval_id) for x in store.executions()] == [("failed", out.approval_id)]
    again = gate.call("pay", {"account": "a1", "amount": 5}, context("m2"))
    assert isinstance(again, Pending), again
    [entry] = gate.subject_view(again.approval_id).history
    assert (entry.status, entry.in_effect) == ("failed", False)
    assert gate.audit().findings == []


# -- a denial after the grant was presented


def test_a_denial_cannot_land_on_a_presented_grant_whose_token_used_at_was_cleared(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The payment's reply was lost (needs reconciliation: the money may have moved). Someone
    with write access to the database clears the approval's token_used_at (no seal covers it); a
    reviewer then denies it, and deny believed the column: the approval became `denied` with a
    sealed deny, so when reconciliation found the payment made, the approval stayed `denied` and
    the audit called the genuine execution `not_approved`. The append-only rows (its token_used
    event) say the grant was presented: too late to revoke."""
    bank = Bank()
    bank.lose_reply = 1
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    with store.engine.begin() as conn:  # behind effectgate's back
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_used_at = NULL WHERE id = :id"), {"id": grant.approval_id}
        )
    with pytest.raises(AlreadyDecided):
        gate.deny(grant.approval_id, approver=FINANCE, reason="changed my mind")
    assert status(store, grant.approval_id) == "approved"
    done = gate.reconcile(grant.approval_id)
    assert isinstance(done, Executed)
    assert status(store, grant.approval_id) == "executed"
    rec = store.get(exec_key(grant))
    assert rec is not None
    assert rec.status == "succeeded"
    assert bank.receiver.count("pay") == 1
    assert gate.audit().findings == []


# -- a table row that changed while a call waited


def test_proposing_again_after_the_table_row_changed_makes_an_approvable_version(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A call waits; the table row changes (here its owner) and the approval is refused
    `reclassified`: "it needs a fresh proposal". The model proposes again (a new message, the
    same arguments), but the gate took it for a replay and answered with the same version, sealed
    under the old row, which no one could ever approve: the call was stuck until it expired, its
    subject busy for other sessions. A new message's call is now a new version under the current
    row (the same message replayed still finds its version as it was: stable keys)."""
    bank = Bank()
    ring = Keyring.generate()
    old = make_gate(bank.table(), keyring=ring)
    out = old.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    old.close()
    changed = EffectTable([dataclasses.replace(bank.table()["pay"], owner="payments-team")])
    changed.allow_all("support")
    gate = make_gate(changed, keyring=ring)
    with pytest.raises(PolicyViolation) as refused:
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert refused.value.code == "reclassified"
    same = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))  # m1 replayed: as it was
    assert isinstance(same, Pending)
    assert (same.version, same.replay) == (1, True)
    again = gate.call("pay", {"account": "a1", "amount": 500}, context("m2"))
    assert isinstance(again, Pending)
    assert (again.approval_id, again.version, again.replay) == (out.approval_id, 2, False)
    assert [v.args_hash for v in gate.versions(out.approval_id)] == [out.card.args_hash] * 2
    grant = gate.approve(out.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    assert bank.receiver.count("pay") == 1
    # the same message replayed now is a replay of what ran, not another version
    replay = gate.call("pay", {"account": "a1", "amount": 500}, context("m2"))
    assert isinstance(replay, Executed)
    assert replay.replay
    assert gate.audit().findings == []


def test_a_replay_under_the_unchanged_row_is_still_a_replay(store: SQLStore, make_gate: MakeGate) -> None:
    """The fix above leaves the ordinary case alone: the same arguments under the same row are
    the same version (no new version, no new card)."""
    bank = Bank()
    gate = make_gate(bank.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    again = gate.call("pay", {"account": "a1", "amount": 500}, context("m2"))
    assert isinstance(out, Pending)
    assert isinstance(again, Pending)
    assert (again.version, again.replay) == (1, True)
    assert len(gate.versions(out.approval_id)) == 1
    assert len(store.events(kind="proposed")) == 1


# -- errors across a process boundary


@pytest.mark.parametrize(
    "error",
    [
        E.TokenError("used", "approval a1 has already executed"),
        E.NeedsReconciliation("eg_a_v1", "TimeoutError: lost", provider_ref="p1"),
        E.StaleApproval("a1", 1, 2),
        E.AlreadyDecided("a1", "denied"),
        E.TamperedRecord("a1", "its seal does not verify"),
        E.UnknownApproval("a1"),
        E.InProgress("w_k", "owner-1"),
        E.ConfirmFailed("pay", "already paid"),
        E.LeaseLost("eg_a_v1", "owner-1"),
        E.ArgumentError("/amount", "not a number"),
        E.WrongApprover("a1", "fiona already approved"),
        E.PolicyViolation("pay changed", code="reclassified"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_survive_pickle_and_copy(error: E.EffectGateError) -> None:
    """`execute` run in a process pool (or any pickling transport) raised TokenError("used"):
    the pool could not rebuild it in the parent (TypeError: __init__() missing 1 required
    positional argument, a BrokenProcessPool), nor could copy.copy; UnknownApproval came back
    with its message wrapped in another. Each comes back as raised: type, message, attributes."""
    for back in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert back.args == error.args
        assert vars(back) == vars(error)


# -- a shared session: the version's proposer is its user


def test_a_user_who_amends_another_users_call_in_a_shared_session_may_not_approve_it(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """In a session two users share (a team channel), ann's payment waits; fiona, who holds the
    finance role, sends a message that amends it (500 -> 900). The new version kept ann as its
    user (and her agent, run and model), so fiona approved the call she made herself and got a
    grant, and the tool would have run it as ann's. A version's identity is its proposer's."""
    bank = Bank()
    gate = make_gate(bank.table())
    ann = context("m1", user_id="ann", session_id="team")
    out = gate.call("pay", {"account": "a1", "amount": 500}, ann)
    assert isinstance(out, Pending)
    fiona = dataclasses.replace(context("m2", user_id="fiona", session_id="team"), agent_id="support")
    amended = gate.call("pay", {"account": "a1", "amount": 900}, fiona)
    assert isinstance(amended, Pending)
    assert (amended.version, amended.card.user_id) == (2, "fiona")
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=2, approver=Approver("fiona", "finance"))
    assert status(store, out.approval_id) == "pending"
    grant = gate.approve(out.approval_id, version=2, approver=Approver("ann", "finance"))
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    [run] = store.executions()
    assert (run.user_id, run.origin_message_id) == ("fiona", "m2")
    assert gate.audit().findings == []


# -- one step's calls


def test_a_step_given_as_an_iterator_routes_every_call(store: SQLStore, make_gate: MakeGate) -> None:
    """`call_step` counted the calls (for the parallel-calls rule) in a first pass over them and
    routed them in a second: calls given as a generator were spent by the count, so the step
    returned [] and every call of the model's step vanished: nothing run, proposed or refused,
    and nothing recorded (sync and async alike)."""
    bank = Bank()
    gate = make_gate(bank.table())
    calls = [("pay", {"account": "a1", "amount": 5}, "c1"), ("nope", {}, "c2")]
    outs = gate.call_step(iter(calls), context("m1"))  # type: ignore[arg-type]
    assert [type(o) for o in outs] == [Pending, Refused]
    outs = asyncio.run(gate.acall_step(iter(calls), context("m1")))  # type: ignore[arg-type]
    assert [type(o) for o in outs] == [Pending, Refused]
    assert outs[0].replay  # type: ignore[union-attr]
    assert len(store.events(kind="proposed")) == 1
