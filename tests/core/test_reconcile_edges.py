"""Reconciliation edges: settling, reconciling and recovering unknown outcomes.

Pins, on SQLite and PostgreSQL, what an outside review found broken in `_reconcile` (the first
five tests are copied from tests/core/test_review_flows.py; their docstrings describe the defect
as the reviewer found it), and the behaviour the fixes chose:

- an effect that happened is recorded under the table row its approval was made under, so a row
  changed since never blocks it; only running it again needs the current row (`reclassified`,
  nothing changed);
- settle of anything not awaiting reconciliation is `PolicyViolation(not_reconcilable)`, as
  reconcile's refusal is, never a StoreError, and nothing changes;
- `recover()` handles every expired lease even when a reconciliation raises (logged, recorded as
  a `reconcile_failed` event);
- a found result with no JSON form is stored as {"unserializable": TYPE}, as a run's is;
- a write (no approval) is reconciled or settled by its idempotency key: found or happened, it
  succeeds and a replay gets the result; not found or not happened, it is released and its next
  call runs it again under the same key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import pytest

from effectgate import (
    Approver,
    Executed,
    Reconciled,
    ToolContext,
)
from effectgate.errors import NeedsReconciliation, PolicyViolation, StoreError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import Bank, Tags, exec_key, pay_grant, status
from .conftest import MakeGate

# -- settling an unknown outcome after the tool's row changed


def test_an_effect_that_happened_can_be_settled_after_the_row_changed(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """The payment happened but its reply was lost; then the tool's row changed (a new
    deployment names another owner). A person who knows it happened must be able to record
    that: `settle(happened=False)` already records under the row the approval was made under,
    but `settle(happened=True)` refuses `reclassified`, so the only way out is to say it did not
    happen (which frees the subject for a second payment)."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert bank.receiver.count("pay") == 1
    changed_spec = dataclasses.replace(gate.table["pay"], owner="treasury")
    later = make_gate(gate.table.replace(changed_spec), keyring=gate.keyring)
    done = later.settle(grant.approval_id, happened=True, result={"ref": "p1"}, by="fiona")
    assert isinstance(done, Executed)
    assert status(store, grant.approval_id) == "executed"
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "succeeded"


# -- a settle of something that is not awaiting reconciliation


def test_settle_of_an_approval_not_awaiting_reconciliation_is_a_policy_refusal(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """`reconcile` refuses an approval that is not awaiting reconciliation with
    PolicyViolation(not_reconcilable); `settle` raises StoreError instead (the CLI's and the
    inbox's "store unavailable"), although the store is fine. Nothing changes either way."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    grant = pay_grant(gate)
    for happened in (True, False):
        with pytest.raises(PolicyViolation) as raised:
            gate.settle(grant.approval_id, happened=happened, result={"x": 1}, by="fiona")
        assert not isinstance(raised.value, StoreError)
        assert raised.value.code == "not_reconcilable"
    assert status(store, grant.approval_id) == "approved"
    assert isinstance(gate.execute(grant.token), Executed)


# -- recover with a reconcile hook that raises


def test_recover_handles_every_expired_lease_even_when_a_lookup_raises(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """Two workers crashed mid-payment. `recover()` must turn both records into
    needs_reconciliation and page for both, even though the provider's lookup is down: it raises
    out of the first reconcile and leaves the second record in flight, unannounced."""
    bank = Bank()
    notices: list[Any] = []
    gate = make_gate(bank.table(), on_needs_reconciliation=notices.append)
    grants = [pay_grant(gate, account=a, message=f"m-{a}") for a in ("a1", "a2")]
    for grant in grants:
        row = store.get_approval(grant.approval_id)
        assert row is not None
        store.claim(exec_key(grant), row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    bank.lookup_raises = True
    with contextlib.suppress(ConnectionError):
        gate.recover()
    records = [store.get(exec_key(g)) for g in grants]
    assert [r.status if r else None for r in records] == ["needs_reconciliation"] * 2
    assert len(notices) == 2
    assert bank.receiver.count("pay") == 0


# -- a write whose outcome is unknown


def test_a_write_with_an_unknown_outcome_can_be_reconciled(store: SQLStore, make_gate: MakeGate) -> None:
    """README: "An unknown outcome is needs_reconciliation, the approver is notified, and
    `reconcile(key)` settles it". For a write the key is all there is (no approval), but
    `EffectGate.reconcile` and `settle` take an approval id only: a write's unknown outcome can
    never be settled through the gate, and a replay of its message is refused forever."""
    tags = Tags()
    gate = make_gate(tags.table())
    args = {"ticket_id": "t-17", "tags": ["urgent"]}
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("tag", args, context("m1"))
    key = raised.value.key
    done = gate.reconcile(key)
    assert isinstance(done, Executed)
    record = store.get(key)
    assert record is not None
    assert record.status == "succeeded"
    again = gate.call("tag", args, context("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert tags.receiver.count("tag") == 1


# -- a reconcile hook's result with no JSON form


class Receipt:
    """A provider SDK's object with no JSON form."""


def test_a_found_effect_whose_result_has_no_json_form_is_still_settled(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """README: "A result ... with no JSON form still ran: the call is recorded executed with
    {"unserializable": TYPE} as its result ... never left in flight". A reconcile hook that finds
    the payment and returns the provider's own object raises out of `reconcile` instead (the
    store's JSON encoding fails inside the settling transaction), so the record stays
    needs_reconciliation for ever, however often it is reconciled."""
    bank = Bank()
    table = bank.table()
    spec = table["pay"]
    found = Reconciled(found=True, result=Receipt(), provider_ref="p1")
    gate = make_gate(table.replace(dataclasses.replace(spec, reconcile=lambda key: found)))
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    done = gate.reconcile(grant.approval_id)
    assert isinstance(done, Executed)
    assert done.result == {"unserializable": "Receipt"}
    assert status(store, grant.approval_id) == "executed"
    assert bank.runs == 1


# -- beyond the review: what the fixes chose


def test_recover_records_each_failed_reconciliation_and_logs_it(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grants = [pay_grant(gate, account=a, message=f"m-{a}") for a in ("a1", "a2")]
    for grant in grants:
        row = store.get_approval(grant.approval_id)
        assert row is not None
        store.claim(exec_key(grant), row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    bank.lookup_raises = True
    with caplog.at_level(logging.WARNING, logger="effectgate._reconcile"):
        touched = gate.recover()
    assert sorted(touched) == sorted(exec_key(g) for g in grants)
    failed = store.events(kind="reconcile_failed")
    assert sorted(e.approval_id or "" for e in failed) == sorted(g.approval_id for g in grants)
    assert all("ConnectionError: provider lookup is down" in e.detail_json for e in failed)
    assert sum("reconcile failed" in r.getMessage() for r in caplog.records) == 2
    bank.lookup_raises = False  # the lookup is back: each settles (nothing was applied: runs once)
    assert all(isinstance(gate.reconcile(g.approval_id), Executed) for g in grants)
    assert bank.receiver.count("pay") == 2


def test_a_run_again_under_a_changed_row_is_refused_and_changes_nothing(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """Not found at the provider, it would run again: that needs the row it was approved under.
    Refused `reclassified`, the record still awaits reconciliation, and a person can settle it."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    bank.applied.clear()  # the provider never saw it
    later = make_gate(
        gate.table.replace(dataclasses.replace(gate.table["pay"], owner="treasury")), keyring=gate.keyring
    )
    with pytest.raises(PolicyViolation) as raised:
        later.reconcile(grant.approval_id)
    assert raised.value.code == "reclassified"
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert bank.runs == 1
    assert later.settle(grant.approval_id, happened=False, by="fiona") is None
    assert status(store, grant.approval_id) == "failed"


def test_a_write_settled_as_not_happened_runs_again_on_its_next_call(
    store: SQLStore, make_gate: MakeGate
) -> None:
    tags = Tags()
    gate = make_gate(tags.table())
    args = {"ticket_id": "t-17", "tags": ["urgent"]}
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("tag", args, context("m1"))
    key = raised.value.key
    assert gate.settle(key, happened=False, by="ops") is None
    record = store.get(key)
    assert record is not None
    assert record.status == "failed"
    with pytest.raises(PolicyViolation) as again:  # settled: nothing more to settle, nothing changes
        gate.settle(key, happened=True, result={"x": 1}, by="ops")
    assert again.value.code == "not_reconcilable"
    rerun = gate.call("tag", args, context("m1"))
    assert isinstance(rerun, Executed)
    assert not rerun.replay
    assert rerun.idempotency_key == key
    assert tags.receiver.count("tag") == 2
    runs = [x for x in store.executions(tool="tag") if x.idempotency_key == key]
    assert [x.status for x in runs] == ["needs_reconciliation", "failed", "succeeded"]
    assert store.events(kind="released")[-1].user_id == runs[0].user_id


def test_a_write_found_by_its_hook_records_its_settlement_under_its_run(
    store: SQLStore, make_gate: MakeGate
) -> None:
    tags = Tags()
    gate = make_gate(tags.table())
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("tag", {"ticket_id": "t-17", "tags": ["urgent"]}, context("m1"))
    key = raised.value.key
    done = gate.reconcile(key, approver=Approver("olga", "ops"))
    assert isinstance(done, Executed)
    assert done.result == {"tags": ["urgent"]}
    first, settled = [x for x in store.executions(tool="tag") if x.idempotency_key == key]
    assert (first.status, settled.status) == ("needs_reconciliation", "succeeded")
    assert (settled.args_hash, settled.row_fingerprint) == (first.args_hash, first.row_fingerprint)
    assert "olga" in (settled.error or "")
    with pytest.raises(PolicyViolation) as again:
        gate.reconcile(key)
    assert again.value.code == "not_reconcilable"
    assert not gate.audit().findings


class WorkerDied(BaseException):
    """The worker's process died mid-call: after the effect, before its outcome was stored."""


class DyingTags(Tags):
    """`Tags` whose first call applies the tags and then dies with its worker."""

    def __init__(self) -> None:
        super().__init__()
        self.die = True

    def tag(self, ticket_id: str, tags: list[str], tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        out = super().tag(ticket_id, tags, tool_context)
        if self.die:
            self.die = False
            raise WorkerDied
        return out


def test_recover_reconciles_a_write_whose_worker_died(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A write's worker died after the effect: its record is left in flight. `recover()` turns it
    into needs_reconciliation and, the write's tool having a hook, reconciles it by its key as it
    does an approval's: found, it succeeds, and the call made again gets the stored result
    without a second effect."""
    tags = DyingTags()
    gate = make_gate(tags.table())
    args = {"ticket_id": "t1", "tags": ["vip"]}
    with pytest.raises(WorkerDied):
        gate.call("tag", args, context("m1"))
    [record] = store.idempotency_records()
    assert record.status == "in_progress"
    clock.advance(gate.policy.lease_seconds + 1)
    assert gate.recover() == [record.key]
    settled = store.get(record.key)
    assert settled is not None
    assert settled.status == "succeeded"
    again = gate.call("tag", args, context("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert again.result == {"tags": ["vip"]}
    assert tags.receiver.count("tag") == 1
