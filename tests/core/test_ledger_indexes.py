"""The ledger's indexes on approvals and intent keys (issue 15): each one a query reads, none that a
status change rewrites for nothing, and a database made by an earlier release brought to the same
indexes by `setup`, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import Pending, Refused
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, open_store
from effectgate.testing import FakeClock

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
TABLES = ("eg_approvals", "eg_intent_keys")


def _indexes(store: SQLStore) -> set[tuple[str, str, str]]:
    """(table, index name, definition) of every index on the approvals and intent keys, as the
    database reports it (primary keys' own indexes included)."""
    with store.reading() as conn:
        if conn.dialect.name == "sqlite":
            sql = "SELECT tbl_name, name, COALESCE(sql, '') FROM sqlite_master WHERE type = 'index'"
        else:
            sql = "SELECT tablename, indexname, indexdef FROM pg_indexes"
        return {(t, n, d) for t, n, d in conn.exec_driver_sql(sql) if t in TABLES}


def _as_earlier_release(url: str) -> None:
    """Give the database the indexes an earlier release made: (subject_key, status) and
    (session_id, tool, subject_key, status) on approvals, which every status change rewrote, and
    the intent keys' approval id, which no query read."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX eg_approvals_subject")
        conn.exec_driver_sql("CREATE INDEX eg_approvals_subject_status ON eg_approvals (subject_key, status)")
        conn.exec_driver_sql("DROP INDEX eg_approvals_session")
        conn.exec_driver_sql(
            "CREATE INDEX eg_approvals_session_subject "
            "ON eg_approvals (session_id, tool, subject_key, status)"
        )
        conn.exec_driver_sql("CREATE INDEX ix_eg_intent_keys_approval_id ON eg_intent_keys (approval_id)")
    engine.dispose()


def test_no_approval_index_but_the_status_one_holds_the_status(store: SQLStore) -> None:
    """Only the status-and-time index holds the status: a status change (approved, executed)
    rewrites no other index page, and nothing indexes intent keys by approval."""
    names = {name for _, name, _ in _indexes(store)}
    assert {"eg_approvals_session", "eg_approvals_subject", "eg_approvals_status_created"} <= names
    assert "eg_approvals_subject_status" not in names
    assert "eg_approvals_session_subject" not in names
    assert "ix_eg_intent_keys_approval_id" not in names
    with_status = {n for t, n, d in _indexes(store) if t == "eg_approvals" and "status" in d}
    assert with_status == {"eg_approvals_status_created"}


def test_an_earlier_releases_indexes_are_replaced_by_setup(
    store_url: str, store: SQLStore, clock: FakeClock
) -> None:
    """A database with an earlier release's indexes gets exactly a fresh database's from `setup`,
    which is idempotent, and keeps every row."""
    fresh = _indexes(store)
    store.close()
    _as_earlier_release(store_url)
    old = open_store(store_url, clock=clock)
    try:
        assert _indexes(old) != fresh
        old.setup()
        assert _indexes(old) == fresh
        old.setup()
        assert _indexes(old) == fresh
    finally:
        old.close()


@pytest.mark.parametrize("upgraded", [False, True], ids=["fresh", "upgraded"])
def test_a_subject_pending_in_another_session_is_still_found(
    shop_gate: ShopGate, store: SQLStore, store_url: str, upgraded: bool
) -> None:
    """The subject index answers the in-flight check: another session's refund of the same order
    is refused as busy, on a fresh database and on one whose indexes were upgraded."""
    _, gate = shop_gate
    if upgraded:
        _as_earlier_release(store_url)
        store.setup()
    first = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(first, Pending)
    out = gate.call("refund_order", {**REFUND, "amount": 6000}, context("p1", session_id="s-other"))
    assert isinstance(out, Refused)
    assert (out.code, out.approval_id) == ("subject_busy", first.approval_id)
