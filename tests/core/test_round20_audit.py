"""Round 20: the audit over a ledger edited with plain SQL (the append-only triggers dropped, as
the database's owner can). A clean audit must prove what the gate enforced: a grant runs only by
the sealed approvers of the round that minted it, as `execute` counts them. Each test runs on
SQLite and PostgreSQL (`shop_gate`); the clock is injected.
"""

from __future__ import annotations

import pytest

import effectgate.audit as audit_module
from effectgate import Approver, EffectGate, Grant, Pending
from effectgate.audit import audit
from effectgate.examples.shop import context
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_round12_audit import FINANCE, REFUND, edit

PAT = Approver("pat", "finance")


def findings(gate: EffectGate) -> list[tuple[str, str | None]]:
    return [(f.kind, f.approval_id) for f in audit(gate.store, keyring=gate.keyring).findings]


def regranted(gate: EffectGate, clock: FakeClock, message: str = "m1") -> str:
    """A refund granted by fiona whose grant lapsed unused, granted again by pat in a new round
    and run; its approval id."""
    pending = gate.call("refund_order", REFUND, context(message))
    assert isinstance(pending, Pending)
    first = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.token_ttl + 1)
    again = gate.approve(pending.approval_id, version=pending.version, approver=PAT)
    assert isinstance(again, Grant)
    gate.execute(again.token)
    return pending.approval_id


def test_a_run_whose_granting_round_was_deleted_is_not_approved_by_a_lapsed_round(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """fiona's grant lapsed unused; pat granted the refund again (round 1) and it ran. pat's
    decision deleted, the ledger no longer shows who granted what ran: execute counts only the
    round that minted the last grant, so the audit must not let fiona's lapsed round vouch for it."""
    shop, gate = shop_gate
    approval_id = regranted(gate, clock)
    assert shop.receiver.count("refund") == 1
    assert findings(gate) == []
    edit(gate.store, "DELETE FROM eg_decisions WHERE approval_id = :a AND approver_id = 'pat'", a=approval_id)
    assert findings(gate) == [("not_approved", approval_id)]


def test_a_run_of_a_grant_given_back_is_not_approved(shop_gate: ShopGate) -> None:
    """fiona's grant was given back unpresented (a sealed release of its round): execute refuses
    it whatever its stored expiry says. An execution row of it appended (as SQL would, under the
    grant's own key) says a released grant ran: the released round grants nothing."""
    shop, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.release(grant.token)
    assert findings(gate) == []
    ran(gate, pending.approval_id)
    assert shop.receiver.count("refund") == 0
    assert findings(gate) == [("not_approved", pending.approval_id)]


def ran(gate: EffectGate, approval_id: str) -> None:
    """Append a succeeded execution of the approval's version 1, as SQL would."""
    row = gate.store.get_approval(approval_id)
    assert row is not None
    with gate.store.transaction() as conn:
        gate.store.append_execution(
            conn,
            approval_id=approval_id,
            version=1,
            tool=row.tool,
            effect=row.effect,
            args_hash=row.args_hash,
            args_json=row.args_json,
            idempotency_key=f"eg_{approval_id}_v1",
            status="succeeded",
            session_id=row.session_id,
            origin_message_id=row.origin_message_id,
            user_id=row.user_id,
            agent_id=row.agent_id,
            table_fingerprint=row.table_fingerprint,
            row_fingerprint=row.row_fingerprint,
            policy_fingerprint=row.policy_fingerprint,
            result_json="{}",
        )


def test_a_split_scan_reports_the_lapsed_rounds_run_as_one_scan_does(
    shop_gate: ShopGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ledger, large enough to split (a second process scans the upper half of the
    approval ids): the same findings, in the same order."""
    _, gate = shop_gate
    ids = [regranted(gate, clock, f"m{i}") for i in range(3)]
    for approval_id in ids[::2]:
        sql = "DELETE FROM eg_decisions WHERE approval_id = :a AND approver_id = 'pat'"
        edit(gate.store, sql, a=approval_id)
    one = findings(gate)
    assert sorted(one) == sorted(("not_approved", a) for a in ids[::2])
    gate.close()  # no background thread: the scan may fork
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
    assert findings(gate) == one
