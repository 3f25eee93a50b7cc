"""Governance and audit edges: an execution of a revoked grant, a rule row forged in the
database, an export file edited or overwritten, kept facts rewritten as another JSON type, subject
matching by JSON value, bad `hold` and `keep` input. Rows are forged behind
the gate's back, as someone with database access would (`Store.append_execution`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Refused,
    ToolSpec,
    open_store,
)
from effectgate.audit import audit
from effectgate.canonical import canonical_json, canonical_text, digest
from effectgate.examples.shop import context
from effectgate.export import ExportError, export_chain, manifest_path, verify_export
from effectgate.redact import RedactionError, holds, redact, retain
from effectgate.testing import FakeClock

from . import test_cli
from .conftest import MakeGate, ShopGate
from .test_audit_rules import _execution
from .test_cli import Run
from .test_cli_governance import executed
from .test_redact import refund

cli = test_cli.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli._cli_env
__all__ = ["executed"]  # a fixture

FINANCE = Approver("fiona", "finance")
TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}
ARGS = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def _kinds(gate: EffectGate) -> list[str]:
    return sorted(f.kind for f in audit(gate.store, keyring=gate.keyring).findings)


def _approved_unrun(gate: EffectGate, args: dict[str, Any] = ARGS) -> Pending:
    pending = gate.call("refund_order", args, context("m1"))
    assert isinstance(pending, Pending)
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
    return pending


def test_an_execution_of_a_revoked_approval_is_not_approved(shop_gate: ShopGate) -> None:
    """A reviewer approves a refund, then revokes the unused grant (`deny`: a sealed deny
    decision; the gate refuses any execution from then on). An execution row of it added in the
    database is `not_approved`: the sealed denial is part of what the audit re-derives, not only
    the approve before it (the approval's status column, which says denied, is not sealed)."""
    gate = shop_gate.gate
    pending = _approved_unrun(gate)
    assert isinstance(gate.deny(pending.approval_id, approver=FINANCE, reason="wrong order"), Refused)
    assert _kinds(gate) == []
    _execution(
        gate,
        "refund_order",
        ARGS,
        approval_id=pending.approval_id,
        version=1,
        effect="money",
        idempotency_key="forged",
    )
    [finding] = audit(gate.store, keyring=gate.keyring).findings
    assert (finding.kind, finding.approval_id) == ("not_approved", pending.approval_id)
    assert "denied" in finding.detail


def test_kept_facts_rewritten_as_another_json_type_are_forged(shop_gate: ShopGate) -> None:
    """After an erasure, a marker's kept amount rewritten from 1 to `true` is not the fact the
    redaction kept: `redaction_forged`, as any other change of the kept facts is (Python compares
    1 == True, JSON readers do not)."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1)
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure")
    assert _kinds(gate) == []
    with gate.store.reading() as conn:
        [marker] = [m for (m,) in conn.execute(sa.text("SELECT args_json FROM eg_executions"))]
    assert '"amount":1,' in marker
    forged = marker.replace('"amount":1,', '"amount":true,')
    with gate.store.transaction() as conn:  # the append-only triggers let a marker through
        conn.execute(sa.text("UPDATE eg_executions SET args_json = :m"), {"m": forged})
    assert _kinds(gate) == ["redaction_forged"]


def test_a_line_whose_sequence_is_rewritten_as_true_is_a_changed_line(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """A chain line's `seq` sits outside the hashed record; `1` rewritten as `true` compared equal
    to the record's 1 and to the manifest's last sequence, so the edited file verified. It is a
    changed line (the file's bytes are not the ones the export wrote)."""
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    path = tmp_path / "one.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    text = path.read_text()
    assert text.startswith('{"seq": 1, ')
    assert verify_export(path, gate.keyring).ok
    path.write_text(text.replace('{"seq": 1, ', '{"seq": true, ', 1))
    result = verify_export(path, gate.keyring)
    assert not result.ok
    assert result.line == 1


def _label(ticket: int | bool, text: str) -> dict[str, Any]:
    return {"labelled": text}


def test_a_subject_matches_writes_by_json_value_not_python_equality(make_gate: MakeGate) -> None:
    """`redact --subject '{"ticket": 1}'` erases the writes whose `ticket` is the JSON number 1,
    not one whose `ticket` is `true` (Python's 1 == True): that record is another subject's and
    must be kept, as the gated calls' subject keys (canonical JSON) already keep it."""
    table = EffectTable([ToolSpec(name="label", effect=Effect.WRITE, fn=_label, owner="support")])
    table.allow("support", ["label"])
    gate = make_gate(table)
    ctx = {"session_id": "s1", "user_id": "u1", "agent_id": "support"}
    assert isinstance(
        gate.call("label", {"ticket": 1, "text": "one"}, CallContext(origin_message_id="m1", **ctx)), Executed
    )
    assert isinstance(
        gate.call("label", {"ticket": True, "text": "yes"}, CallContext(origin_message_id="m2", **ctx)),
        Executed,
    )
    redact(gate.store, gate.keyring, user_id="u1", subject={"ticket": 1}, by="dpo", reason="request 7")
    kept = sorted(x.args_json for x in gate.store.executions() if not x.args_json.startswith('{"$redacted"'))
    assert kept == ['{"text":"yes","ticket":true}']


@pytest.mark.parametrize(
    "argv",
    [
        ["--by", "legal", "--reason", "case 14"],  # --user forgotten: nothing placed
        ["--reason", "case 14"],
    ],
)
def test_hold_options_without_user_or_release_are_a_usage_error(
    executed: str, cli: Callable[..., Run], argv: list[str]
) -> None:
    """`hold --by legal --reason ...` without `--user` placed nothing, listed the holds and exited
    0, so a script believed the user held (and a later `redact` erased them). A usage error now."""
    run = cli("hold", "--db", executed, *argv)
    assert run.code == 2, run
    assert "--user" in run.err
    with open_store(executed) as store:
        assert holds(store) == []


def test_a_release_without_a_reason_is_a_usage_error(executed: str, cli: Callable[..., Run]) -> None:
    """A release records who released the hold and why (round 10: `--reason` is required, as
    placing a hold requires it). Without one, a usage error, and the hold stays."""
    placed = cli("hold", "--db", executed, "--user", "u1", "--by", "legal", "--reason", "case 14")
    hold_id = placed.out.split()[1]
    run = cli("hold", "--db", executed, "--release", hold_id, "--by", "legal")
    assert run.code == 2, run
    with open_store(executed) as store:
        assert [h.id for h in holds(store)] == [hold_id]


def test_an_ungated_refund_under_a_rule_row_forged_in_the_database_is_a_finding(
    shop_gate: ShopGate,
) -> None:
    """Someone with database access records a row of their own for refund_order (its canonical
    form with `effect: write`, under its own fingerprint: content addressing holds) and an
    execution of a refund naming it, with no approval. Every other check passes on the forged
    row; it has no seal (`_seal.rule_seal`: the gate seals every rule it records), so it is
    `rule_missing`, and the refund, under no rule the audit can use, `no_approval`."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)  # the genuine money row is recorded
    body = {**gate.table["refund_order"].canonical(), "effect": "write", "approver_role": None}
    text = canonical_json(body).decode()
    with gate.store.transaction() as conn:
        gate.store.add_rules(conn, [(digest(body), "row", text)])
    _execution(
        gate,
        "refund_order",
        {"order_id": "2001", "amount": 50000, "currency": "GBP"},
        row_fingerprint=digest(body),
        idempotency_key="forged-write",
    )
    assert _kinds(gate) == ["no_approval", "rule_missing"]


def test_an_incremental_export_into_the_file_it_continues_is_refused(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """`export --out one.jsonl --after one.jsonl.manifest.json` replaced the export it continues
    (its records and its signed manifest, whose pins guard the ledger's chain) with only the new
    records: the earlier export was lost. Refused, nothing written, and the earlier file verifies."""
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    path = tmp_path / "one.jsonl"
    first = export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    before = (path.read_bytes(), manifest_path(path).read_bytes())
    refund(gate, "m2", "1042", 1200)
    with pytest.raises(ExportError, match="continues"):
        export_chain(gate.store, gate.keyring, path, after=first, now=clock.now() + 61)
    assert (path.read_bytes(), manifest_path(path).read_bytes()) == before
    assert verify_export(path, gate.keyring).ok


def test_keep_given_as_one_string_is_refused_before_anything_is_erased(shop_gate: ShopGate) -> None:
    """`redact(..., keep="amount")` iterated the string: it kept the facts "a", "m", "o"... (none),
    so the amount every business check counts was erased with the rest. Refused, nothing erased."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    with pytest.raises(RedactionError, match="keep"):
        redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="r", keep="amount")
    with pytest.raises(RedactionError, match="keep"):
        retain(gate.store, gate.keyring, {"money": 0}, by="nightly", keep="amount")
    assert [a.args_json for a in gate.store.approvals()] == [canonical_text(ARGS)]
