"""Rule seals: the gate records each rule (table row, policy) in `eg_rules` with a seal row
(`"seal:" + fingerprint`, kind "seal", the keyring's MAC of the rule's kind and fingerprint), and
the audit, given the keyring, judges an execution only by a recorded row whose seal verifies (or
which its sealed approval names). On SQLite and PostgreSQL (`shop_gate`)."""

from __future__ import annotations

from effectgate import Executed, Keyring
from effectgate._seal import rule_seal
from effectgate.audit import audit
from effectgate.canonical import canonical_json
from effectgate.examples.shop import context

from .conftest import ShopGate
from .test_audit_rules import _execution
from .test_redact import refund

TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}


def _unsealed_ledger(shop_gate: ShopGate) -> None:
    """The write row and the policy recorded as an earlier release did (no seal rows), and an
    ungated execution under them, before this gate has made any call."""
    gate = shop_gate.gate
    assert gate.store.rules() == {}
    spec, policy = gate.table["update_ticket_tags"], gate.policy
    with gate.store.transaction() as conn:
        gate.store.add_rules(
            conn,
            [
                (policy.fingerprint, "policy", canonical_json(policy.canonical()).decode()),
                (spec.fingerprint, "row", canonical_json(spec.canonical()).decode()),
            ],
        )
    _execution(gate, "update_ticket_tags", TAGS, idempotency_key="earlier-release")


def test_a_write_row_the_gate_records_is_sealed_and_its_executions_audit_clean(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    refund(gate, "m2", "1042", 1200)
    rules = gate.store.rules()
    for fingerprint, kind in (
        (gate.table["update_ticket_tags"].fingerprint, "row"),
        (gate.table["refund_order"].fingerprint, "row"),
        (gate.policy.fingerprint, "policy"),
    ):
        assert rules[fingerprint].kind == kind
        seal = rules["seal:" + fingerprint]
        assert seal.kind == "seal"
        assert gate.keyring.verifies("rule", f"{kind}|{fingerprint}".encode(), seal.body_json)
    report = audit(gate.store, keyring=gate.keyring)
    assert report.clean, report.findings
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_an_unsealed_rule_row_is_rule_missing_until_a_gate_of_this_release_uses_it(
    shop_gate: ShopGate,
) -> None:
    """A ledger of an earlier release: its rule rows have no seals, so an ungated execution under
    them is `rule_missing` (the audit cannot tell the row from one inserted in the database), and
    `no_approval` (under no rule it can use, it needed one, as under a row not recorded). The
    first call of this release's gate that uses the row seals it: the audit is clean again."""
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    findings = audit(gate.store, keyring=gate.keyring).findings
    assert [f.kind for f in findings] == ["rule_missing", "no_approval"]
    assert "not sealed by this keyring" in findings[0].detail
    rows_before = dict(gate.store.rules())
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m2")), Executed)
    rules = gate.store.rules()
    assert {fp: rules[fp] for fp in rows_before} == rows_before  # nothing rewritten: only seals added
    assert sorted(set(rules) - set(rows_before)) == sorted(
        "seal:" + fp for fp in (gate.table["update_ticket_tags"].fingerprint, gate.policy.fingerprint)
    )
    report = audit(gate.store, keyring=gate.keyring)
    assert report.clean, report.findings


def test_a_seal_of_another_keyring_does_not_vouch_for_a_row(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    with gate.store.transaction() as conn:
        gate.store.add_rules(
            conn, [rule_seal(Keyring.generate(), "row", gate.table["update_ticket_tags"].fingerprint)]
        )
    assert [f.kind for f in audit(gate.store, keyring=gate.keyring).findings] == [
        "rule_missing",
        "no_approval",
    ]


def test_without_a_keyring_rule_seals_are_not_checked(shop_gate: ShopGate) -> None:
    """The audit cannot verify a seal without the keyring: an unsealed row is taken as recorded,
    as before seals (`seals_checked` says so), and seal rows are no rules."""
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    report = audit(gate.store)
    assert report.clean, report.findings
    assert not report.seals_checked
    refund(gate, "m1", "1042", 1200)
    report = audit(gate.store, gate.table)
    assert report.clean, report.findings
    assert not report.seals_checked
