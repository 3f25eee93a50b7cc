"""The floor: durable writes through plain `sqlite3`, with the store's pragmas.

A file database in WAL mode with `synchronous=FULL` (what `effectgate.stores._dialect` sets:
the WAL is synced at every commit), and every transaction opened with `BEGIN IMMEDIATE` as the
store does; no ORM, no statement building. `SameWrites` replays the very rows a gated cycle
wrote, on the store's own schema; `RawLedger` writes small rows shaped like the ledger's into a
minimal schema of its own.
"""

from __future__ import annotations

import itertools
import secrets
import sqlite3
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: one recorded statement: its SQL, its parameters (for `many`, a list of rows), whether it is
#: an executemany
Statement = tuple[str, Any, bool]

SCHEMA = """
CREATE TABLE approvals (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, tool TEXT NOT NULL, subject_key TEXT NOT NULL,
    args_json TEXT NOT NULL, args_hash TEXT NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, token_hash TEXT, token_used_at REAL
);
CREATE INDEX approvals_session ON approvals (session_id, tool, subject_key, status);
CREATE INDEX approvals_subject ON approvals (subject_key, status);
CREATE TABLE intent_keys (key TEXT PRIMARY KEY, approval_id TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY, approval_id TEXT NOT NULL, version INTEGER NOT NULL,
    approver_id TEXT NOT NULL, role TEXT NOT NULL, decision TEXT NOT NULL, at REAL NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, approval_id TEXT,
    detail_json TEXT NOT NULL
);
CREATE INDEX events_kind ON events (kind);
CREATE TABLE idempotency (
    key TEXT PRIMARY KEY, payload_hash TEXT NOT NULL, status TEXT NOT NULL, lease_owner TEXT,
    lease_expires_at REAL, result_json TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE executions (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, approval_id TEXT, tool TEXT NOT NULL,
    args_hash TEXT NOT NULL, idempotency_key TEXT NOT NULL, status TEXT NOT NULL, result_json TEXT
);
"""

HASH = "ab" * 32


class RawLedger:
    """One `sqlite3` connection on its own file, writing what the gate writes, commit by commit."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA busy_timeout=30000")
        self.conn.executescript(SCHEMA)
        self._ids = itertools.count()

    def close(self) -> None:
        self.conn.close()

    def _tx(self, *statements: tuple[str, tuple[object, ...]]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        for sql, params in statements:
            self.conn.execute(sql, params)
        self.conn.execute("COMMIT")

    def money_cycle(self) -> None:
        """Four commits, mirroring propose (1), approve (1) and execute (2)."""
        i = next(self._ids)
        aid, now, key = uuid.uuid4().hex, time.time(), f"eg_{i}_v1"
        event = "INSERT INTO events (at, kind, approval_id, detail_json) VALUES (?, ?, ?, ?)"
        self._tx(
            (
                "INSERT INTO approvals (id, session_id, tool, subject_key, args_json, args_hash, "
                "status, version, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (aid, f"s{i}", "pay", f"k{i}", f'{{"ref": "r{i}"}}', HASH, "pending", 1, now, now),
            ),
            ("INSERT INTO intent_keys (key, approval_id, version) VALUES (?, ?, ?)", (f"i{i}", aid, 1)),
            (event, (now, "proposed", aid, "{}")),
        )
        self._tx(
            (
                "INSERT INTO decisions (approval_id, version, approver_id, role, decision, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (aid, 1, "fiona", "finance", "approve", now),
            ),
            (
                "UPDATE approvals SET status = ?, token_hash = ?, updated_at = ? WHERE id = ? AND status = ?",
                ("approved", HASH, now, aid, "pending"),
            ),
            (event, (now, "approved", aid, "{}")),
            (event, (now, "token_minted", aid, "{}")),
        )
        self._tx(
            (
                "INSERT INTO idempotency (key, payload_hash, status, lease_owner, lease_expires_at, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, HASH, "in_progress", "owner", now + 60, now, now),
            ),
            ("UPDATE approvals SET token_used_at = ? WHERE id = ? AND status = ?", (now, aid, "approved")),
            (event, (now, "token_used", aid, "{}")),
        )
        self._tx(
            (
                "UPDATE idempotency SET status = ?, result_json = ?, lease_expires_at = NULL, "
                "updated_at = ? WHERE key = ? AND lease_owner = ?",
                ("succeeded", '{"ok": true}', now, key, "owner"),
            ),
            (
                "UPDATE approvals SET status = ?, updated_at = ? WHERE id = ? AND status = ?",
                ("executed", now, aid, "approved"),
            ),
            (
                "INSERT INTO executions (at, approval_id, tool, args_hash, idempotency_key, status, "
                "result_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (now, aid, "pay", HASH, key, "succeeded", '{"ok": true}'),
            ),
            (event, (now, "executed", aid, "{}")),
        )

    def claim_cycle(self) -> None:
        """Two commits, mirroring `claim` (insert the lease) and `complete` (store the result)."""
        key, now = f"c{next(self._ids)}", time.time()
        self._tx(
            (
                "INSERT INTO idempotency (key, payload_hash, status, lease_owner, lease_expires_at, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, HASH, "in_progress", "owner", now + 60, now, now),
            )
        )
        self._tx(
            (
                "UPDATE idempotency SET status = ?, result_json = ?, lease_expires_at = NULL, "
                "updated_at = ? WHERE key = ? AND lease_owner = ?",
                ("succeeded", '{"ok": true}', now, key, "owner"),
            )
        )


class SameWrites:
    """The writes one gated money cycle made, replayed through plain `sqlite3`: the database's
    own work for what the gate commits. `transactions` are the cycle's write statements as the
    store ran them (recorded from its engine, reads left out), grouped by transaction; the file
    was set up by the store (the same tables, indexes and triggers). Each replayed cycle writes
    the same rows with fresh identities: every recorded value in `identities` (long random hex:
    the approval id, the session, the subject and intent keys) becomes a new random value of the
    same length wherever it occurs. `cycles` builds the parameters before a timer starts, so the
    timed part is the transactions alone."""

    def __init__(
        self, path: Path, transactions: Sequence[Sequence[Statement]], identities: Sequence[str]
    ) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA busy_timeout=30000")
        self.transactions = [list(tx) for tx in transactions]
        self.identities = list(identities)

    def close(self) -> None:
        self.conn.close()

    def cycles(self, n: int) -> list[list[list[Statement]]]:
        out = []
        for _ in range(n):
            fresh = [(old, secrets.token_hex(len(old) // 2 + 1)[: len(old)]) for old in self.identities]

            def swap(value: Any, fresh: list[tuple[str, str]] = fresh) -> Any:
                if isinstance(value, str):
                    for old, new in fresh:
                        value = value.replace(old, new)
                    return value
                if isinstance(value, dict):
                    return {k: swap(v) for k, v in value.items()}
                if isinstance(value, (list, tuple)):
                    return type(value)(swap(v) for v in value)
                return value

            out.append([[(sql, swap(params), many) for sql, params, many in tx] for tx in self.transactions])
        return out

    def counts(self) -> dict[str, int]:
        """What the replayed cycles left: approvals executed, keys succeeded, executions,
        decisions and events (each cycle must leave one, one, one, one and five)."""
        queries = {
            "executed approvals": "SELECT count(*) FROM eg_approvals WHERE status = 'executed'",
            "succeeded keys": "SELECT count(*) FROM eg_idempotency WHERE status = 'succeeded'",
            "executions": "SELECT count(*) FROM eg_executions",
            "decisions": "SELECT count(*) FROM eg_decisions",
            "events": "SELECT count(*) FROM eg_events",
        }
        return {what: self.conn.execute(sql).fetchone()[0] for what, sql in queries.items()}

    def run(self, cycles: list[list[list[Statement]]]) -> None:
        execute, executemany = self.conn.execute, self.conn.executemany
        for cycle in cycles:
            for tx in cycle:
                execute("BEGIN IMMEDIATE")
                for sql, params, many in tx:
                    if many:
                        executemany(sql, params)
                    else:
                        execute(sql, params).fetchall()
                execute("COMMIT")
