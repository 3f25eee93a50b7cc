"""Round 17: reconciliation and recovery (each reproduced first); on SQLite and PostgreSQL.

- Reconciling or settling an approval whose call had ended and whose arguments `redact` then
  erased (a person settling twice, the inbox's button pressed again) raised `TamperedRecord`
  ("the row was changed outside effectgate") and logged a tampered record at WARNING: a false
  alarm about a legitimate erasure. It is refused as not awaiting reconciliation
  (`not_reconcilable`), nothing changed, as the README says of anything not awaiting it.
- A write whose worker died, found by its own replay once its lease ran out (before any
  `recover()`), was turned `needs_reconciliation` silently by the claim: no notice, no
  `needs_reconciliation` event, and `recover()`, which looks only at records in flight, never saw
  it, so no one was told to reconcile it. Now the claim says it expired the lease
  (`NeedsReconciliation.expired`) and the write path announces it once, as `recover` does.

- A run that lost its lease and returned after its call was settled "did not happen" and the
  user's data erased recorded its execution with the arguments in clear, putting the erased
  personal data back into the ledger. Its values are now erased under the call's redaction.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from effectgate import EffectGate, ReconciliationNotice, Refused, ToolContext
from effectgate.errors import NeedsReconciliation, PolicyViolation
from effectgate.examples.shop import context
from effectgate.redact import redact
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE, Bank, Tags, pay_grant, status
from .conftest import MakeGate
from .test_round14_reconcile import StalledPay, stalled_then_settled_failed


def lost_payment(make_gate: MakeGate) -> tuple[EffectGate, Bank, str]:
    """A payment whose reply was lost: its approval awaits reconciliation."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    return gate, bank, grant.approval_id


@pytest.mark.parametrize("happened", [True, False], ids=["happened", "not-happened"])
def test_settling_again_after_the_erasure_is_not_reconcilable_not_tampered(
    store: SQLStore, make_gate: MakeGate, happened: bool, caplog: pytest.LogCaptureFixture
) -> None:
    gate, bank, approval_id = lost_payment(make_gate)
    gate.settle(approval_id, happened=happened, result={"ref": "p1"}, by="fiona")
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")
    ended = status(store, approval_id)
    record = store.get(f"eg_{approval_id}_v1")
    caplog.set_level(logging.WARNING, logger="effectgate._reconcile")
    for settle_again in (
        lambda: gate.settle(approval_id, happened=not happened, result={"ref": "p2"}, by="fiona"),
        lambda: gate.reconcile(approval_id, approver=FINANCE),
    ):
        with pytest.raises(PolicyViolation) as refused:
            settle_again()
        assert refused.value.code == "not_reconcilable"
    assert "tampered" not in caplog.text
    assert status(store, approval_id) == ended
    assert store.get(record.key) == record  # type: ignore[union-attr]
    assert bank.receiver.count("pay") == 1
    assert gate.audit().findings == []


def test_a_late_run_after_the_erasure_does_not_bring_the_erased_arguments_back(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)

    def erase() -> None:  # the call ended ("did not happen"): nothing of it is open
        redact(store, first.keyring, user_id="u1", by="dpo", reason="erasure request")

    grant = stalled_then_settled_failed(bank, first, other, clock, then=erase)
    recorded = [ex.args_json for ex in store.executions(approval_id=grant.approval_id)]
    assert len(recorded) == 2  # the settlement and the late run: the ledger shows both
    assert not any('"account":"a1"' in text for text in recorded)
    rows = [row for _, row in store.every_row()]
    assert not any('"a1"' in str(value) for row in rows for value in row.values())  # nowhere else either
    assert first.audit().findings == []  # each new marker has its sealed entry


class Died(BaseException):
    """The worker died while the tool ran (nothing of the gate runs after it: see `crash`)."""


class DyingTags(Tags):
    """A write whose worker dies once the service applied it."""

    def tag(self, ticket_id: str, tags: list[str], tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        super().tag(ticket_id, tags, tool_context)
        raise Died


def test_a_write_whose_expired_lease_its_replay_finds_is_announced_and_reconciled(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = DyingTags()
    notices: list[ReconciliationNotice] = []
    gate = make_gate(tags.table(), on_needs_reconciliation=notices.append)
    args = {"ticket_id": "t1", "tags": ["a"]}
    with monkeypatch.context() as dead:  # a dead worker releases nothing: its lease runs out
        dead.setattr(store, "release", lambda *_, **__: None)
        with pytest.raises(Died):
            gate.call("tag", args, context("m1"))
    [key] = tags.applied
    clock.advance(gate.policy.lease_seconds + 1)
    replay = gate.call("tag", args, context("m1"))  # the agent's retry, before any recover()
    assert isinstance(replay, Refused)
    assert replay.code == "needs_reconciliation"
    assert [n.key for n in notices] == [key]  # announced once, with its event
    assert [e.tool for e in store.events(kind="needs_reconciliation")] == ["tag"]
    assert gate.recover() == []  # not in flight any more: the claim handled it
    assert gate.call("tag", args, context("m1")) == replay  # asked again: not announced again
    assert len(notices) == 1
    assert gate.reconcile(key) is not None
    record = store.get(key)
    assert record is not None
    assert record.status == "succeeded"  # the hook found it applied
    assert tags.receiver.count("tag") == 1
