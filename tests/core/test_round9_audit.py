"""Round 9: the audit and the report against a ledger edited by someone with write access to the
database, and against the clock (an approval past its expiry that the gate has not swept yet).

Rows are written behind the gate's back (`Store.append_execution`, `Store.add_rules`, SQL), as such
an attacker would. Each test runs on SQLite and PostgreSQL (`store`); the clock is injected.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import effectgate.audit as audit_module
from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring, Pending, Policy, open_store
from effectgate.audit import audit
from effectgate.canonical import canonical_json, canonical_text, hash_of_text
from effectgate.effects import Effect
from effectgate.examples.shop import SHOP_POLICY, SUPPORT_AGENT, Shop, context
from effectgate.report import figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_failures import CardDeclined, Payments

#: A deployment that gates writes too: only reads run on their own.
STRICT = Policy(autonomous=frozenset({Effect.READ}))
TAGS = {"ticket_id": "t-17", "tags": ["refund"]}


def _write_execution(gate: EffectGate, **values: Any) -> None:
    """Append a succeeded execution of update_ticket_tags (a write) with no approval, as SQL would;
    `values` override its columns."""
    text = canonical_text(TAGS)
    row: dict[str, Any] = {
        "approval_id": None,
        "version": None,
        "tool": "update_ticket_tags",
        "effect": "write",
        "args_hash": hash_of_text("update_ticket_tags", text),
        "args_json": text,
        "idempotency_key": "forged-tags",
        "status": "succeeded",
        "session_id": "s-ada",
        "origin_message_id": "m-forged",
        "user_id": "u1",
        "agent_id": "support",
        "run_id": "run-1",
        "table_fingerprint": gate.table.fingerprint,
        "row_fingerprint": gate.table["update_ticket_tags"].fingerprint,
        "policy_fingerprint": gate.policy.fingerprint,
        "result_json": "{}",
        **values,
    }
    with gate.store.transaction() as conn:
        gate.store.append_execution(conn, **row)


def _table(shop: Shop) -> EffectTable:
    """The shop's table with its write tool held to an approver role (as a gated row needs)."""
    specs = list(shop.table())
    for i, spec in enumerate(specs):
        if spec.name == "update_ticket_tags":
            specs[i] = dataclasses.replace(spec, approver_role="support_lead")
    table = EffectTable(specs)
    table.allow_all(SUPPORT_AGENT)
    return table


def _strict_gate(make_gate: MakeGate) -> EffectGate:
    """A gate under STRICT whose write row and policy are recorded (and sealed) by a proposal."""
    gate = make_gate(_table(Shop()), policy=STRICT)
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Pending)
    assert audit(gate.store, keyring=gate.keyring).clean
    return gate


def test_an_ungated_write_under_the_strict_policy_is_no_approval(make_gate: MakeGate) -> None:
    """The baseline: a write run without approval under a policy that gates writes."""
    gate = _strict_gate(make_gate)
    _write_execution(gate)
    assert [f.kind for f in audit(gate.store, keyring=gate.keyring).findings] == ["no_approval"]


@pytest.mark.parametrize("named", ["inserted", "blank"])
def test_an_ungated_execution_cannot_borrow_a_policy_the_gate_never_sealed(
    make_gate: MakeGate, named: str
) -> None:
    """The same write, naming a policy inserted in the database (the default one, which lets
    writes run alone and is no `policy_weakened`), or no policy at all: the gate seals every
    policy it records and names one with every execution, so with the keyring the policy cannot
    vouch for the execution (`rule_missing`), and the audit is not clean."""
    gate = _strict_gate(make_gate)
    if named == "inserted":
        loose = Policy()
        with gate.store.transaction() as conn:
            gate.store.add_rules(
                conn, [(loose.fingerprint, "policy", canonical_json(loose.canonical()).decode())]
            )
        fingerprint = loose.fingerprint
    else:
        fingerprint = ""
    _write_execution(gate, policy_fingerprint=fingerprint)
    report = audit(gate.store, keyring=gate.keyring)
    assert not report.clean
    assert [f.kind for f in report.findings] == ["rule_missing"]


def test_a_policy_the_gate_sealed_still_vouches_for_an_ungated_execution(make_gate: MakeGate) -> None:
    """A read-only check of the fix: an execution under the gate's own (sealed) default policy,
    recorded by a gate of that policy, is clean (a write runs alone under it)."""
    gate = make_gate(_table(Shop()))
    assert gate.call("update_ticket_tags", TAGS, context("m1")) is not None
    gate.flush()
    assert audit(gate.store, keyring=gate.keyring).clean


@pytest.fixture
def shop_gate_at(store: SQLStore, clock: FakeClock) -> Any:
    gate = EffectGate(Shop().table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock)
    yield gate
    gate.close()


REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def test_an_approval_past_its_expiry_is_not_reported_pending(
    shop_gate_at: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    """A refund proposed and left: once its pending deadline (24 h) has passed, nobody can decide
    it, whether or not the gate has swept it yet. The report counts it expired, not pending, in
    the rates by tool, the decision rates and the audit's metrics."""
    gate = shop_gate_at
    assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    report = figures(store, keyring=gate.keyring)
    [rate] = report.metrics.decision_rates
    assert (rate.pending, rate.expired) == (1, 0)
    clock.advance(24 * 3600 + 1)  # nothing runs the sweep: the row still says pending
    report = figures(store, keyring=gate.keyring)
    [rate] = report.metrics.decision_rates
    assert (rate.pending, rate.expired, rate.settled) == (0, 1, 1)
    [by_tool] = report.by_tool
    assert (by_tool.undecided, by_tool.expired) == (1, 1)
    assert report.unverified == 0
    metrics = audit(store, keyring=gate.keyring).metrics
    assert metrics is not None
    assert metrics.expired == 1


def test_an_edited_approval_past_its_expiry_is_still_set_apart(
    shop_gate_at: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    """The same lapsed refund with a sealed column edited: the seal check counts it under mode
    "unverified" with the status the aggregate gave it (expired), never as live."""
    gate = shop_gate_at
    assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    clock.advance(24 * 3600 + 1)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET user_id = 'mallory'"))
    report = figures(store, keyring=gate.keyring)
    assert report.unverified == 1
    assert [(r.mode, r.expired) for r in report.by_tool] == [("unverified", 1)]


def test_an_approved_call_whose_run_failed_counts_as_approved(make_gate: MakeGate, clock: FakeClock) -> None:
    """A payment approved after 60 s whose run then failed definitely (its approval ends `failed`):
    a person approved it, as the report counts it (`APPROVED`), so the audit's metrics count it
    approved, with its latency, too."""
    payments = Payments()
    gate = make_gate(payments.table())
    out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
    assert isinstance(out, Pending)
    clock.advance(60)
    grant = gate.approve(out.approval_id, version=out.version, approver=Approver("fiona", "finance"))
    assert isinstance(grant, Grant)
    payments.failures = [CardDeclined("card declined")]
    with pytest.raises(CardDeclined):
        gate.execute(grant.token)
    assert payments.receiver.count() == 0
    [rate] = figures(gate.store).metrics.decision_rates
    assert rate.approved == 1
    report = audit(gate.store, keyring=gate.keyring)
    assert report.clean
    assert report.metrics is not None
    assert (report.metrics.approved, report.metrics.executions) == (1, 0)
    assert report.metrics.approval_latency_p95_s == 60.0


@pytest.mark.parametrize("edited", ["[1]", '"1042"', "null", "2"])
def test_arguments_edited_into_json_that_is_no_object_are_a_finding(
    shop_gate_at: EffectGate, store: SQLStore, edited: str
) -> None:
    """A refund (a row with escalation rules, which read the arguments) whose stored arguments
    were edited into JSON that is not an object: `args_tampered`, not an AttributeError out of the
    audit (exit 2, no report)."""
    gate = shop_gate_at
    assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET args_json = :text"), {"text": edited})
    report = audit(store, keyring=gate.keyring)
    assert [f.kind for f in report.findings] == ["args_tampered"]


@pytest.mark.parametrize("rule", ["policy", "row"])
def test_a_rule_body_edited_in_the_database_is_a_finding(tmp_path: Path, rule: str) -> None:
    """Lead 1 checked: the policy a refund was approved and run under edited in place (its second
    approver of destructive calls dropped, a role granted), or its table row (the escalation rule
    loosened): rules are content-addressed, so the edited body no longer hashes to the fingerprint
    the approval's seal names, and the approval and its execution are reported (`rule_missing`),
    with the keyring or without. SQLite: the append-only triggers are dropped first, as such an
    attacker would."""
    path = tmp_path / "ledger.db"
    store = open_store(f"sqlite:///{path}", clock=FakeClock())
    store.setup()
    gate = EffectGate(Shop().table(), store, policy=SHOP_POLICY, keyring=Keyring.generate())
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=Approver("fiona", "finance"))
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert audit(store, keyring=gate.keyring).clean
    fingerprint = gate.policy.fingerprint if rule == "policy" else gate.table["refund_order"].fingerprint
    body = json.loads(store.rules()[fingerprint].body_json)
    if rule == "policy":
        body.update(double_confirmation=[], role_grants={"support": ["finance"]})
    else:
        body["escalate"] = []
    keyring = gate.keyring
    gate.close()
    store.close()
    conn = sqlite3.connect(path)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("UPDATE eg_rules SET body_json = ? WHERE fingerprint = ?", (json.dumps(body), fingerprint))
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}")
    try:
        for key in (keyring, None):
            findings = audit(store, keyring=key).findings
            assert {f.kind for f in findings} == {"rule_missing"}
            assert {f.approval_id for f in findings} == {out.approval_id}
    finally:
        store.close()


def test_a_rule_first_recorded_while_the_audit_starts_is_no_finding(
    shop_gate_at: EffectGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit reads the recorded rules before its scan's transaction begins. A gate that first
    uses a tool in between (its row recorded with the approval, in one transaction) must not make
    that approval `rule_missing` on a clean ledger: rules are never removed, so the scan reads
    them again when one it needs is missing (as the report reads them after the calls)."""
    gate = shop_gate_at
    assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    email = {"to": ["ada@example.com"], "subject": "hello", "body": "hi"}

    class Between(audit_module.Scan):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            assert isinstance(gate.call("send_email", email, context("m2")), Pending)

    monkeypatch.setattr(audit_module, "Scan", Between)
    report = audit(store, keyring=gate.keyring)
    assert report.findings == []
    assert report.metrics is not None
    assert report.metrics.gated_proposals == 2
