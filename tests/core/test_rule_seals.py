"""Rule seals: the gate records each rule (table row, policy) in `eg_rules` with a seal row
(`"seal:<fingerprint>:<hash of the seal>"`, kind "seal", the keyring's MAC of the rule's kind and
fingerprint), and the audit, given the keyring, judges an execution only by a recorded row whose
seal verifies (or which its sealed approval names); `seal_rules` seals an earlier release's rows
on an operator's word. On SQLite and PostgreSQL (`shop_gate`)."""

from __future__ import annotations

import json

import pytest

from effectgate import Executed, Keyring
from effectgate._seal import rule_seal
from effectgate.audit import audit, seal_rules
from effectgate.canonical import canonical_json
from effectgate.cli import main
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
        key, seal_kind, seal = rule_seal(gate.keyring, kind, fingerprint)
        assert rules[key].kind == seal_kind == "seal"
        assert rules[key].body_json == seal
        assert gate.keyring.verifies("rule", f"{kind}|{fingerprint}".encode(), seal)
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
        rule_seal(gate.keyring, kind, fp)[0]
        for fp, kind in (
            (gate.table["update_ticket_tags"].fingerprint, "row"),
            (gate.policy.fingerprint, "policy"),
        )
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


def test_seal_rules_seals_an_earlier_releases_rows_as_they_stand_and_records_who(
    shop_gate: ShopGate,
) -> None:
    """A ledger of an earlier release whose tool no gate of this one uses again: `seal_rules`
    (after someone checked the ledger) seals its unsealed rows, records who did, and the audit is
    clean; run again it seals nothing. A rule row whose body does not hash to its fingerprint is
    never sealed."""
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    with gate.store.transaction() as conn:  # not a rule the gate writes: content addressing fails
        gate.store.add_rules(conn, [("0" * 64, "row", canonical_json({"name": "x"}).decode())])
    spec, policy = gate.table["update_ticket_tags"], gate.policy
    assert seal_rules(gate.store, gate.keyring, by="ops") == sorted([spec.fingerprint, policy.fingerprint])
    assert audit(gate.store, keyring=gate.keyring).findings == []
    assert not [k for k in gate.store.rules() if k.startswith("seal:" + "0" * 64)]
    [event] = [e for e in gate.store.events() if e.kind == "rules_sealed"]
    assert json.loads(event.detail_json)["by"] == "ops"
    assert seal_rules(gate.store, gate.keyring, by="ops") == []


def test_the_seal_rules_command_needs_who_and_seals(
    shop_gate: ShopGate, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    monkeypatch.setenv("EFFECTGATE_KEYRING", gate.keyring.dumps())
    assert main(["--db", store_url, "seal-rules"]) == 2  # --by is required: nothing sealed
    assert audit(gate.store, keyring=gate.keyring).findings != []
    assert main(["--db", store_url, "seal-rules", "--by", "ops"]) == 0
    assert audit(gate.store, keyring=gate.keyring).findings == []


def test_a_seal_row_inserted_first_does_not_take_the_place_of_the_gates(shop_gate: ShopGate) -> None:
    """Someone with database access inserts a seal row for a rule before the gate records it (the
    key a seal row would have had if seal rows were keyed by the rule alone): the gate's own seal
    still lands beside it, and the audit of the gate's executions is clean."""
    gate = shop_gate.gate
    fp = gate.table["update_ticket_tags"].fingerprint
    with gate.store.transaction() as conn:
        gate.store.add_rules(conn, [("seal:" + fp, "seal", "bogus"), (f"seal:{fp}:0000", "seal", "bogus")])
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    report = audit(gate.store, keyring=gate.keyring)
    assert report.clean, report.findings
    assert seal_rules(gate.store, gate.keyring, by="ops") == []  # sealed, the bogus rows aside
