"""Round 7: the audit against a ledger edited by someone with write access to the database.

Rows are written behind the gate's back (`Store.append_execution`, `Store.add_rules`), as such an
attacker would. Whatever the edit, the audit reports it as a finding: it never crashes on a rule
body that is not the kind of rule the row names, and it never calls a ledger clean that is not.
Each test runs on SQLite and PostgreSQL (`shop_gate`).
"""

from __future__ import annotations

import dataclasses
import gc
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

import effectgate.audit as audit_module
from effectgate import Approver, EffectGate, Grant, Keyring, Pending, Recorded, Refused, open_store
from effectgate.audit import audit
from effectgate.canonical import canonical_json, canonical_text, digest, hash_of_text
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_redact import refund

FINANCE = Approver("fiona", "finance")

LARGE_REFUND = {"order_id": "2001", "amount": 50000, "currency": "GBP"}


def _execution(gate: EffectGate, tool: str, args: dict[str, Any], **values: Any) -> None:
    """Append a succeeded execution of `tool` with `args`; `values` override its columns (by
    default: no approval, the tool's current row and the gate's policy)."""
    text = canonical_text(args)
    row: dict[str, Any] = {
        "approval_id": None,
        "version": None,
        "tool": tool,
        "effect": "money",
        "args_hash": hash_of_text(tool, text),
        "args_json": text,
        "idempotency_key": f"forged-{tool}-{values.get('approval_id')}",
        "status": "succeeded",
        "session_id": "s-ada",
        "origin_message_id": "m-forged",
        "user_id": "u1",
        "agent_id": "support",
        "run_id": "run-1",
        "table_fingerprint": gate.table.fingerprint,
        "row_fingerprint": gate.table[tool].fingerprint,
        "policy_fingerprint": gate.policy.fingerprint,
        "result_json": '{"refund": "re_forged"}',
        **values,
    }
    with gate.store.transaction() as conn:
        gate.store.append_execution(conn, **row)


def _rule(gate: EffectGate, kind: str, body: Any) -> str:
    """Insert a rule (unsealed) whose fingerprint is its body's digest, as SQL would."""
    fingerprint = digest(body)
    with gate.store.transaction() as conn:
        gate.store.add_rules(conn, [(fingerprint, kind, canonical_json(body).decode())])
    return fingerprint


def _kinds(gate: EffectGate) -> list[str]:
    return sorted({f.kind for f in audit(gate.store, keyring=gate.keyring).findings})


def test_a_policy_fingerprint_naming_a_table_row_is_a_finding(shop_gate: ShopGate) -> None:
    """An ungated refund whose policy fingerprint is re-pointed at a recorded table row (its
    own): the row is no policy, so the policy is not recorded (`rule_missing`) and the refund,
    a money row, ran without approval (`no_approval`); the audit does not crash on it."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    row = gate.table["refund_order"].fingerprint
    _execution(gate, "refund_order", LARGE_REFUND, policy_fingerprint=row)
    assert _kinds(gate) == ["no_approval", "rule_missing"]


def test_a_policy_that_gates_reads_is_a_finding(shop_gate: ShopGate) -> None:
    """An inserted policy body that no Policy can be (it gates reads) named by an execution:
    `rule_missing`, not a ValueError out of the audit."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    body = {
        "autonomous": [],
        "double_confirmation": ["destructive"],
        "role_grants": {},
        "self_approval": False,
    }
    _execution(gate, "refund_order", LARGE_REFUND, policy_fingerprint=_rule(gate, "policy", body))
    assert _kinds(gate) == ["no_approval", "rule_missing"]


def test_a_rule_body_that_is_not_an_object_is_a_finding(shop_gate: ShopGate) -> None:
    """Rules whose canonical body is a list, named as an execution's row and policy: neither is
    recorded (`rule_missing`), and the refund ran without approval."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    row, policy = _rule(gate, "row", ["refund_order"]), _rule(gate, "policy", ["read"])
    _execution(gate, "refund_order", LARGE_REFUND, row_fingerprint=row, policy_fingerprint=policy)
    assert _kinds(gate) == ["no_approval", "rule_missing"]


def _unguard(gate: EffectGate) -> None:
    """Drop the append-only triggers, as the database's owner can."""
    with gate.store.transaction() as conn:
        for table in ("eg_decisions", "eg_executions", "eg_approvals", "eg_rules"):
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_update")
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_delete")
            else:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")


def test_an_approval_naming_the_policy_as_its_row_is_a_finding_without_seals(shop_gate: ShopGate) -> None:
    """Without the keyring (seals unchecked), an approved refund whose approval's row
    fingerprint is edited to the policy's: no table row is recorded under it (`rule_missing`),
    and the audit does not crash reading a policy as a row."""
    gate = shop_gate.gate
    done = refund(gate, "m1", "1042", 1200)
    _unguard(gate)
    with gate.store.transaction() as conn:
        conn.exec_driver_sql(
            f"UPDATE eg_approvals SET row_fingerprint = '{gate.policy.fingerprint}' "
            f"WHERE id = '{done.approval_id}'"
        )
    kinds = {f.kind for f in audit(gate.store).findings}
    assert "rule_missing" in kinds


def test_a_shadow_call_whose_rule_row_was_deleted_is_not_replayed_same(
    store: SQLStore, clock: FakeClock
) -> None:
    """A refund proposed in shadow mode and approved (it never ran): with its shadow row deleted
    from the recorded rules, its sealed shadow subject key still says it was a shadow proposal,
    so against the live table it is `rerouted` (it would now pause and run), never `same`."""
    shop, keyring = Shop(), Keyring.generate()
    table = shop.table().shadowed(["refund_order"])
    with EffectGate(table, store, policy=SHOP_POLICY, clock=clock, keyring=keyring) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Refused)
        assert out.approval_id is not None
        assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Recorded)
        _unguard(gate)
        with store.transaction() as conn:
            conn.exec_driver_sql(
                f"DELETE FROM eg_rules WHERE fingerprint = '{table['refund_order'].fingerprint}'"
            )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert [(r.approval_id, r.verdict) for r in report.results] == [(out.approval_id, "rerouted")]


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE eg_approvals SET decided_at = 'soon'",  # a time edited into text
        "UPDATE eg_rules SET at = 'then' WHERE kind = 'row'",
    ],
)
def test_a_time_edited_into_text_does_not_crash_the_audit(
    tmp_path: Path, clock: FakeClock, edit: str
) -> None:
    """SQLite keeps text edited into a time column. An approved refund that has not run (the
    audit asks whether its tool changed since) with a later row of its tool recorded: whatever
    time was edited into text, the audit reports the change, it does not raise TypeError."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    shop, keyring = Shop(), Keyring.generate()
    with open_store(url) as store:
        store.setup()
        with EffectGate(shop.table(), store, policy=SHOP_POLICY, clock=clock, keyring=keyring) as gate:
            pending = gate.call(
                "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
            )
            assert isinstance(pending, Pending)
            assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
        clock.advance(60)
        table = shop.table()
        table = table.replace(dataclasses.replace(table["refund_order"], approver_role="finance_lead"))
        with EffectGate(table, store, policy=SHOP_POLICY, clock=clock, keyring=keyring) as gate:
            gate.call("refund_order", {"order_id": "1043", "amount": 100, "currency": "GBP"}, context("m2"))
        conn = sqlite3.connect(tmp_path / "shop.db")
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute(edit)
        conn.commit()
        conn.close()
        report = audit(store, keyring=keyring)
    assert report.findings


def test_a_scan_that_fails_closes_its_streams_with_their_connection(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the middle of the scan (injected here; a row the driver cannot decode, a lost
    server) ends the audit with that error, and the row streams are closed before their
    connection is: none is left to close its cursor later, on a connection closed (SQLite: a raw
    "Exception ignored" traceback) or handed to another transaction (PostgreSQL)."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    refund(gate, "m2", "1043", 500)

    def fail(*args: Any) -> None:
        raise RuntimeError("injected")

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(audit_module.Scan, "approval", fail)
    with pytest.raises(RuntimeError, match="injected") as raised:
        audit(gate.store, keyring=gate.keyring)
    gate.store.engine.dispose()  # its connection closed while the error is handled (the CLI's store)
    del raised
    gc.collect()
    assert unraisable == []


def test_a_denied_call_whose_status_was_edited_is_not_replayed_same(
    store: SQLStore, clock: FakeClock
) -> None:
    """A refund approved, then its grant revoked by a sealed denial (it never ran): its status
    column edited back to `approved` does not make it replay `same`: the gate refuses a version
    with a denial whatever the status says, so the replay refuses it too (and calls nothing)."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, clock=clock, keyring=keyring) as gate:
        pending = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(pending, Pending)
        assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
        gate.deny(pending.approval_id, version=1, approver=Approver("fred", "finance"), reason="no")
        _unguard(gate)
        with store.transaction() as conn:
            conn.exec_driver_sql(
                f"UPDATE eg_approvals SET status = 'approved' WHERE id = '{pending.approval_id}'"
            )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert [(r.approval_id, r.verdict) for r in report.results] == [(pending.approval_id, "refused")]
    assert report.calls.get("refund_order", []) == []
