"""A provider's reference a reconcile hook returns is stored as text: one holding a lone surrogate
(bytes a provider's client decoded with surrogateescape) raised the store's raw error out of
`reconcile` after the provider had answered "it happened", leaving the record awaiting
reconciliation. It is stored escaped, as an exception's reference already was."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Executed, Reconciled
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE, Bank, pay_grant, status
from .conftest import MakeGate


class OddRefBank(Bank):
    def lookup(self, key: str) -> Reconciled | None:
        found = super().lookup(key)
        assert found is not None
        return Reconciled(found=found.found, result=found.result, provider_ref="ref-\udcff")


def test_a_hooks_reference_with_a_lone_surrogate_is_stored_escaped(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    bank = OddRefBank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    bank.lose_reply = 1
    with pytest.raises(Exception):  # noqa: B017, PT011 - the lost reply: an unknown outcome
        gate.execute(grant.token)
    out: Any = gate.reconcile(grant.approval_id, approver=FINANCE)
    assert isinstance(out, Executed)
    assert bank.receiver.count("pay") == 1
    assert status(store, grant.approval_id) == "executed"
    record = store.get(f"eg_{grant.approval_id}_v{grant.version}")
    assert record is not None
    assert record.status == "succeeded"
    assert record.provider_ref is not None
    assert "\udcff" not in record.provider_ref
