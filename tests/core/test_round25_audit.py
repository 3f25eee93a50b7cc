"""Round 25 review of the audit: an approval's status column (no seal covers it) edited into a
status the gate writes only with a sealed decision ("denied") or only before any grant ("rejected",
a scope refusal): the gate never writes either so, and the audit, which proves the ledger, names
it. Each test runs on SQLite and PostgreSQL (`shop_gate`)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import effectgate.audit as audit_module
from effectgate import EffectGate, Grant
from effectgate.audit import audit

from .conftest import ShopGate
from .test_round12_audit import refund
from .test_round21_audit import FINANCE, findings, proposed, set_status


@pytest.mark.parametrize("status", ["denied", "rejected"])
def test_a_granted_approval_edited_to_denied_or_rejected_is_a_finding(
    shop_gate: ShopGate, status: str
) -> None:
    """A refund granted (its sealed count of grants is 1, no sealed denial), its status edited to
    denied or rejected: the audit read it clean (and counted it so)."""
    _, gate = shop_gate
    approval_id = proposed(gate)
    assert isinstance(gate.approve(approval_id, version=1, approver=FINANCE), Grant)
    set_status(gate, approval_id, status)
    assert findings(gate) == [("status_tampered", approval_id)]


@pytest.mark.parametrize("status", ["denied", "rejected"])
def test_an_executed_refund_edited_to_denied_or_rejected_is_a_finding(
    shop_gate: ShopGate, status: str
) -> None:
    """A refund that ran, its status edited so that the metrics count it denied or rejected."""
    _, gate = shop_gate
    approval_id = refund(gate, "m1")
    set_status(gate, approval_id, status)
    assert findings(gate) == [("status_tampered", approval_id)]


def test_a_pending_approval_edited_to_denied_is_a_finding(shop_gate: ShopGate) -> None:
    """No sealed denial of the version: the gate never wrote "denied" (its deny seals a decision
    in the same transaction), and a reviewer's deny still lands."""
    _, gate = shop_gate
    approval_id = proposed(gate)
    set_status(gate, approval_id, "denied")
    assert findings(gate) == [("status_tampered", approval_id)]


def delete_approval(gate: EffectGate, approval_id: str) -> None:
    with gate.store.transaction() as conn:  # eg_approvals is not append-only: a delete goes through
        conn.execute(sa.text("DELETE FROM eg_approvals WHERE id = :i"), {"i": approval_id})


def test_a_denied_approval_deleted_is_a_finding(shop_gate: ShopGate) -> None:
    """A refund denied, then its approval row deleted: its sealed denial is all that is left of it
    (the gate never deletes an approval), and the audit read the ledger clean."""
    _, gate = shop_gate
    kept = refund(gate, "m0")
    approval_id = proposed(gate, "m1", "1043", 500)
    gate.deny(approval_id, approver=FINANCE, reason="not this one")
    delete_approval(gate, approval_id)
    assert findings(gate) == [("no_approval", approval_id)]
    assert kept != approval_id


def test_the_last_approval_deleted_with_two_decisions_is_one_finding(shop_gate: ShopGate) -> None:
    """The decisions of a deleted approval after every other approval's (the end of the stream):
    one finding for the approval, however many decisions name it."""
    _, gate = shop_gate
    approval_id = refund(gate, "m1")
    gate.deny(proposed(gate, "m2", "1043", 500), approver=FINANCE, reason="no")
    with gate.store.reading() as conn:
        last = conn.execute(sa.text("SELECT max(id) FROM eg_approvals")).scalar_one()
    if last == approval_id:  # the run's: its execution is a finding of its own too
        delete_approval(gate, approval_id)
        assert [k for k, _ in findings(gate)] == ["no_approval", "no_approval"]
    else:
        delete_approval(gate, last)
        assert findings(gate) == [("no_approval", last)]


def test_a_split_scan_reports_a_deleted_approval_as_one_scan_does(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gate = shop_gate
    ids = []
    for i in range(6):  # one subject: each proposed once the one before was denied
        ids.append(proposed(gate, f"m{i}", "1043", 500 + i))
        gate.deny(ids[-1], approver=FINANCE, reason="no")
    for approval_id in ids[1::2]:
        delete_approval(gate, approval_id)
    one = audit(gate.store, keyring=gate.keyring).findings
    assert sorted((f.kind, f.approval_id) for f in one) == sorted(("no_approval", i) for i in ids[1::2])
    gate.close()  # no background thread: the scan may fork
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
    halves: list[object] = []
    fork = audit_module._fork_half

    def forked(*args: Any) -> Any:
        halves.append(fork(*args))
        return halves[-1]

    monkeypatch.setattr(audit_module, "_fork_half", forked)
    assert audit(gate.store, keyring=gate.keyring).findings == one
    assert halves[0] is not None  # it did split


def test_a_decision_inserted_for_no_approval_is_forged(shop_gate: ShopGate) -> None:
    _, gate = shop_gate
    refund(gate, "m1")
    with gate.store.transaction() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO eg_decisions (approval_id, version, grant_round, approver_id, role, decision, "
                "reason, at, seal) VALUES ('zz-none', 1, 0, 'fiona', 'finance', 'approve', '', 0, 'forged')"
            )
        )
    assert findings(gate) == [("decision_forged", "zz-none")]
