"""A large ledger's audit is split at an approval id and its upper half scanned in a forked child:
the split scan must report exactly what the scan in one process reports, in the same order."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import effectgate.audit as audit_module
from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.audit import AuditReport, audit
from effectgate.stores import SQLStore
from effectgate.stores._aggregates import AggregateSQL
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")


def pay(account: str, amount: int) -> dict[str, Any]:
    """Pay an account."""
    return {"paid": amount}


def _table() -> EffectTable:
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("agent", ["pay"])
    return table


def _ledger(store: SQLStore, clock: FakeClock) -> tuple[Keyring, list[str]]:
    """Twelve payments (approved and run, one left pending, one denied), then edits made behind
    the gate's back on both sides of the median approval id; the approval ids, in byte order."""
    keyring = Keyring.generate()
    gate = EffectGate(_table(), store, keyring=keyring, clock=clock)
    ids: list[str] = []
    ran: list[str] = []
    for i in range(12):
        ctx = CallContext(session_id=f"s{i}", origin_message_id=f"m{i}", user_id="u1", agent_id="agent")
        pending = gate.call("pay", {"account": f"a{i}", "amount": 100 + i}, ctx)
        assert isinstance(pending, Pending), pending
        ids.append(pending.approval_id)
        if i == 3:
            gate.deny(pending.approval_id, version=pending.version, approver=FINANCE, reason="no")
            continue
        grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        if i != 5:
            gate.execute(grant.token)
            ran.append(grant.approval_id)
    gate.close()  # no background thread: a process with other threads does not fork
    ids.sort()
    ran.sort()
    first, low, high, again, last = ran[0], ran[2], ran[7], ran[-2], ran[-1]
    with store.transaction() as conn:  # as the database's owner can: without the append-only guard
        for table in ("eg_decisions", "eg_executions", "eg_approvals"):
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_update")
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_delete")
            else:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    with store.transaction() as conn:
        sql = conn.exec_driver_sql
        sql(f"UPDATE eg_decisions SET role = 'support' WHERE approval_id = '{first}'")  # forged
        sql(f"UPDATE eg_executions SET args_json = '{{}}' WHERE approval_id = '{last}'")  # tampered
        sql(f"DELETE FROM eg_approvals WHERE id = '{low}'")  # its execution has no approval
        sql(f"DELETE FROM eg_approvals WHERE id = '{high}'")
        sql(  # a second run of an approval in the upper half
            "INSERT INTO eg_executions (at, approval_id, version, tool, effect, args_hash, args_json, "
            "idempotency_key, status, session_id, origin_message_id, user_id, agent_id, run_id, "
            "table_fingerprint, row_fingerprint, policy_fingerprint, model_id) SELECT at, approval_id, "
            "version, tool, effect, args_hash, args_json, idempotency_key || 'x', status, session_id, "
            "origin_message_id, user_id, agent_id, run_id, table_fingerprint, row_fingerprint, "
            f"policy_fingerprint, model_id FROM eg_executions WHERE approval_id = '{again}'"
        )
    return keyring, ids


def _scan(store: SQLStore, keyring: Keyring, monkeypatch: pytest.MonkeyPatch, *, split: bool) -> AuditReport:
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2 if split else 10**9)
    return audit(store, keyring=keyring)


def _summary(report: AuditReport) -> list[tuple[Any, ...]]:
    return [(f.kind, f.tool, f.detail, f.approval_id, f.execution_id) for f in report.findings]


def test_a_split_scan_reports_what_one_scan_reports(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Findings on both sides of the split, their order, and the metrics are those of one scan."""
    keyring, ids = _ledger(store, clock)
    assert threading.active_count() == 1
    with store.reading() as conn:
        split = store.audit_split(conn, at_least=2)
    assert split is not None
    assert ids[0] < split <= ids[-1]
    whole = _scan(store, keyring, monkeypatch, split=False)
    halves = _scan(store, keyring, monkeypatch, split=True)
    kinds = {f.kind for f in whole.findings}
    assert {"decision_forged", "args_tampered", "no_approval", "executed_twice"} <= kinds
    sides = {f.approval_id is not None and f.approval_id < split for f in whole.findings}
    assert sides == {True, False}  # the child found some of them
    assert _summary(halves) == _summary(whole)
    assert halves.metrics == whole.metrics


def test_a_split_scan_forks(store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the threshold, the upper half is scanned by a child process, which sends its part."""
    keyring, _ = _ledger(store, clock)
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
    scan = audit_module.Scan(store, None, keyring)
    half = audit_module._fork_half(store, scan)
    assert half is not None
    part = half.result()
    assert part is not None
    assert part.findings
    assert half.process.exitcode == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_child_is_scanned_here(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that fails sends nothing: this process scans its half itself, and nothing is lost."""
    keyring, _ = _ledger(store, clock)
    whole = _scan(store, keyring, monkeypatch, split=False)

    def fail(self: AggregateSQL) -> None:
        raise RuntimeError("the child cannot open the database")

    monkeypatch.setattr(AggregateSQL, "audit_forked", fail)
    halves = _scan(store, keyring, monkeypatch, split=True)
    assert _summary(halves) == _summary(whole)
    assert halves.metrics == whole.metrics


def test_a_split_point_is_never_text_that_could_end_the_literal(store: SQLStore) -> None:
    """The split id is written into the statement, so only a plain id is accepted there."""
    with store.reading() as conn, pytest.raises(ValueError, match="plain id"):
        list(store.audit_rows(conn, "approvals", low="a' OR '1'='1"))


def test_an_in_memory_ledger_is_not_split(clock: FakeClock) -> None:
    """A database only this process can see is scanned in this process."""
    memory = open_store("sqlite://", clock=clock)
    memory.setup()
    with memory.reading() as conn:
        assert memory.audit_split(conn, at_least=0) is None
    memory.close()
