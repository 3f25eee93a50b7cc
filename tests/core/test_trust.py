"""Re-derive at every boundary: a row edited in the database never decides or runs anything.

Each test changes the ledger behind the gate's back with plain SQL (the triggers that keep the
audit tables append-only are dropped first where the attack needs it), then asserts what the gate
does with the edited row and what the audit reports, counting effects at the receiver.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Keyring, PartialApproval, Pending, Policy
from effectgate.errors import (
    ApprovalError,
    PolicyViolation,
    StoreError,
    TamperedRecord,
    TokenError,
    WrongApprover,
)
from effectgate.examples.shop import SHOP_POLICY, Shop, app, context
from effectgate.stores import SQLStore
from effectgate.stores.sql import open_store
from effectgate.testing import FakeClock

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 6000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
PIA = Approver("pia", "privacy")
PETE = Approver("pete", "privacy")


def sql(store: SQLStore, statement: str, **params: Any) -> None:
    with store.transaction() as conn:
        conn.execute(sa.text(statement), params)


def unguard(store: SQLStore, table: str) -> None:
    """Drop the append-only triggers of `table`, as an attacker with database access could."""
    with store.transaction() as conn:
        if conn.dialect.name == "sqlite":
            for op in ("update", "delete"):
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_{op}")
        else:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")


def propose(gate: EffectGate, args: dict[str, Any] = REFUND, message: str = "m1") -> Pending:
    out = gate.call("refund_order", args, context(message))
    assert isinstance(out, Pending), out
    return out


def granted(gate: EffectGate) -> Grant:
    pending = propose(gate)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def kinds(gate: EffectGate) -> set[str]:
    return {f.kind for f in gate.audit().findings}


def status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status


def delete_pending(shop_gate: ShopGate) -> Pending:
    out = shop_gate.gate.call("delete_customer_data", {"customer_id": "u1"}, context("m-del"))
    assert isinstance(out, Pending), out
    return out


# -- execute re-derives the arguments


def test_edited_arguments_never_run(shop_gate: ShopGate, store: SQLStore) -> None:
    """A changed args_json with a valid grant is refused as tampered: nothing runs, the refusal is
    recorded, and the audit names the edit."""
    shop, gate = shop_gate
    grant = granted(gate)
    edited = json.dumps({**REFUND, "amount": 12000}, sort_keys=True)
    sql(store, "UPDATE eg_approvals SET args_json = :a WHERE id = :i", a=edited, i=grant.approval_id)
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "tampered"
    assert shop.receiver.count("refund") == 0
    assert status(store, grant.approval_id) == "approved"
    assert [e.detail_json for e in store.events(kind="token_refused")] == ['{"reason": "tampered"}']
    assert "args_tampered" in kinds(gate)


def test_edited_arguments_and_hash_never_run(shop_gate: ShopGate, store: SQLStore) -> None:
    """Editing the arguments and their hash together breaks the grant's MAC and the seal: refused."""
    shop, gate = shop_gate
    grant = granted(gate)
    args = {**REFUND, "amount": 12000}
    from effectgate.canonical import args_hash

    sql(
        store,
        "UPDATE eg_approvals SET args_json = :a, args_hash = :h WHERE id = :i",
        a=json.dumps(args, sort_keys=True),
        h=args_hash("refund_order", args),
        i=grant.approval_id,
    )
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason in ("forged", "tampered")
    assert shop.receiver.count("refund") == 0
    assert "seal_broken" in kinds(gate)


def test_edited_arguments_are_flagged_on_the_card(shop_gate: ShopGate, store: SQLStore) -> None:
    """A pending card whose stored arguments were edited carries the does-not-verify warning, and
    approving it is refused with nothing recorded."""
    _, gate = shop_gate
    pending = propose(gate)
    edited = json.dumps({**REFUND, "amount": 9000}, sort_keys=True)
    sql(store, "UPDATE eg_approvals SET args_json = :a WHERE id = :i", a=edited, i=pending.approval_id)
    assert any("does not verify" in w for w in gate.card(pending.approval_id).warnings)
    with pytest.raises(TamperedRecord):
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert store.all_decisions() == []
    assert status(store, pending.approval_id) == "pending"


# -- the bar comes from the table, not from mutable columns


def test_lowered_role_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """Editing approver_role to a role the attacker holds does not let that role approve."""
    shop, gate = shop_gate
    pending = propose(gate)
    sql(store, "UPDATE eg_approvals SET approver_role = 'support' WHERE id = :i", i=pending.approval_id)
    with pytest.raises(ApprovalError):
        gate.approve(pending.approval_id, version=1, approver=Approver("mallory", "support"))
    with pytest.raises(TamperedRecord):
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert status(store, pending.approval_id) == "pending"
    assert store.all_decisions() == []
    assert {"seal_broken", "bar_lowered"} <= kinds(gate)
    assert shop.receiver.count("refund") == 0


def test_lowered_approvals_required_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """Editing approvals_required from 2 to 1 on a destructive call does not let one approver grant it."""
    shop, gate = shop_gate
    pending = delete_pending(shop_gate)
    sql(store, "UPDATE eg_approvals SET approvals_required = 1 WHERE id = :i", i=pending.approval_id)
    with pytest.raises(TamperedRecord):
        gate.approve(pending.approval_id, version=1, approver=PIA)
    assert status(store, pending.approval_id) == "pending"
    assert store.all_decisions() == []
    assert {"seal_broken", "bar_lowered"} <= kinds(gate)
    assert shop.receiver.count("delete") == 0


def test_forged_decision_does_not_count(shop_gate: ShopGate, store: SQLStore) -> None:
    """A decision row inserted by hand (no valid seal) is not a second approver: one real approval
    stays partial, and the audit reports the forgery."""
    shop, gate = shop_gate
    pending = delete_pending(shop_gate)
    with store.transaction() as conn:
        store.add_decision(
            conn,
            approval_id=pending.approval_id,
            version=1,
            grant_round=0,
            approver_id="pete",
            role="privacy",
            decision="approve",
            seal="k1.forged",
        )
    out = gate.approve(pending.approval_id, version=1, approver=PIA)
    assert isinstance(out, PartialApproval)
    assert (out.approvals, out.required) == (1, 2)
    assert status(store, pending.approval_id) == "pending"
    assert "decision_forged" in kinds(gate)
    assert shop.receiver.count("delete") == 0


def test_deleted_decision_is_flagged_by_the_audit(shop_gate: ShopGate, store: SQLStore) -> None:
    """Deleting one of two approvals of an executed destructive call leaves the audit unclean."""
    shop, gate = shop_gate
    pending = delete_pending(shop_gate)
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=PIA), PartialApproval)
    grant = gate.approve(pending.approval_id, version=1, approver=PETE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop.receiver.count("delete") == 1
    assert gate.audit().clean
    unguard(store, "eg_decisions")
    sql(store, "DELETE FROM eg_decisions WHERE approver_id = 'pete'")
    findings = gate.audit().findings
    assert [(f.kind, f.approval_id) for f in findings] == [("not_approved", pending.approval_id)]


def test_execute_counts_the_approvers_again(shop_gate: ShopGate, store: SQLStore) -> None:
    """Execute re-counts sealed approvals: a grant whose second decision was deleted does not run."""
    shop, gate = shop_gate
    pending = delete_pending(shop_gate)
    gate.approve(pending.approval_id, version=1, approver=PIA)
    grant = gate.approve(pending.approval_id, version=1, approver=PETE)
    assert isinstance(grant, Grant)
    unguard(store, "eg_decisions")
    sql(store, "DELETE FROM eg_decisions WHERE approver_id = 'pete'")
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "tampered"
    assert shop.receiver.count("delete") == 0


def test_extended_grant_expiry_does_not_extend_the_grant(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """The signed expiry in the token decides: a stored expiry moved later does not revive a grant."""
    shop, gate = shop_gate
    grant = granted(gate)
    clock.advance(gate.policy.token_ttl + 1)
    sql(
        store,
        "UPDATE eg_approvals SET token_expires_at = :t WHERE id = :i",
        t=clock.now() + 10_000,
        i=grant.approval_id,
    )
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "expired"
    assert shop.receiver.count("refund") == 0


def test_policy_changed_since_the_proposal_needs_a_fresh_one(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """An approval proposed under one policy cannot be decided under another."""
    _, gate = shop_gate
    pending = propose(gate)
    looser = Policy(role_grants={"finance_lead": frozenset({"finance"}), "support": frozenset({"finance"})})
    other = EffectGate(gate.table, store, policy=looser, keyring=gate.keyring, clock=clock)
    try:
        with pytest.raises(PolicyViolation) as raised:
            other.approve(pending.approval_id, version=1, approver=FINANCE)
        assert raised.value.code == "reclassified"
    finally:
        other.close()
    assert store.all_decisions() == []


# -- two-person rules and self-approval


def test_regrant_of_a_destructive_call_needs_two_approvers_again(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A lapsed destructive grant is granted again only by two distinct approvers, and runs once."""
    shop, gate = shop_gate
    pending = delete_pending(shop_gate)
    gate.approve(pending.approval_id, version=1, approver=PIA)
    first = gate.approve(pending.approval_id, version=1, approver=PETE)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.token_ttl + 1)
    again = gate.approve(pending.approval_id, version=1, approver=PIA)
    assert isinstance(again, PartialApproval)
    assert (again.approvals, again.required) == (1, 2)
    with pytest.raises(WrongApprover):
        gate.approve(pending.approval_id, version=1, approver=PIA)
    second = gate.approve(pending.approval_id, version=1, approver=PETE)
    assert isinstance(second, Grant)
    with pytest.raises(TokenError):
        gate.execute(first.token)
    gate.execute(second.token)
    assert shop.receiver.count("delete") == 1
    assert gate.audit().clean


def test_requesting_user_may_not_approve_their_own_call(shop_gate: ShopGate, store: SQLStore) -> None:
    """The user who made the call cannot approve it, even holding the role."""
    _, gate = shop_gate
    pending = propose(gate)
    with pytest.raises(WrongApprover) as raised:
        gate.approve(pending.approval_id, version=1, approver=Approver("u1", "finance"))
    assert "Policy.self_approval" in str(raised.value)
    assert store.all_decisions() == []


def test_self_approval_when_the_policy_allows_it(store: SQLStore, clock: FakeClock) -> None:
    """With `Policy(self_approval=True)` the requester may approve; the audit does not flag it."""
    shop = Shop()
    gate = EffectGate(
        shop.table(),
        store,
        policy=Policy(role_grants=SHOP_POLICY.role_grants, self_approval=True),
        keyring=Keyring.generate(),
        clock=clock,
    )
    try:
        grant = gate.approve(propose(gate).approval_id, version=1, approver=Approver("u1", "finance"))
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        assert shop.receiver.count("refund") == 1
        assert gate.audit().clean
    finally:
        gate.close()


def test_self_approval_written_into_the_ledger_is_flagged(shop_gate: ShopGate, store: SQLStore) -> None:
    """A validly sealed decision by the requester under a policy that forbids it is an audit finding."""
    _, gate = shop_gate
    pending = propose(gate)
    from effectgate._seal import seal_decision

    values = {
        "approval_id": pending.approval_id,
        "version": 1,
        "grant_round": 0,
        "approver_id": "u1",
        "role": "finance",
        "decision": "approve",
    }
    with store.transaction() as conn:
        store.add_decision(conn, seal=seal_decision(gate.keyring, values), **values)
    assert "self_approved" in kinds(gate)


# -- policies that weaken the defaults are findings


@pytest.mark.parametrize(
    ("policy", "weakness"),
    [
        (Policy(autonomous=frozenset({"read", "write", "money"})), "money runs without approval"),  # type: ignore[arg-type]
        (Policy(double_confirmation=frozenset()), "destructive needs only one approver"),
    ],
    ids=["money-autonomous", "single-destructive"],
)
def test_weakened_policy_is_an_audit_finding(
    store: SQLStore, clock: FakeClock, policy: Policy, weakness: str
) -> None:
    """A policy that lets money run alone, or drops the second destructive approver, is reported."""
    shop = Shop()
    gate = EffectGate(shop.table(), store, policy=policy, keyring=Keyring.generate(), clock=clock)
    try:
        if Policy.gates(policy, "money"):  # type: ignore[arg-type]
            pending = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m1"))
            assert isinstance(pending, Pending)
            grant = gate.approve(pending.approval_id, version=1, approver=PIA)
            assert isinstance(grant, Grant)
            gate.execute(grant.token)
            assert shop.receiver.count("delete") == 1
        else:
            gate.call("refund_order", REFUND, context("m1"))
            assert shop.receiver.count("refund") == 1
        findings = [f for f in gate.audit().findings if f.kind == "policy_weakened"]
        assert findings
        assert weakness in findings[0].detail
    finally:
        gate.close()


def test_default_policy_is_not_weakened() -> None:
    """The default policy has nothing to report."""
    assert Policy().weakened() == []


# -- the schema version is checked on open


def test_another_schema_version_is_refused_and_left_alone(store_url: str, clock: FakeClock) -> None:
    """A database of another schema version is refused on open, by the gate and by setup, and
    nothing is read from it or written to it."""
    first = open_store(store_url, clock=clock)
    first.setup()
    sql(first, "UPDATE eg_schema_version SET version = 99")
    first.close()
    store = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="schema version 99"):
            EffectGate(Shop().table(), store, keyring=Keyring.generate(), clock=clock)
        with pytest.raises(StoreError, match="schema version 99"):
            store.setup()
        with pytest.raises(StoreError, match="schema version 99"):
            store.claim("k", "h")
    finally:
        store.close()
    raw = sa.create_engine(store_url)
    try:
        with raw.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM eg_idempotency")).scalar_one() == 0
            assert conn.execute(sa.text("SELECT version FROM eg_schema_version")).scalar_one() == 99
    finally:
        raw.dispose()


def test_database_without_the_schema_is_refused(store_url: str, clock: FakeClock) -> None:
    """A database that was never set up is refused with the command that sets it up."""
    store = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="effectgate setup"):
            app(store, keyring=Keyring.generate(), clock=clock)
    finally:
        store.close()


@pytest.mark.parametrize("approval_id", ["0-before-every-id", "zzzz-after-every-id"])
def test_execution_naming_a_missing_approval_is_flagged(
    shop_gate: ShopGate, store: SQLStore, approval_id: str
) -> None:
    """The audit merges approvals, decisions and executions by approval id: an execution whose
    approval does not exist is reported wherever its id sorts among the real ones."""
    _, gate = shop_gate
    grant = granted(gate)
    gate.execute(grant.token)
    from effectgate.canonical import canonical_text, hash_of_text

    text = canonical_text(REFUND)
    with store.transaction() as conn:
        store.append_execution(
            conn,
            approval_id=approval_id,
            version=1,
            tool="refund_order",
            effect="money",
            args_hash=hash_of_text("refund_order", text),
            args_json=text,
            idempotency_key="rogue",
            status="succeeded",
            session_id="s-ada",
            origin_message_id="m9",
            user_id="u1",
            agent_id="support",
            table_fingerprint="t",
            row_fingerprint=gate.table["refund_order"].fingerprint,
            policy_fingerprint=gate.policy.fingerprint,
        )
    findings = gate.audit().findings
    assert [(f.kind, f.approval_id) for f in findings] == [("no_approval", approval_id)]
