"""Round 6: the audit, the ledger's chain and the export over a SQLite ledger edited by its owner.

SQLite keeps whatever an edit stores once the append-only triggers are dropped: `CAST(x AS BLOB)`
keeps the same bytes as a blob, a time can become text. PostgreSQL's typed columns refuse such
edits, so these ledgers are SQLite files (as in `test_audit_column_types.py`). Whatever the edit,
`effectgate audit` reports the record (exit 1), `audit --chain` names the broken range, and a seal
(hence `effectgate export`) refuses with a clear error and writes nothing: none of them may crash
(exit 70, "a bug") or hold an execution to a lower bar.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
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
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.audit import audit
from effectgate.chain import ChainError, seal_chain
from effectgate.cli import keyring_for, main
from effectgate.export import export_chain, manifest_path
from effectgate.testing import FakeClock

RAN: dict[str, int] = {}


def _table() -> EffectTable:
    def pay(ref: str) -> dict[str, bool]:
        """Pay a reference."""
        RAN["pay"] = RAN.get("pay", 0) + 1
        return {"ok": True}

    def wipe(ref: str) -> dict[str, bool]:
        """Wipe a reference."""
        RAN["wipe"] = RAN.get("wipe", 0) + 1
        return {"ok": True}

    table = EffectTable(
        [
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("ref",)),
            ToolSpec(
                name="wipe", effect=Effect.DESTRUCTIVE, fn=wipe, approver_role="privacy", subject=("ref",)
            ),
        ]
    )
    table.allow("a", ["pay", "wipe"])
    return table


def ledger(path: Path, clock: FakeClock, *, seal: bool) -> str:
    """A payment (one finance approver) and a wipe (two privacy approvers), both run; with `seal`,
    checkpointed. The append-only triggers are then dropped, as the database's owner can. Returns
    the database URL (its keyring is the key file beside it)."""
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        store.setup()
        keyring = keyring_for(url)
        with EffectGate(_table(), store, keyring=keyring, clock=clock) as gate:
            ctx = CallContext(session_id="s", origin_message_id="m", user_id="u", agent_id="a")
            for tool, role, approvers in (("pay", "finance", 1), ("wipe", "privacy", 2)):
                pending = gate.call(tool, {"ref": "r1"}, ctx)
                assert isinstance(pending, Pending)
                grant: Any = None
                for i in range(approvers):
                    grant = gate.approve(
                        pending.approval_id, version=1, approver=Approver(f"{role}{i}", role)
                    )
                assert isinstance(grant, Grant)
                gate.execute(grant.token)
            gate.flush()
        if seal:
            assert seal_chain(store, keyring, now=clock.now() + 61)
        assert audit(store, keyring=keyring, chain=True).clean
    assert RAN.pop("pay") == RAN.pop("wipe") == 1
    conn = sqlite3.connect(path)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.commit()
    conn.close()
    return url


def edit(path: Path, statement: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(statement)
    conn.commit()
    conn.close()


def _pay_execution(path: Path) -> int:
    conn = sqlite3.connect(path)
    (ex_id,) = conn.execute("SELECT id FROM eg_executions WHERE CAST(tool AS TEXT) = 'pay'").fetchone()
    conn.close()
    return int(ex_id)


BLOB_EDITS = [
    "UPDATE eg_approvals SET id = CAST(id AS BLOB) WHERE tool = 'pay'",
    "UPDATE eg_decisions SET approval_id = CAST(approval_id AS BLOB) "
    "WHERE approval_id = (SELECT id FROM eg_approvals WHERE tool = 'pay')",
    "UPDATE eg_executions SET approval_id = CAST(approval_id AS BLOB) WHERE tool = 'pay'",
    "UPDATE eg_executions SET tool = CAST(tool AS BLOB) WHERE tool = 'pay'",
]
BLOB_IDS = ["approval-id", "decision-approval-id", "execution-approval-id", "execution-tool"]


@pytest.mark.parametrize("statement", BLOB_EDITS, ids=BLOB_IDS)
def test_an_id_or_tool_stored_as_a_blob_is_reported_not_a_crash(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str], statement: str
) -> None:
    """The merge of the approval, decision and execution streams compared a blob with text
    (TypeError), and a finding naming a blob could not be written as JSON: `effectgate audit`
    exited 70. Now the payment's execution is reported (it is held to no approval it can show)."""
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=False)
    ex_id = _pay_execution(path)
    edit(path, statement)
    capsys.readouterr()
    assert main(["audit", "--db", url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] is False
    ran = [f for f in report["findings"] if f["execution_id"] == ex_id]
    assert ran, report["findings"]
    assert all(f["execution_id"] != ex_id + 1 for f in report["findings"])  # the wipe is still clean


@pytest.mark.parametrize("column", ["tool", "idempotency_key", "row_fingerprint"])
def test_a_checkpointed_row_holding_a_blob_is_a_chain_break_not_a_crash(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str], column: str
) -> None:
    """A value no JSON encoder writes, in a chained column of a checkpointed row, crashed the
    chain's verification (`audit --chain`, and every export, which audits first)."""
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=True)
    ex_id = _pay_execution(path)
    edit(path, f"UPDATE eg_executions SET {column} = CAST({column} AS BLOB) WHERE id = {ex_id}")
    capsys.readouterr()
    assert main(["audit", "--db", url, "--chain", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["tool"] for f in findings if f["kind"] == "chain_broken"] == ["eg_executions"]
    out = tmp_path / "out.jsonl"
    assert main(["export", "--db", url, "--out", str(out)]) == 4  # refused: the audit's findings
    assert not out.exists()


@pytest.mark.parametrize(
    "assignment", ["tool = CAST(tool AS BLOB)", "at = 'yesterday'"], ids=["blob", "text-time"]
)
def test_a_row_not_yet_checkpointed_holding_what_no_gate_writes_is_not_sealed(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str], assignment: str
) -> None:
    """The seal (`export` seals first) crashed with a TypeError on such a row; it now refuses,
    appending no checkpoint and writing no export."""
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=False)
    edit(path, f"UPDATE eg_executions SET {assignment} WHERE id = {_pay_execution(path)}")
    with open_store(url) as store:
        with pytest.raises(ChainError, match="edited"):
            seal_chain(store, keyring_for(url, create=False), now=clock.now() + 61)
        with pytest.raises(ChainError):
            export_chain(store, keyring_for(url, create=False), tmp_path / "a.jsonl", now=clock.now() + 61)
        with store.reading() as conn:
            assert list(store.checkpoints(conn)) == []
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    code = main(["export", "--db", url, "--out", str(out)])
    err = capsys.readouterr().err
    assert code not in (0, 70), err
    assert "edited" in err
    assert not out.exists()
    assert not manifest_path(out).exists()


def test_a_rule_fingerprint_stored_as_a_blob_is_a_missing_rule_not_a_crash(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading the recorded rules compared a blob key with text (TypeError): `effectgate audit`
    and `export` exited 70. A rule no text fingerprint names is not recorded: each approval made
    under it is `rule_missing`, and nothing is exported."""
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=True)
    edit(path, "UPDATE eg_rules SET fingerprint = CAST(fingerprint AS BLOB)")
    capsys.readouterr()
    assert main(["audit", "--db", url, "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert {f["tool"] for f in findings if f["kind"] == "rule_missing"} == {"pay", "wipe"}
    out = tmp_path / "out.jsonl"
    assert main(["export", "--db", url, "--out", str(out)]) == 4
    assert not out.exists()


@pytest.mark.parametrize("statement", BLOB_EDITS, ids=BLOB_IDS)
def test_a_split_scan_of_a_ledger_holding_blobs_reports_what_one_scan_reports(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, statement: str
) -> None:
    """Rows whose approval id is a blob sort after every text id in one stream and among them in
    another: scanned in two processes (`audit._fork_half`), each is still reported once."""
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=False)
    edit(path, statement)
    with open_store(url) as store:
        keyring = keyring_for(url, create=False)
        monkeypatch.setattr(audit_module, "PARALLEL_FROM", 10**9)
        whole = audit(store, keyring=keyring)
        monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
        halves = audit(store, keyring=keyring)
    assert not whole.clean
    assert sorted(map(str, halves.findings)) == sorted(map(str, whole.findings))
    assert halves.metrics == whole.metrics
