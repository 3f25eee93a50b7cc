"""recover() over an idempotency key edited in the database, on SQLite and PostgreSQL: a version
part that `str.isdigit` accepts but `int` does not ("²") stopped the whole pass after that
record's lease was expired (no needs_reconciliation event, no page for it, the records after
it left for a later pass); a non-ASCII digit ("٣") named version 3 of an approval."""

from __future__ import annotations

import json

import pytest

from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate


@pytest.mark.parametrize("version", ["²", "٣"])
def test_recover_handles_every_record_whatever_its_key(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, version: str
) -> None:
    _, gate = shop_gate
    odd, plain = f"eg_abc_v{version}", "eg_def_v1"
    for key in (odd, plain):
        store.claim(key, "0" * 64, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    assert sorted(gate.recover()) == sorted([odd, plain])
    for key in (odd, plain):
        record = store.get(key)
        assert record is not None
        assert record.status == "needs_reconciliation"
    events = store.events(kind="needs_reconciliation")
    assert sorted(json.loads(e.detail_json)["key"] for e in events) == sorted([odd, plain])
    assert all(e.approval_id is None for e in events)  # neither names a known approval
