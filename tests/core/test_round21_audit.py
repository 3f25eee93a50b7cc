"""Round 21 review of the audit: what it makes of the columns no seal covers (an approval's status)
and of rows anyone with write access to the database can add (redaction entries). The gate
refuses an approval whose status its sealed count of grants, or a sealed denial, contradicts; the
audit, which proves the ledger, names it. Each test runs on SQLite and PostgreSQL (`shop_gate`);
the clock is injected."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import effectgate.audit as audit_module
from effectgate import Approver, EffectGate, Grant, Pending
from effectgate.audit import audit
from effectgate.examples.shop import context
from effectgate.export import decision_records
from effectgate.redact import redact
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_round12_audit import REFUND, refund

FINANCE = Approver("fiona", "finance")


def findings(gate: EffectGate) -> list[tuple[str, str | None]]:
    return [(f.kind, f.approval_id) for f in audit(gate.store, keyring=gate.keyring).findings]


def set_status(gate: EffectGate, approval_id: str, status: str) -> None:
    with gate.store.transaction() as conn:  # the status column: no seal covers it
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :i"), {"s": status, "i": approval_id}
        )


def proposed(gate: EffectGate, message: str = "m1", order: str = "1042", amount: int = 1200) -> str:
    user = "u2" if order == "2001" else "u1"
    args = {**REFUND, "order_id": order, "amount": amount}
    pending = gate.call("refund_order", args, context(message, user_id=user))
    assert isinstance(pending, Pending)
    return pending.approval_id


@pytest.mark.parametrize("status", ["approved", "executed", "needs_reconciliation"])
def test_a_denial_edited_into_an_approval_is_a_finding(shop_gate: ShopGate, status: str) -> None:
    """A refund denied (no grant was ever minted: its sealed count of grants is 0), its status
    edited into `approved` (or a run): the gate refuses it, but the audit read it clean."""
    _, gate = shop_gate
    approval_id = proposed(gate)
    gate.deny(approval_id, approver=FINANCE, reason="not this one")
    assert findings(gate) == []
    set_status(gate, approval_id, status)
    assert findings(gate) == [("status_tampered", approval_id)]


@pytest.mark.parametrize("status", ["pending", "expired"])
def test_a_granted_approval_edited_back_to_pending_or_expired_is_a_finding(
    shop_gate: ShopGate, status: str
) -> None:
    """A refund granted (its grant minted, not yet presented), its status edited to pending or
    expired: the sealed count of grants says it was granted."""
    _, gate = shop_gate
    approval_id = proposed(gate)
    assert isinstance(gate.approve(approval_id, version=1, approver=FINANCE), Grant)
    assert findings(gate) == []
    set_status(gate, approval_id, status)
    assert findings(gate) == [("status_tampered", approval_id)]


def test_a_revoked_grant_edited_back_to_approved_is_a_finding(shop_gate: ShopGate) -> None:
    """A grant minted then revoked (a sealed denial of the version), its status edited back to
    `approved`: the sealed count of grants agrees, but the sealed denial is final."""
    _, gate = shop_gate
    approval_id = proposed(gate)
    assert isinstance(gate.approve(approval_id, version=1, approver=FINANCE), Grant)
    gate.deny(approval_id, approver=FINANCE, reason="revoked before it ran")
    assert findings(gate) == []
    set_status(gate, approval_id, "approved")
    assert findings(gate) == [("status_tampered", approval_id)]


def test_untouched_statuses_are_clean(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Executed, denied, pending, expired (swept or not) and granted-not-run: no finding."""
    _, gate = shop_gate
    refund(gate, "m1")
    gate.deny(proposed(gate, "m2", "1043", 500), approver=FINANCE, reason="no")
    assert isinstance(gate.approve(proposed(gate, "m3", "1043", 600), version=1, approver=FINANCE), Grant)
    proposed(gate, "m4", "2001", 700)
    clock.advance(gate.policy.pending_ttl + 1)
    proposed(gate, "m5", "2001", 800)
    assert findings(gate) == []
    gate.expire()
    assert findings(gate) == []


def _insert_entry_after(gate: EffectGate, approval_id: str) -> int:
    """An unsealed redaction entry inserted after the sealed one of the approval's arguments (the
    append-only triggers let an insert through); its id."""
    with gate.store.transaction() as conn:
        entries = gate.store.redacted(conn)
        [entry] = [e for e in entries if e.row_key == approval_id and e.column_name == "args_json"]
        fields = entry.model_dump(exclude={"id"})
        conn.execute(
            sa.text(
                "INSERT INTO eg_redacted (redaction_id, table_name, row_key, column_name, commitment, "
                "args_hash, kept_json, at, seal) VALUES (:redaction_id, :table_name, :row_key, "
                ":column_name, :commitment, :args_hash, :kept_json, :at, :seal)"
            ),
            {**fields, "redaction_id": "r-inserted", "commitment": "k.forged", "seal": "forged"},
        )
        return max(e.id or 0 for e in gate.store.redacted(conn))


def test_a_redaction_entry_inserted_after_a_sealed_one_is_named_not_the_marker(shop_gate: ShopGate) -> None:
    """The audit looked each marker's entry up by the last entry per (table, row, column): one
    inserted after the sealed one hid it, and the finding blamed the genuine marker ("the
    redaction entry's seal does not verify", at the approval's arguments). The sealed entry backs
    the marker; the inserted entry is the finding, named by its id."""
    _, gate = shop_gate
    approval_id = refund(gate, "m1")
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure request 77")
    assert findings(gate) == []
    inserted = _insert_entry_after(gate, approval_id)
    report = audit(gate.store, keyring=gate.keyring)
    assert [(f.kind, f.approval_id) for f in report.findings] == [("redaction_forged", approval_id)]
    assert f"redaction entry {inserted} (r-inserted)" in report.findings[0].detail
    assert "the arguments" not in report.findings[0].detail


def test_the_export_commits_to_the_sealed_entry_not_one_inserted_after_it(shop_gate: ShopGate) -> None:
    """`decision_records` took an erased value's commitment from the last entry: one inserted
    after the sealed entry put its own commitment in the chain (and `redact_export`, given sealed
    entries, would no longer find the value to erase)."""
    _, gate = shop_gate
    refund(gate, "m1")
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure request 77")
    with gate.store.transaction() as conn:
        entries = gate.store.redacted(conn)
        [sealed] = [e for e in entries if (e.table_name, e.column_name) == ("eg_executions", "args_json")]
        fields = sealed.model_dump(exclude={"id"})
        conn.execute(
            sa.text(
                "INSERT INTO eg_redacted (redaction_id, table_name, row_key, column_name, commitment, "
                "args_hash, kept_json, at, seal) VALUES (:redaction_id, :table_name, :row_key, "
                ":column_name, :commitment, :args_hash, :kept_json, :at, :seal)"
            ),
            {**fields, "redaction_id": "r-inserted", "commitment": "k.forged", "seal": "forged"},
        )
    [(record, _)] = list(decision_records(gate.store, gate.keyring))
    assert record["personal"]["args_json"] == sealed.commitment


def test_a_split_scan_reports_the_statuses_and_the_hidden_entry_as_one_scan_does(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same findings, in the same order, when a second process scans the upper half of the
    approval ids: each status where its approval is checked, the hidden entry once, after the rows."""
    _, gate = shop_gate
    ran = refund(gate, "m0")
    ids = []
    for i in range(1, 5):  # each denied before the next is proposed
        ids.append(proposed(gate, f"m{i}", "1043", 100 * i))
        gate.deny(ids[-1], approver=FINANCE, reason="no")
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure request 77")
    inserted = _insert_entry_after(gate, ran)
    for approval_id in ids[::2]:
        set_status(gate, approval_id, "approved")
    one = audit(gate.store, keyring=gate.keyring).findings
    assert sorted((f.kind, f.approval_id) for f in one) == sorted(
        [("status_tampered", a) for a in ids[::2]] + [("redaction_forged", ran)]
    )
    assert one[-1].detail.count(f"redaction entry {inserted} ") == 1
    gate.close()  # no background thread: the scan may fork
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
    assert audit(gate.store, keyring=gate.keyring).findings == one


def test_a_lone_unsealed_entry_is_still_reported_at_its_marker(shop_gate: ShopGate) -> None:
    """An entry whose seal does not verify and that hides none (the only one for its value) is
    reported where its marker is checked, as before: no finding is lost, none doubled."""
    _, gate = shop_gate
    approval_id = refund(gate, "m1")
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure request 77")
    with gate.store.transaction() as conn:  # the append-only triggers dropped, as the owner can
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_redacted_no_update")
        else:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_redacted_append_only ON eg_redacted")
        conn.execute(
            sa.text(
                "UPDATE eg_redacted SET seal = 'forged' WHERE row_key = :k AND column_name = 'args_json'"
            ),
            {"k": approval_id},
        )
    report = audit(gate.store, keyring=gate.keyring)
    assert [(f.kind, f.approval_id) for f in report.findings] == [("redaction_forged", approval_id)]
    assert "seal does not verify" in report.findings[0].detail
