"""Review round: export verification and the report given hostile input.

- `verify_export` promises never to raise for a broken file: a line whose record (with a hash
  recomputed to match, sha256 being unkeyed) carries a commitment that is not text, or not ASCII,
  and a manifest holding a number canonical JSON cannot carry, are each a named break.
- The report reads rows anyone with write access to the database can edit: a time far outside
  the calendar (an approval's `created_at`, a reconciliation record's `updated_at`) must not
  crash the report (the CLI and the inbox's metrics page show the same figures).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Executed, Grant, Pending
from effectgate.audit import audit
from effectgate.chain import ChainError, seal_chain, verify_chain
from effectgate.examples.shop import context
from effectgate.export import ExportError, export_chain, link, manifest_path, redact_export, verify_export
from effectgate.report import figures, render_html
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import FINANCE
from .conftest import ShopGate

TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}


def _refund(gate: EffectGate) -> None:
    refund = {"order_id": "1042", "amount": 1200, "currency": "GBP"}
    pending = gate.call("refund_order", refund, context("m2"))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)


@pytest.fixture
def exported(shop_gate: ShopGate, clock: FakeClock, tmp_path: Path) -> tuple[EffectGate, Path]:
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    _refund(gate)
    path = tmp_path / "one.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    assert verify_export(path, gate.keyring).ok
    return gate, path


@pytest.mark.parametrize("commitment", [5, ["x"], None, "{kid}.\u00e9\u00e9"])
def test_a_line_whose_commitment_is_not_ascii_text_is_a_break_not_a_crash(
    exported: tuple[EffectGate, Path], commitment: Any
) -> None:
    gate, path = exported
    rows = path.read_text().splitlines()
    line = json.loads(rows[0])
    column = next(iter(line["personal"]))
    value = commitment.format(kid=gate.keyring.current) if isinstance(commitment, str) else commitment
    line["record"]["personal"][column] = value
    line["hash"] = link(line["prev"], line["record"])  # sha256 is unkeyed: anyone can recompute it
    rows[0] = json.dumps(line)
    path.write_text("".join(row + "\n" for row in rows))
    verdict = verify_export(path, gate.keyring)
    assert (verdict.ok, verdict.line) == (False, 1)


@pytest.mark.parametrize("field", ["count", "first_seq", "created_at"])
def test_a_manifest_with_a_number_json_cannot_carry_is_a_break_not_a_crash(
    exported: tuple[EffectGate, Path], field: str
) -> None:
    gate, path = exported
    manifest = json.loads(manifest_path(path).read_text())
    manifest[field] = 10**30
    manifest_path(path).write_text(json.dumps(manifest))
    verdict = verify_export(path, gate.keyring)
    assert not verdict.ok
    assert verdict.problem is not None
    assert "manifest" in verdict.problem


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE eg_approvals SET created_at = 1e13",
        "UPDATE eg_approvals SET created_at = -1e13",
        "UPDATE eg_approvals SET created_at = 1e300",
        "UPDATE eg_approvals SET created_at = -1e300",
        "UPDATE eg_approvals SET created_at = CAST('-Infinity' AS FLOAT)",
        "UPDATE eg_approvals SET created_at = 253402300000",  # 9999-12-31, the calendar's last day
        "UPDATE eg_approvals SET created_at = -62135596800",  # 0001-01-01, its first
        "UPDATE eg_idempotency SET status = 'needs_reconciliation', updated_at = 1e13",
    ],
)
def test_the_report_survives_a_time_outside_the_calendar(
    shop_gate: ShopGate, store: SQLStore, edit: str
) -> None:
    gate = shop_gate.gate
    _refund(gate)
    with store.engine.begin() as conn:
        conn.execute(sa.text(edit))
    for keyring in (None, gate.keyring):
        report = figures(store, keyring=keyring)
        assert report.metrics.proposals == 1
        assert "<html" in render_html(report)
        json.dumps(report.to_dict())


# -- the ledger's chain, given a checkpoint row edited to hold values of another type.
# SQLite keeps what an UPDATE stores (text in an INTEGER column, a blob in a TEXT one), so the
# owner of the file can leave a checkpoint the audit must report, not crash on.


@pytest.mark.parametrize(
    "edit",
    [
        "first_id = 'abc'",
        "last_id = 'abc'",
        "start = X'00'",
        "key_id = X'00'",
        "at = X'00'",
    ],
)
def test_a_checkpoint_edited_to_another_type_is_a_break_not_a_crash(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path, edit: str
) -> None:
    gate = shop_gate.gate
    if gate.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a value of another type")
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    clock.advance(100)
    _refund(gate)
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    manifest = export_chain(gate.store, gate.keyring, tmp_path / "one.jsonl", now=clock.now() + 61)
    with gate.store.transaction() as conn:
        conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_chain_no_update")
        conn.execute(sa.text(f"UPDATE eg_chain SET {edit}"))  # every checkpoint
    breaks = verify_chain(gate.store, gate.keyring)
    assert {b.table for b in breaks} == {"eg_decisions", "eg_executions", "eg_events"}
    report = audit(gate.store, keyring=gate.keyring, chain=True, pinned=manifest.heads)
    assert "chain_broken" in {f.kind for f in report.findings}
    with pytest.raises((ChainError, ExportError)):
        export_chain(gate.store, gate.keyring, tmp_path / "two.jsonl", after=manifest, now=clock.now() + 61)


@pytest.mark.parametrize("personal", [["x"], "x", 5])
def test_redact_export_refuses_a_line_whose_personal_values_are_not_an_object(
    exported: tuple[EffectGate, Path], personal: Any
) -> None:
    """Not a chain line: ExportError naming it, and the file is left as it was."""
    gate, path = exported
    rows = path.read_text().splitlines()
    line = json.loads(rows[0])
    line["personal"] = personal
    rows[0] = json.dumps(line)
    path.write_text("".join(row + "\n" for row in rows))
    before = path.read_bytes()
    with pytest.raises(ExportError, match="line 1"):
        redact_export(path, store=gate.store, user_id=line["record"]["user_id"])
    assert path.read_bytes() == before
