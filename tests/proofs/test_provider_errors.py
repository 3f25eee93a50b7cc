"""How the provider's answers become outcomes, with respx standing in for the provider.

The tool is the same `Refunds.refund` the crash proofs run. What must hold: a timeout, a 409
"in progress" or a 5xx is an unknown outcome (needs_reconciliation, never failed, never retried
with the same grant); only a failure the row declares definite (a 402 "declined") fails, and then
the approval ends `failed`, the grant is spent and a new request is a new proposal; a 202 keeps
the provider's processing id on the record until reconciliation settles it by key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from effectgate import EffectGate, Keyring, ReconciliationNotice
from effectgate._execution import exec_key
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._money import ProviderError, Refunds, grant, money_table

BASE = "https://provider.test"
CHARGE = {"id": "re_1", "status": "succeeded", "order_id": "o-1", "amount": 1250}


@pytest.fixture
def provider() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
def notices() -> list[ReconciliationNotice]:
    return []


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, notices: list[ReconciliationNotice]) -> Iterator[EffectGate]:
    refunds = Refunds(BASE)
    gate = EffectGate(
        money_table(refunds),
        store,
        keyring=Keyring.generate(),
        clock=clock,
        on_needs_reconciliation=notices.append,
    )
    yield gate
    gate.close()
    refunds.close()


def key_of(gate: EffectGate, approval_id: str) -> str:
    row = gate.store.get_approval(approval_id)
    assert row is not None
    return exec_key(row)


def sent_keys(route: respx.Route) -> list[str | None]:
    return [call.request.headers.get("Idempotency-Key") for call in route.calls]


def assert_parked(gate: EffectGate, approval_id: str, notices: list[ReconciliationNotice]) -> Any:
    """The record waits for reconciliation, the approval is not executed, finance was told."""
    key = key_of(gate, approval_id)
    record = gate.store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    row = gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "approved"
    assert [(n.key, n.approval_id, n.approver_role) for n in notices] == [(key, approval_id, "finance")]
    assert [e.status for e in gate.store.executions(approval_id=approval_id)] == ["needs_reconciliation"]
    return record


def test_timeout_needs_reconciliation_and_is_not_retried(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice]
) -> None:
    """A timeout after sending parks the refund for reconciliation; the grant again calls nobody."""
    route = provider.post("/refunds").mock(side_effect=httpx.ReadTimeout("no answer"))
    granted = grant(gate, "o-1")
    with pytest.raises(NeedsReconciliation):
        gate.execute(granted.token)
    record = assert_parked(gate, granted.approval_id, notices)
    assert "ReadTimeout" in (record.error or "")
    with pytest.raises(NeedsReconciliation):
        gate.execute(granted.token)
    assert gate.recover() == []
    assert route.call_count == 1
    assert sent_keys(route) == [record.key]
    assert gate.store.get(record.key).status == "needs_reconciliation"  # type: ignore[union-attr]
    assert gate.audit().clean


def test_conflict_in_progress_is_an_unknown_outcome(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice]
) -> None:
    """A 409 "in progress" from the provider is treated as unknown: needs_reconciliation, not failed."""
    route = provider.post("/refunds").respond(409, json={"error": "a request with this key is in progress"})
    granted = grant(gate, "o-1")
    with pytest.raises(NeedsReconciliation) as raised:
        gate.execute(granted.token)
    record = assert_parked(gate, granted.approval_id, notices)
    assert raised.value.key == record.key
    assert "in progress" in (record.error or "")
    assert route.call_count == 1


def test_server_error_is_an_unknown_outcome(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice]
) -> None:
    """A 5xx is not declared definite: the provider may have acted, so the refund is parked for
    reconciliation and the same grant never calls the provider again."""
    route = provider.post("/refunds").respond(503, json={"error": "unavailable"})
    granted = grant(gate, "o-1")
    with pytest.raises(NeedsReconciliation):
        gate.execute(granted.token)
    record = assert_parked(gate, granted.approval_id, notices)
    assert "503" in (record.error or "")
    with pytest.raises(NeedsReconciliation):
        gate.execute(granted.token)
    assert route.call_count == 1
    assert gate.audit().clean


@pytest.mark.parametrize("failure", ["declined", "never_sent"])
def test_declared_definite_failure_ends_the_approval_failed(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice], failure: str
) -> None:
    """A failure the row declares definite (402 declined, a connection never made) ends the
    approval `failed`: the grant is spent, the subject is free for a new proposal, which runs
    once under its own key; nobody is paged."""
    declined = httpx.Response(402, json={"error": "card declined"})
    first: Any = declined if failure == "declined" else httpx.ConnectError("refused")
    route = provider.post("/refunds").mock(side_effect=[first, httpx.Response(201, json=CHARGE)])
    granted = grant(gate, "o-1")
    key = key_of(gate, granted.approval_id)
    with pytest.raises(ProviderError):
        gate.execute(granted.token)
    record = gate.store.get(key)
    assert record is not None
    assert record.status == "failed"
    row = gate.store.get_approval(granted.approval_id)
    assert row is not None
    assert row.status == "failed"
    with pytest.raises(TokenError) as used:
        gate.execute(granted.token)
    assert used.value.reason == "used"
    again = grant(gate, "o-1", message="m-retry")
    assert again.approval_id != granted.approval_id
    outcome = gate.execute(again.token)
    assert outcome.result == CHARGE
    new_key = key_of(gate, again.approval_id)
    assert sent_keys(route) == [key, new_key]  # the second call is the new proposal's, own key
    assert notices == []
    assert gate.audit().clean


def test_processing_keeps_the_provider_ref_until_reconciled_by_key(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice]
) -> None:
    """A 202 parks the refund with its processing id on the record; reconciliation by key settles it."""
    post = provider.post("/refunds").respond(202, json={"id": "pr_77", "status": "processing"})
    granted = grant(gate, "o-1")
    with pytest.raises(NeedsReconciliation) as raised:
        gate.execute(granted.token)
    assert raised.value.provider_ref == "pr_77"
    record = assert_parked(gate, granted.approval_id, notices)
    assert record.provider_ref == "pr_77"
    assert notices[0].provider_ref == "pr_77"

    lookup = provider.get(f"/refunds/{record.key}").respond(200, json=CHARGE)
    settled = gate.reconcile(granted.approval_id)
    assert settled is not None
    assert settled.result == CHARGE
    assert lookup.call_count == 1
    assert post.call_count == 1, "reconciliation asked; it did not charge again"
    record = gate.store.get(record.key)
    assert record is not None
    assert (record.status, record.result) == ("succeeded", CHARGE)
    row = gate.store.get_approval(granted.approval_id)
    assert row is not None
    assert row.status == "executed"
    assert gate.result(granted.approval_id) is not None
    assert gate.audit().clean
