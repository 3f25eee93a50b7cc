"""Decision records that answer "who authorised the refund" (issue 18): the model that proposed a
call, and the provider's own reference recorded by the tool while it runs, on SQLite and
PostgreSQL; and an older (version 2) database upgraded in place without losing a row."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import NeedsReconciliation, OutcomeUnknown, StoreError
from effectgate.examples.shop import context
from effectgate.export import export_chain
from effectgate.stores import SQLStore, open_store
from effectgate.stores.records import SCHEMA_VERSION
from effectgate.testing import FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")
MODEL = "gpt-4.1-2025-04-14"


class Provider:
    """The receiver: counts effects, and answers with its own processing id (a 202)."""

    def __init__(self, *, lose_reply: bool = False) -> None:
        self.effects: list[dict[str, Any]] = []
        self.lose_reply = lose_reply

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        ref = f"prov-{len(self.effects) + 1}"
        self.effects.append({"account": account, "amount": amount, "ref": ref})
        tool_context.set_provider_ref(ref)
        if self.lose_reply:
            raise OutcomeUnknown("the provider accepted the payment (202) and the reply was lost")
        return {"status": "processing", "ref": ref}


def paying_gate(make_gate: MakeGate, provider: Provider) -> EffectGate:
    table = EffectTable(
        [
            ToolSpec(name="pay", effect=Effect.MONEY, fn=provider.pay, approver_role="finance"),
            ToolSpec(name="note", effect=Effect.WRITE, fn=lambda text: {"noted": text}),
        ]
    )
    table.allow_all("support")
    return make_gate(table)


def run_payment(gate: EffectGate, message: str = "m1") -> tuple[Grant, Any]:
    ctx = dataclasses.replace(context(message), model_id=MODEL)
    out = gate.call("pay", {"account": "a1", "amount": 5}, ctx)
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=out.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    try:
        return grant, gate.execute(grant.token)
    except NeedsReconciliation as exc:
        return grant, exc


def test_the_model_id_is_recorded_on_the_approval_the_execution_and_the_export(
    make_gate: MakeGate, clock: FakeClock, tmp_path: Path
) -> None:
    provider = Provider()
    gate = paying_gate(make_gate, provider)
    grant, done = run_payment(gate)
    assert isinstance(done, Executed)
    write = gate.call("note", {"text": "hi"}, context("m2"))  # no model named: ''
    assert isinstance(write, Executed)
    [approval] = gate.store.approvals()
    assert approval.model_id == MODEL
    assert [(e.tool, e.model_id) for e in gate.store.executions()] == [("pay", MODEL), ("note", "")]
    path = tmp_path / "export.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    records = [json.loads(line)["record"] for line in path.read_text().splitlines()]
    assert [(r["tool"], r["model_id"], r["provider_ref"]) for r in records] == [
        ("pay", MODEL, "prov-1"),
        ("note", "", None),
    ]
    assert records[0]["approval_id"] == grant.approval_id


def test_a_provider_ref_is_committed_before_the_tool_returns(make_gate: MakeGate, store: SQLStore) -> None:
    """What the tool records is in the database while it is still running (another connection
    reads it), so a crash after that point leaves the reference for the reconciliation."""
    provider = Provider()
    seen: list[str | None] = []

    def pay(account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        out = provider.pay(account, amount, tool_context)
        record = store.get(tool_context.idempotency_key)
        seen.append(None if record is None else record.provider_ref)
        return out

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow_all("support")
    _, done = run_payment(make_gate(table))
    assert isinstance(done, Executed)
    assert seen == ["prov-1"]
    assert len(provider.effects) == 1


def test_a_lost_reply_keeps_the_reference_the_tool_recorded(make_gate: MakeGate, store: SQLStore) -> None:
    provider = Provider(lose_reply=True)
    gate = paying_gate(make_gate, provider)
    grant, outcome = run_payment(gate)
    assert isinstance(outcome, NeedsReconciliation)
    assert outcome.provider_ref == "prov-1"
    [record] = store.idempotency_records()
    assert (record.status, record.provider_ref) == ("needs_reconciliation", "prov-1")
    assert len(provider.effects) == 1
    # a second execute with the same grant runs nothing: the outcome is parked
    with pytest.raises(Exception):  # noqa: B017,PT011 - refused (token used, or needs reconciliation)
        gate.execute(grant.token)
    assert len(provider.effects) == 1


def test_a_provider_ref_must_be_text_and_a_running_call() -> None:
    loose = ToolContext(idempotency_key="k", call=context("m1"))
    with pytest.raises(RuntimeError, match="not running a call"):
        loose.set_provider_ref("p")
    with pytest.raises(ValueError, match="non-empty"):
        loose.set_provider_ref("")


def test_a_model_id_must_be_text() -> None:
    with pytest.raises(ValueError, match="model_id"):
        dataclasses.replace(context("m1"), model_id=None)  # type: ignore[arg-type]


def _as_version_2(url: str) -> None:
    """Turn a database this release made into what version 2 left: no model_id columns, no
    redaction or hold tables, and version 2's triggers (every UPDATE and DELETE refused)."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    sqlite = url.startswith("sqlite")
    with engine.begin() as conn:
        for table in ("eg_approvals", "eg_executions", "eg_events"):
            if sqlite and table != "eg_approvals":
                conn.exec_driver_sql(f"DROP TRIGGER {table}_no_update")
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN model_id")
            if sqlite and table != "eg_approvals":
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )
        conn.exec_driver_sql("DROP TABLE eg_redacted")
        conn.exec_driver_sql("DROP TABLE eg_holds")
        # version 2's full indexes on eg_events, which every read record entered
        conn.exec_driver_sql("DROP INDEX eg_events_kind")
        conn.exec_driver_sql("DROP INDEX eg_events_approval")
        conn.exec_driver_sql("CREATE INDEX ix_eg_events_kind ON eg_events (kind)")
        conn.exec_driver_sql("CREATE INDEX ix_eg_events_approval_id ON eg_events (approval_id)")
        conn.exec_driver_sql("UPDATE eg_schema_version SET version = 2")
    engine.dispose()


def _event_indexes(store: SQLStore) -> set[tuple[str, str]]:
    """(name, definition) of each index on eg_events, as the database reports it."""
    with store.reading() as conn:
        if conn.dialect.name == "sqlite":
            sql = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'eg_events'"
        else:
            sql = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'eg_events'"
        return {(name, definition or "") for name, definition in conn.exec_driver_sql(sql)}


def test_a_version_2_database_is_upgraded_in_place_keeping_every_row(
    store_url: str, clock: FakeClock, make_gate: MakeGate, store: SQLStore
) -> None:
    provider = Provider()
    gate = paying_gate(make_gate, provider)
    run_payment(gate)
    gate.close()
    fresh = _event_indexes(store)
    store.close()
    _as_version_2(store_url)
    old = open_store(store_url, clock=clock)
    with pytest.raises(StoreError, match="run `effectgate setup`"):
        old.check()
    old.setup()
    with old.reading() as conn:
        assert conn.execute(sa.text("SELECT version FROM eg_schema_version")).scalar() == SCHEMA_VERSION
    [approval] = old.approvals()
    assert (approval.tool, approval.status, approval.model_id) == ("pay", "executed", "")
    assert [(e.tool, e.model_id) for e in old.executions()] == [("pay", "")]
    assert {e.model_id for e in old.events()} == {None}
    # the full indexes are replaced by this release's partial ones, which no read record enters
    assert _event_indexes(old) == fresh
    partial = {"eg_events_kind", "eg_events_approval"}
    assert {name for name, _ in fresh} >= partial
    assert all("WHERE" in definition.upper() for name, definition in fresh if name in partial)
    # still append-only after the upgrade, and a personal column takes only a redaction marker
    for statement in (
        "DELETE FROM eg_executions",
        "UPDATE eg_executions SET tool = 'x'",
        "UPDATE eg_executions SET args_json = '{}'",
    ):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), old.transaction() as conn:
            conn.exec_driver_sql(statement)
    with old.transaction() as conn:
        conn.exec_driver_sql("""UPDATE eg_executions SET args_json = '{"$redacted":"r-1"}'""")
    assert [e.args_json for e in old.executions()] == ['{"$redacted":"r-1"}']
    old.close()
