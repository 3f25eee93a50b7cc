"""Erasure markers in every personal column, checked by the audit against their sealed entries,
and the unsigned JSONL export of every table. Each test runs on SQLite and PostgreSQL (`store`).

Only `redact` writes a stored value that starts like a marker (the gate refuses such arguments and
stores such results with a leading space), so a marker written by SQL, in any personal column, or
kept facts rewritten after an erasure, are `redaction_forged` findings.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Pending
from effectgate.audit import audit, export_jsonl
from effectgate.chain import seal_chain
from effectgate.examples.shop import context
from effectgate.redact import hold, redact
from effectgate.stores.records import PERSONAL
from effectgate.testing import FakeClock

from .test_redact import refund

FINANCE = Approver("fiona", "finance")
FORGED = '{"$redacted":"r-forged"}'


@pytest.fixture
def ledger(shop_gate: object) -> EffectGate:
    """u1: a refund of 1042 executed, a refund of 1043 denied with a reason; u2: a refund of 2001."""
    gate = shop_gate.gate  # type: ignore[attr-defined]
    refund(gate, "m1", "1042", 1200)
    pending = gate.call("refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, context("m2"))
    assert isinstance(pending, Pending)
    gate.deny(
        pending.approval_id, approver=FINANCE, reason="fraud suspected: the customer called from abroad"
    )
    refund(gate, "g1", "2001", 700, user="u2")
    gate.flush()
    assert isinstance(gate, EffectGate)
    return gate


def _write(gate: EffectGate, sql: str, **params: object) -> None:
    with gate.store.transaction() as conn:  # the append-only triggers let a marker through
        conn.execute(sa.text(sql), params)


def _forged(gate: EffectGate, *, chain: bool = False) -> list[str]:
    report = audit(gate.store, gate.table, keyring=gate.keyring, chain=chain)
    return [f.detail for f in report.findings if f.kind == "redaction_forged"]


# Every personal column but the arguments of approvals and executions that ran (their own tests).
COLUMNS = [
    (table, column)
    for table, columns in PERSONAL.items()
    for column in columns
    if not (column == "args_json" and table in ("eg_approvals", "eg_executions"))
]


@pytest.mark.parametrize(("table", "column"), COLUMNS, ids=[f"{t}.{c}" for t, c in COLUMNS])
def test_a_marker_written_by_sql_into_any_personal_column_is_forged(
    ledger: EffectGate, table: str, column: str
) -> None:
    key = "key" if table == "eg_idempotency" else "id"
    _write(
        ledger, f"UPDATE {table} SET {column} = :m WHERE {key} = (SELECT min({key}) FROM {table})", m=FORGED
    )
    [detail] = _forged(ledger, chain=True)
    assert detail.startswith(f"{column} of {table} ")
    assert "no redaction wrote" in detail


def test_a_deny_reason_a_result_and_an_event_detail_overwritten_are_each_reported(ledger: EffectGate) -> None:
    """The reviewer's repro: evidence overwritten with a marker is found, one finding per value,
    and the export (which audits first) refuses; nothing of it reaches a checkpoint."""
    _write(ledger, "UPDATE eg_decisions SET reason = :m WHERE decision = 'deny'", m=FORGED)
    _write(ledger, "UPDATE eg_executions SET result_json = :m", m=FORGED)
    _write(ledger, "UPDATE eg_events SET detail_json = :m WHERE kind = 'denied'", m=FORGED)
    details = _forged(ledger, chain=True)
    assert sorted(d.split(" of ")[1].split(" ")[0] for d in details) == [
        "eg_decisions",
        "eg_events",
        "eg_executions",
        "eg_executions",
    ]


def test_an_erased_ledger_with_no_marker_edited_is_clean(ledger: EffectGate, clock: FakeClock) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    seal_chain(ledger.store, ledger.keyring, settle=0, now=clock.now() + 120)
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring, chain=True).clean


def _approved_detail(gate: EffectGate) -> tuple[int, str]:
    with gate.store.reading() as conn:
        row = conn.execute(
            sa.text("SELECT id, detail_json FROM eg_events WHERE kind = 'approved' ORDER BY id")
        ).first()
    assert row is not None
    return int(row[0]), str(row[1])


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.replace('"approver":"fiona"', '"approver":"mallory"'),  # a kept fact changed
        lambda d: d.replace('"role":"finance"', '"role":"finance_lead"'),
        lambda d: d[:-1] + ',"edited_by":"sam"}',  # a fact added
        lambda d: d.replace(',"role":"finance"', ""),  # a fact dropped
        lambda d: d.replace('"approver":"fiona"', '"approver":"mallory","approver":"fiona"'),  # shown twice
        lambda d: d.replace('"$redacted":"r-', '"$redacted":"r-0'),  # another redaction's id
    ],
    ids=["changed", "role", "added", "dropped", "repeated", "other-redaction"],
)
def test_an_event_markers_kept_facts_edited_after_the_erasure_are_forged(
    ledger: EffectGate, clock: FakeClock, edit: object
) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    seal_chain(ledger.store, ledger.keyring, settle=0, now=clock.now() + 120)
    event_id, detail = _approved_detail(ledger)
    assert json.loads(detail)["approver"] == "fiona"
    forged = edit(detail)  # type: ignore[operator]
    assert forged != detail
    _write(ledger, "UPDATE eg_events SET detail_json = :m WHERE id = :id", m=forged, id=event_id)
    assert _forged(ledger, chain=True) != []


def test_a_decisions_erased_reason_given_facts_is_forged(ledger: EffectGate) -> None:
    """A marker that kept nothing (a decision's reason) cannot gain a fact afterwards."""
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    with ledger.store.reading() as conn:
        decision_id, reason = conn.execute(
            sa.text("SELECT id, reason FROM eg_decisions WHERE decision = 'deny'")
        ).one()
    assert set(json.loads(reason)) == {"$redacted"}
    _write(
        ledger,
        "UPDATE eg_decisions SET reason = :m WHERE id = :id",
        m=reason[:-1] + ',"amount":1}',
        id=decision_id,
    )
    [detail] = _forged(ledger)
    assert detail.startswith(f"reason of eg_decisions {decision_id}: the facts kept")


def test_argument_markers_are_checked_once(ledger: EffectGate) -> None:
    """The arguments the scan checks (an approval's, a run execution's) give one finding each."""
    _write(
        ledger,
        "UPDATE eg_executions SET args_json = :m WHERE id = (SELECT min(id) FROM eg_executions)",
        m=FORGED,
    )
    assert len(_forged(ledger)) == 1


# -- the unsigned export


def _tables(gate: EffectGate) -> dict[str, int]:
    with gate.store.reading() as conn:
        names = [t for t in sa.inspect(conn).get_table_names() if t.startswith("eg_")]
        return {n: int(conn.execute(sa.text(f"SELECT count(*) FROM {n}")).scalar_one()) for n in names}


def test_export_jsonl_writes_every_row_of_every_table(ledger: EffectGate, clock: FakeClock) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    hold(ledger.store, user_id="u2", by="legal", reason="case 14")
    seal_chain(ledger.store, ledger.keyring, settle=0, now=clock.now() + 120)
    counts = _tables(ledger)
    for table in ("eg_idempotency", "eg_holds", "eg_redacted", "eg_rules", "eg_chain", "eg_schema_version"):
        assert counts.get(table), table
    lines = export_jsonl(ledger.store)
    assert iter(lines) is lines  # a generator: streamed, never a list of the ledger
    records = [json.loads(line) for line in lines]
    written: dict[str, int] = {}
    for r in records:
        written["eg_" + r["table"]] = written.get("eg_" + r["table"], 0) + 1
    assert written == {t: n for t, n in counts.items() if n}
    [held] = [r for r in records if r["table"] == "holds"]
    assert (held["user_id"], held["placed_by"]) == ("u2", "legal")
    [record] = [r for r in records if r["table"] == "idempotency" and "2001" in (r["result_json"] or "")]
    assert record["status"] == "succeeded"
