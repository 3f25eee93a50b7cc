"""The test databases' pool (tests/_pgpool.py): a database is reused only when emptied."""

from __future__ import annotations

import psycopg
import pytest

from .._pgpool import DatabasePool

pytestmark = pytest.mark.postgres


def _connect(pool: DatabasePool, name: str) -> psycopg.Connection:
    return pool._connect(name)


def test_a_database_a_test_filled_is_emptied_and_reused(pg_pool: DatabasePool) -> None:
    name = pg_pool.take()
    with _connect(pg_pool, name) as conn:
        conn.execute("CREATE TABLE public.leftover (x int); INSERT INTO leftover VALUES (1)")
        conn.execute("CREATE FUNCTION public.f() RETURNS int AS 'SELECT 1' LANGUAGE sql")
    pg_pool.give_back(name)
    assert pg_pool.take() == name
    with _connect(pg_pool, name) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace")
        assert tables.fetchone() == (0,)
        functions = conn.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        assert functions.fetchone() == (0,)
    pg_pool.give_back(name)


@pytest.mark.parametrize(
    "change",
    [
        "ALTER DATABASE {name} SET default_transaction_isolation TO 'repeatable read'",
        "CREATE SCHEMA other",
        "REVOKE CONNECT ON DATABASE {name} FROM PUBLIC",
    ],
)
def test_a_database_a_test_changed_otherwise_is_dropped(pg_pool: DatabasePool, change: str) -> None:
    name = pg_pool.take()
    with _connect(pg_pool, name) as conn:
        conn.execute(change.format(name=name).encode())
    pg_pool.give_back(name)
    assert pg_pool.take() != name
    exists = pg_pool._admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert exists == (0,)


def test_a_connection_left_open_is_ended_before_the_database_is_reused(pg_pool: DatabasePool) -> None:
    name = pg_pool.take()
    left = _connect(pg_pool, name)
    left.execute("CREATE TABLE held (x int)")
    pg_pool.give_back(name)
    assert pg_pool.take() == name
    with pytest.raises(psycopg.OperationalError):
        left.execute("SELECT 1")
    left.close()
    pg_pool.give_back(name)
