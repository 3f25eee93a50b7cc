"""How the provider's answers become outcomes, with respx standing in for the provider.

The tool is the same `Refunds.refund` the crash proofs run. What must hold: a timeout or a 409
"in progress" is an unknown outcome (needs_reconciliation, never failed, never retried on its
own); a 5xx is a definite failure that the same grant may retry with the same key; a 202 keeps
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

from ._money import Refunds, grant, money_table

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


def test_server_error_fails_and_the_grant_retries_with_the_same_key(
    gate: EffectGate, provider: respx.MockRouter, notices: list[ReconciliationNotice]
) -> None:
    """A 5xx is a definite failure; the same grant calls the provider again with the same Idempotency-Key."""
    route = provider.post("/refunds").mock(
        side_effect=[httpx.Response(503, json={"error": "unavailable"}), httpx.Response(201, json=CHARGE)]
    )
    granted = grant(gate, "o-1")
    key = key_of(gate, granted.approval_id)
    with pytest.raises(Exception, match="provider answered 503"):
        gate.execute(granted.token)
    record = gate.store.get(key)
    assert record is not None
    assert record.status == "failed"
    outcome = gate.execute(granted.token)
    assert (outcome.result, outcome.replay, outcome.idempotency_key) == (CHARGE, False, key)
    assert route.call_count == 2
    assert sent_keys(route) == [key, key]
    record = gate.store.get(key)
    assert record is not None
    assert (record.status, record.attempts) == ("succeeded", 2)
    assert [e.status for e in gate.store.executions(approval_id=granted.approval_id)] == [
        "failed",
        "succeeded",
    ]
    with pytest.raises(TokenError) as used:
        gate.execute(granted.token)
    assert used.value.reason == "used"
    assert route.call_count == 2
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
