"""`effectgate audit` over a SQLite ledger whose approval columns were edited to another type
(SQLite keeps what it is given once the append-only triggers are dropped): the audit reports the
record, it does not crash (exit 70, "a bug") and it never holds an execution to a lower bar."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.audit import audit


def ledger(path: Path) -> tuple[EffectTable, str]:
    store = open_store(f"sqlite:///{path}")
    store.setup()

    def pay(ref: str) -> dict[str, bool]:
        """Pay a reference."""
        return {"ok": True}

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("ref",))]
    )
    table.allow("a", ["pay"])
    gate = EffectGate(table, store)
    ctx = CallContext(session_id="s", origin_message_id="m", user_id="u", agent_id="a")
    pending = gate.call("pay", {"ref": "r1"}, ctx)
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    gate.close()
    store.close()
    return table, pending.approval_id


@pytest.mark.parametrize("edit", ["decided_at = 'x'", "created_at = 'x'", "approvals_required = 'x'"])
def test_an_approval_column_of_another_type_is_reported_not_a_crash(tmp_path: Path, edit: str) -> None:
    path = tmp_path / "ledger.db"
    table, approval_id = ledger(path)
    conn = sqlite3.connect(path)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(f"UPDATE eg_approvals SET {edit}")
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}")
    try:
        report = audit(store, table)
    finally:
        store.close()
    if edit.startswith("approvals_required"):  # no count the gate writes: the execution is not covered
        assert any(f.approval_id == approval_id for f in report.findings)
        assert not report.clean
