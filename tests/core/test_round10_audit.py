"""Round 10: the audit and reporting library (audit, replay, erasure, export) against legitimate
but unusual histories and against files and rows an attacker or an operator touched.

Each store test runs on SQLite and PostgreSQL (`shop_gate`, `make_gate`); the clock is injected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import effectgate.export as export_module
from effectgate import Approver, EffectGate, Grant, Pending
from effectgate.audit import audit
from effectgate.canonical import canonical_text, hash_of_text
from effectgate.examples.shop import SHOP_POLICY, context
from effectgate.export import export_chain, redact_export, verify_export
from effectgate.replay import replay
from effectgate.table import Escalate
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def refund(gate: EffectGate, message: str) -> str:
    """A refund proposed, approved and run; its approval id."""
    pending = gate.call("refund_order", REFUND, context(message))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    return pending.approval_id


def test_an_approved_call_under_the_table_again_after_a_rollback_is_no_finding(
    shop_gate: ShopGate, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A refund granted under the table's row; a deploy then changes the row (a call under it
    records it) and is rolled back. The grant runs under the table as it is now (the gate compares
    the row with the table's), so an audit given that table must not say "its grant cannot run"
    (a `reclassified` finding on a clean ledger); and the grant does run, once."""
    shop, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    clock.advance(60)
    spec = gate.table["refund_order"]
    deployed = gate.table.replace(dataclasses.replace(spec, description="refunds (v2)", pin_description=True))
    changed = make_gate(deployed, policy=SHOP_POLICY, keyring=gate.keyring)
    assert isinstance(
        changed.call("refund_order", {**REFUND, "order_id": "1043", "amount": 100}, context("m2")), Pending
    )
    # rolled back: `gate` (the original table) is the deployment again
    report = audit(gate.store, gate.table, keyring=gate.keyring)
    assert [(f.kind, f.approval_id) for f in report.findings] == []
    # from the records alone (no table given), the row recorded since is still reported
    alone = audit(gate.store, keyring=gate.keyring).findings
    assert [(f.kind, f.approval_id) for f in alone] == [("reclassified", pending.approval_id)]
    gate.execute(grant.token)
    assert shop.receiver.count("refund") == 1
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_erasing_a_user_from_an_export_keeps_the_files_permissions(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """An export holds personal values (arguments, errors) of every user; its owner restricted it
    to 0600. `redact_export` of one user rewrites the file: it must not widen its permissions (the
    other users' personal values would become readable by every local account)."""
    _, gate = shop_gate
    gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["ada-vip"]}, context("m1"))
    gate.call("update_ticket_tags", {"ticket_id": "t-18", "tags": ["grace"]}, context("m2", user_id="u2"))
    gate.flush()
    clock.advance(3600)
    path = tmp_path / "2026-12-04.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now())
    os.chmod(path, 0o600)
    assert redact_export(path, store=gate.store, user_id="u1") == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert verify_export(path, gate.keyring).ok


@pytest.mark.parametrize("edited", [math.nan, math.inf])
def test_a_decision_time_no_clock_gives_does_not_skew_the_audits_latency(
    shop_gate: ShopGate, clock: FakeClock, edited: float
) -> None:
    """Three refunds decided after 1 s, 100 s and 5 s: the p95 latency is 100 s. A fourth
    approval's decided_at edited to NaN (PostgreSQL keeps it; SQLite stores NULL) or infinity is
    a time no clock gives: it must be left out, not sorted among the others (a NaN compares false
    with everything, so the sort leaves the list unsorted and the p95 picks an arbitrary value)."""
    _, gate = shop_gate
    for i, wait in enumerate((1, 100, 5, 7)):
        pending = gate.call("refund_order", {**REFUND, "amount": 100 + i}, context(f"m{i}"))
        assert isinstance(pending, Pending)
        clock.advance(wait)
        assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
        if wait == 7:
            edited_id = pending.approval_id
    with gate.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET decided_at = :t WHERE id = :id"), {"t": edited, "id": edited_id}
        )
    metrics = audit(gate.store, keyring=gate.keyring).metrics
    assert metrics is not None
    assert metrics.approval_latency_p95_s == 100.0


def test_an_execution_committed_after_the_exports_audit_is_not_signed_into_it(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export checkpoints the chain, audits the ledger, then reads the records. A refund
    recorded with no approval (a row written straight into the database, dated an hour back)
    that commits after the audit read the ledger must wait for the next export, which audits
    it: the cut is the checkpoint the audit verified, never what happens to be there when the
    records are read. Otherwise the signed file vouches for a row no audit saw."""
    _, gate = shop_gate
    done = refund(gate, "m1")
    clock.advance(3600)
    audited = export_module.audit

    def audit_then_insert(*args: Any, **kwargs: Any) -> Any:
        report = audited(*args, **kwargs)
        forged = dict(REFUND, order_id="1043", amount=3500)
        text = canonical_text(forged)
        with gate.store.transaction() as conn:
            gate.store.append_execution(
                conn,
                at=clock.now() - 1800,
                approval_id=None,
                version=None,
                tool="refund_order",
                effect="money",
                args_hash=hash_of_text("refund_order", text),
                args_json=text,
                idempotency_key="forged-refund",
                status="succeeded",
                session_id="s-ada",
                origin_message_id="m-forged",
                user_id="u1",
                agent_id="support",
                table_fingerprint=gate.table.fingerprint,
                row_fingerprint=gate.table["refund_order"].fingerprint,
                policy_fingerprint=gate.policy.fingerprint,
                result_json="{}",
            )
        return report

    monkeypatch.setattr(export_module, "audit", audit_then_insert)
    path = tmp_path / "2026-12-04.jsonl"
    manifest = export_chain(gate.store, gate.keyring, path, now=clock.now())
    monkeypatch.undo()
    exported = [json.loads(line)["record"] for line in path.read_text().splitlines()]
    assert [(r["tool"], r["approval_id"]) for r in exported] == [("refund_order", done)]
    assert manifest.count == 1
    # the next export audits the row, and refuses
    assert [f.kind for f in audit(gate.store, keyring=gate.keyring).findings] == ["no_approval"]


def test_an_approver_inserted_after_the_exports_audit_is_not_signed_into_it(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision row written straight into the database (no seal: "mallory" approving the refund
    too) that commits after the export's audit read the ledger: the signed record's approvers are
    who sealed a decision, never a row no audit saw."""
    _, gate = shop_gate
    done = refund(gate, "m1")
    clock.advance(3600)
    audited = export_module.audit

    def audit_then_insert(*args: Any, **kwargs: Any) -> Any:
        report = audited(*args, **kwargs)
        with gate.store.transaction() as conn:
            gate.store.add_decision(
                conn,
                approval_id=done,
                version=1,
                approver_id="mallory",
                role="finance",
                decision="approve",
                at=clock.now() - 3000,
                seal="k0.forged",
            )
        return report

    monkeypatch.setattr(export_module, "audit", audit_then_insert)
    path = tmp_path / "2026-12-04.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now())
    monkeypatch.undo()
    [record] = [json.loads(line)["record"] for line in path.read_text().splitlines()]
    assert [a["id"] for a in record["approvers"]] == ["fiona"]
    assert "decision_forged" in [f.kind for f in audit(gate.store, keyring=gate.keyring).findings]


def test_replay_judges_each_intent_apart_from_what_an_earlier_one_left_waiting(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """Two refunds of order 1042 from two sessions, each approved by finance and run. Replayed
    against a table that escalates refunds above 40.00 to finance_lead: the first (50.00) is
    rerouted, and its sandbox proposal waits for a finance_lead. The second (30.00) routes, is
    granted and runs exactly as recorded: `same`, never `refused` because the sandbox's own
    waiting proposal holds the subject ("subject_busy")."""
    shop, gate = shop_gate
    for session, amount in (("s1", 5000), ("s2", 3000)):
        args = {**REFUND, "amount": amount}
        pending = gate.call("refund_order", args, context("m1", session_id=session))
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        clock.advance(10)
    table = gate.table
    stricter = dataclasses.replace(
        table["refund_order"],
        escalate=(Escalate.above("amount", 4000, role="finance_lead", note="above 40.00"),),
    )
    report = replay(gate.store, table.replace(stricter), SHOP_POLICY, keyring=gate.keyring)
    assert [(r.verdict, r.detail) for r in report.results] == [
        ("rerouted", "needs 1 x finance_lead now, was 1 x finance"),
        ("same", ""),
    ]
    assert shop.receiver.count("refund") == 2  # the replay ran nothing real
