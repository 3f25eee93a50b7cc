"""The connections a store keeps checked out between its operations (`_checkouts.Checkouts`).

Reusing a connection must not change what the pool would have guaranteed: a connection comes back
with no transaction open, one that ended in an error or inside a transaction goes back to the
pool (rolled back there), statement listeners still see every statement, `close` returns every
connection, a connection the server dropped costs one failed operation, and a forked child never
touches its parent's connections.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate.stores import SQLStore

HASH = "h" * 64


def _checkouts(store: SQLStore) -> list[int]:
    """A counter of the pool's checkouts (a pool event: it observes no statement)."""
    seen: list[int] = []
    sa.event.listen(store.engine.pool, "checkout", lambda *_: seen.append(1))
    return seen


def _driver_in_transaction(conn: sa.engine.Connection) -> bool:
    driver: Any = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        return bool(driver.info.transaction_status != 0)
    return bool(driver.in_transaction)


def test_sequential_operations_reuse_one_checkout(store: SQLStore) -> None:
    store.run("warm", HASH, lambda: 0)
    seen = _checkouts(store)
    for i in range(5):
        assert store.run(f"k{i}", HASH, lambda i=i: {"n": i}) == {"n": i}
        with store.transaction() as conn:
            assert store.load(conn, f"k{i}") is not None
    assert seen == []  # ten claims and completions and five transactions, no pool checkout
    assert store.engine.pool.checkedout() == 1  # type: ignore[attr-defined]


def test_a_block_that_raises_returns_its_connection_rolled_back(store: SQLStore) -> None:
    def doomed() -> None:
        with store.transaction() as conn:
            store.claim("doomed", HASH, conn=conn)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        doomed()
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert store.get("doomed") is None
    with store.transaction() as conn:
        assert store.load(conn, "doomed") is None


def test_a_connection_left_in_a_transaction_is_never_reused(store: SQLStore) -> None:
    store.run("warm", HASH, lambda: 0)
    with store._single() as conn:
        driver: Any = conn.connection.driver_connection
        driver.execute("BEGIN")
        driver.execute("UPDATE eg_idempotency SET error = 'left open' WHERE \"key\" = 'warm'")
        assert _driver_in_transaction(conn)
    # the pool took it back and rolled it back: the update never happened
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    record = store.get("warm")
    assert record is not None
    assert record.error is None
    with store._single() as conn:
        assert not _driver_in_transaction(conn)


def test_a_listener_attached_later_sees_every_statement(store: SQLStore) -> None:
    store.run("warm", HASH, lambda: 0)  # a connection is kept
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        store.run("seen", HASH, lambda: 1)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
    assert any(s.startswith("INSERT INTO eg_idempotency") for s in statements)
    assert any(s.startswith("UPDATE eg_idempotency") for s in statements)


def test_close_returns_every_connection(store: SQLStore) -> None:
    store.run("warm", HASH, lambda: 0)
    pool = store.engine.pool
    assert pool.checkedout() == 1  # type: ignore[attr-defined]
    store.close()
    assert pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.postgres
def test_a_dropped_connection_fails_one_operation(pg_url: str) -> None:
    from effectgate import open_store

    with open_store(pg_url) as store:
        store.setup()
        store.run("warm", HASH, lambda: 0)
        with store.transaction() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with sa.create_engine(pg_url).connect() as admin:
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            admin.commit()
        with pytest.raises(sa.exc.DBAPIError):
            store.run("lost", HASH, lambda: 1)
        assert store.run("after", HASH, lambda: 2) == 2
        assert store.get("lost") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_the_parents_connection(store: SQLStore) -> None:
    store.run("warm", HASH, lambda: 0)  # the parent keeps a connection
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:  # nothing done by hand: the store notices the fork itself
            code = 0 if store.run("child", HASH, lambda: "c") == "c" else 2
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.run("parent", HASH, lambda: "p") == "p"  # its connection still works
    record = store.get("child")
    assert record is not None
    assert record.result == "c"


def test_pool_size_keeps_that_many_connections(store_url: str) -> None:
    """`open_store(pool_size=n)`: n connections in use at once are all kept, so n threads that
    use the store at once each find one (no checkout per operation once warm)."""
    from contextlib import ExitStack

    from effectgate import open_store

    s = open_store(store_url, pool_size=3)
    try:
        s.setup()
        assert s.engine.pool.size() == 3  # type: ignore[attr-defined]

        def hold_three() -> None:
            with ExitStack() as stack:
                for _ in range(3):
                    stack.enter_context(s._connected(begin=False))

        hold_three()  # three checkouts, all kept when given back
        seen = _checkouts(s)
        hold_three()
        assert seen == []
        s.run("after", HASH, lambda: 0)
        assert s.get("after") is not None
        assert seen == []
    finally:
        s.close()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "8"])
def test_a_bad_pool_size_is_refused(bad: Any) -> None:
    from effectgate import open_store
    from effectgate.errors import StoreError

    with pytest.raises(StoreError, match="pool_size"):
        open_store("sqlite://", pool_size=bad)


@pytest.mark.postgres
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_sessions(pg_url: str) -> None:
    """A gate's store made before a fork (a pre-fork server): the child's transactions and reads
    run in server sessions of its own, never in the parent's (kept by the store, or idle in the
    engine's pool). Sharing them mixed two processes' statements on one session (a review saw
    rows of one statement read as another's, a valid grant refused as tampered, workers hang)."""
    from effectgate import open_store

    def backends(store: Any) -> tuple[int, int]:
        with store.transaction() as conn:
            kept = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        with store.reading() as conn:
            pooled = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        return kept, pooled

    with open_store(pg_url) as store:
        store.setup()
        parent = backends(store)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.write(write, ",".join(map(str, backends(store))).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            child = tuple(int(p) for p in pipe.read().split(","))
        os.waitpid(pid, 0)
        assert len(child) == 2
        assert not set(child) & set(parent), (parent, child)
        assert backends(store) == parent  # the parent's sessions are untouched
