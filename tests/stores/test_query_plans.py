"""SQLite's plans for the hot approval reads: each walks the index of its own session or subject,
never a ledger-wide one (SQLite keeps no statistics, so a plan it picks is the plan it keeps)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from effectgate import open_store
from effectgate.stores import _queries as Q
from effectgate.stores import _statements as S


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    path = tmp_path / "plans.db"
    store = open_store(f"sqlite:///{path}")
    store.setup()
    store.close()
    return sqlite3.connect(path)


def _plan(db: sqlite3.Connection, sql: str) -> str:
    params = re.findall(r":p_\w+", sql)
    rows = db.execute("EXPLAIN QUERY PLAN " + re.sub(r":p_\w+", "?", sql), ["x"] * len(params))
    return " | ".join(r[3] for r in rows)


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        # propose reads its session's pending approvals: with the status index it would read
        # every pending approval of every session
        (S.PENDING_OF_SESSION, "eg_approvals_session (session_id=?)"),
        (S.IN_FLIGHT_ELSEWHERE, "eg_approvals_subject (subject_key=?)"),
        (S.APPROVAL_FOR_KEY, "sqlite_autoindex_eg_intent_keys_1 (key=?)"),
    ],
)
def test_hot_reads_walk_their_own_index(db: sqlite3.Connection, sql: str, index: str) -> None:
    plan = _plan(db, sql)
    assert index in plan, plan
    assert "status_created" not in plan, plan


def test_first_proposed_walks_the_approvals_event_index(db: sqlite3.Connection) -> None:
    """The order of a step's waiting calls is read through the approvals' event index, never
    by scanning the event log or every "proposed" event."""
    compiled = Q.first_proposed().compile(dialect=sqlite_dialect())
    expanded = compiled.construct_expanded_state({"p_ids": ["a", "b"]})
    rows = db.execute("EXPLAIN QUERY PLAN " + expanded.statement, expanded.positional_parameters or ())
    plan = " | ".join(r[3] for r in rows)
    assert "eg_events_approval (approval_id=?)" in plan, plan
    assert "eg_events_kind" not in plan, plan
