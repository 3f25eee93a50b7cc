"""(f) `effectgate audit` over a large ledger: wall time, CPU time and peak memory of one scan.

The ledger is written straight into a SQLite file (building it through the gate would take hours):
rows exactly as the gate writes them, sealed with the gate's keyring, for a money tool approved by
finance. `records` counts every row: per gated call one approval, one decision, one execution and
five events (proposed, approved, token_minted, token_used, executed); the rest are read events, the
most frequent record in a real ledger. The scan runs in a child process, so its peak RSS is its
own (VmHWM in /proc/self/status; `ru_maxrss` would carry the builder's peak across exec). A large
ledger's scan forks a second process for half of it: its CPU time is counted, and its peak RSS is
added to the scan's (an upper bound: pages they share count twice). The target holds for what a
user waits for, so the whole `effectgate audit` command is timed too, as a process from start to
exit (interpreter, imports, scan), and `met` takes the larger of the two times.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    ToolSpec,
    open_store,
)
from effectgate._seal import seal_approval, seal_decision
from effectgate.canonical import canonical_text, hash_of_text
from effectgate.stores.records import ApprovalRow

TARGET_SECONDS = 2.0
TARGET_MB = 300.0
EVENTS_PER_GATED = 5


def pay(account: str, amount: int) -> dict[str, Any]:
    """Pay an account."""
    return {"paid": amount}


def _table() -> EffectTable:
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("bench", ["pay"])
    return table


@dataclass(frozen=True)
class Ledger:
    path: Path
    keyring: str
    records: int
    gated: int


def build(directory: Path, *, records: int, gated: int) -> Ledger:
    """A ledger of `records` rows, `gated` of the calls in it gated (8 rows each), the rest reads."""
    path = directory / f"audit-{records}-{gated}.db"
    path.unlink(missing_ok=True)
    keyring = Keyring.generate()
    store = open_store(f"sqlite:///{path}")
    store.setup()
    table = _table()
    spec = table["pay"]
    with EffectGate(table, store, keyring=keyring) as gate:
        # one real proposal records the row and the policy under their fingerprints
        ctx = CallContext(session_id="s0", origin_message_id="m0", user_id="u0", agent_id="bench")
        pending = gate.call("pay", {"account": "a0", "amount": 1}, ctx)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("f0", "finance"))  # type: ignore[union-attr]
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        policy_fp, table_fp = gate.policy.fingerprint, gate.table.fingerprint
    store.close()
    approvals, decisions, executions, events = [], [], [], []
    now = 1_800_000_000.0
    for i in range(gated - 1):
        args = {"account": f"a{i}", "amount": 100 + i % 1000}
        text = canonical_text(args)
        h = hash_of_text("pay", text)
        aid = uuid.uuid4().hex
        row = ApprovalRow(
            id=aid,
            session_id=f"s{i % 5000}",
            origin_message_id=f"m{i}",
            user_id=f"u{i % 5000}",
            agent_id="bench",
            tool="pay",
            effect="money",
            reversibility="irreversible",
            subject_key=f"k{i}",
            args_json=text,
            args_hash=h,
            approver_role="finance",
            approvals_required=1,
            status="executed",
            version=1,
            created_at=now,
            updated_at=now,
            expires_at=now + 86400,
            decided_at=now + 30,
            row_fingerprint=spec.fingerprint,
            table_fingerprint=table_fp,
            policy_fingerprint=policy_fp,
            grants=1,
        )
        row.seal = seal_approval(keyring, row)
        approvals.append(row.model_dump())
        values = {
            "approval_id": aid,
            "version": 1,
            "grant_round": 0,
            "approver_id": "f1",
            "role": "finance",
            "decision": "approve",
        }
        decisions.append({**values, "reason": None, "at": now, "seal": seal_decision(keyring, values)})
        executions.append(
            {
                "at": now,
                "approval_id": aid,
                "version": 1,
                "tool": "pay",
                "effect": "money",
                "args_hash": h,
                "args_json": text,
                "idempotency_key": f"eg_{aid}_v1",
                "status": "succeeded",
                "session_id": row.session_id,
                "origin_message_id": row.origin_message_id,
                "user_id": row.user_id,
                "agent_id": "bench",
                "run_id": "",
                "table_fingerprint": table_fp,
                "row_fingerprint": spec.fingerprint,
                "policy_fingerprint": policy_fp,
                "result_json": '{"paid":1}',
            }
        )
        for kind in ("proposed", "approved", "token_minted", "token_used", "executed"):
            events.append((now, kind, aid, 1, "pay", "money", h, row.session_id, row.user_id, "{}"))
    reads = max(0, records - 8 * gated)
    conn = sqlite3.connect(path)
    with conn:
        _insert(conn, "eg_approvals", approvals)
        _insert(conn, "eg_decisions", decisions)
        _insert(conn, "eg_executions", executions)
        conn.executemany(
            "INSERT INTO eg_events (at, kind, approval_id, version, tool, effect, args_hash, session_id, "
            "user_id, detail_json) VALUES (?,?,?,?,?,?,?,?,?,?)",
            events,
        )
        conn.executemany(
            "INSERT INTO eg_events (at, kind, tool, effect, args_hash, session_id, user_id, agent_id, "
            "detail_json) VALUES (?, 'read', 'get_order', 'read', ?, ?, ?, 'bench', '{\"attempts\": 1}')",
            ((now, "0" * 64, f"s{i % 50000}", f"u{i % 50000}") for i in range(reads)),
        )
    conn.close()
    return Ledger(path, keyring.dumps(), records, gated)


def _insert(conn: sqlite3.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    conn.executemany(sql, ([r[c] for c in columns] for r in rows))


_CHILD = """
import json, resource, sys, time
from effectgate import Keyring, open_store
from effectgate.audit import audit
store = open_store(sys.argv[1])
keyring = Keyring.parse(sys.argv[2])
def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
w, c, cc = time.perf_counter(), time.process_time(), children_cpu()
report = audit(store, keyring=keyring)
w, c = time.perf_counter() - w, time.process_time() - c + children_cpu() - cc  # with a forked half's
def peak_mb():
    # VmHWM: this process's own peak (ru_maxrss carries the parent's peak across fork and exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
# the scan's second process, if it forked one: its peak is added (an upper bound: the pages it
# shares with this process count twice)
child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"wall": w, "cpu": c, "findings": len(report.findings), "rss_mb": peak_mb() + child_mb}))
"""


@dataclass(frozen=True)
class AuditResult:
    records: int
    gated: int
    wall_s: float
    cpu_s: float
    rss_mb: float
    findings: int
    command_s: float  # the whole `effectgate audit` command: interpreter, imports, scan, exit

    @property
    def met(self) -> bool:
        return (
            max(self.wall_s, self.command_s) <= TARGET_SECONDS
            and self.rss_mb <= TARGET_MB
            and self.findings == 0
        )


def command(ledger: Ledger) -> float:
    """Wall time of `effectgate audit` on the ledger, as a user runs it: a new process, from
    its start to its exit (it must exit 0: clean)."""
    env = {**os.environ, "EFFECTGATE_KEYRING": ledger.keyring}
    argv = [sys.executable, "-m", "effectgate.cli", "audit", "--db", f"sqlite:///{ledger.path}", "--json"]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"effectgate audit exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def scan(ledger: Ledger) -> AuditResult:
    """One audit in a child process (its own peak memory), then the whole command's time (the
    better of two runs: the first also reads the ledger into the page cache if it is not)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, f"sqlite:///{ledger.path}", ledger.keyring],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    whole = min(command(ledger), command(ledger))
    return AuditResult(
        ledger.records, ledger.gated, data["wall"], data["cpu"], data["rss_mb"], data["findings"], whole
    )


def run(directory: Path, *, records: int, gated: int) -> AuditResult:
    ledger = build(directory, records=records, gated=gated)
    try:
        return scan(ledger)
    finally:
        ledger.path.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm", ".keys"):
            Path(f"{ledger.path}{suffix}").unlink(missing_ok=True)


def report(result: AuditResult) -> str:
    verdict = "met" if result.met else "MISSED"
    return (
        f"  audit of {result.records:,} records ({result.gated:,} gated calls): {result.wall_s:.2f} s wall, "
        f"{result.cpu_s:.2f} s CPU, {result.rss_mb:.0f} MB peak, {result.findings} findings; the whole "
        f"`effectgate audit` command {result.command_s:.2f} s "
        f"(target <= {TARGET_SECONDS:g} s, <= {TARGET_MB:g} MB, clean): {verdict}"
    )


if __name__ == "__main__":  # python -m benchmarks.audit_scale RECORDS GATED
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run(Path(tmp), records=int(sys.argv[1]), gated=int(sys.argv[2]))
        print(report(result), f"(built and scanned in {time.perf_counter() - start:.0f} s)")
    del resource
