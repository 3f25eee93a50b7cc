"""Shared fixtures: a fake clock, and stores on SQLite (file-backed) and PostgreSQL.

`store_url` is parametrized over both backends; every store and gate test that takes it runs on
each. PostgreSQL gives each test an empty database on the server from tests/pgserver.py (emptied
and reused when proven empty, see _pgpool.py). Under
CI=true a PostgreSQL test that cannot reach its server fails; elsewhere it skips with the hint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from effectgate import open_store
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from . import pgserver
from ._pgpool import DatabasePool

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    started_here = not (pgserver.PORT_FILE.exists() or os.environ.get("EFFECTGATE_PG_URL"))
    try:
        url = pgserver.start()
    except (pgserver.Unavailable, OSError) as exc:
        if IN_CI:
            pytest.fail(f"CI: PostgreSQL is required and unavailable: {exc}")
        pytest.skip(str(exc))
    yield url
    if started_here:
        pgserver.stop()


@pytest.fixture(scope="session")
def pg_pool(pg_server: str) -> Iterator[DatabasePool]:
    pool = DatabasePool(sa.engine.make_url(pg_server).set(drivername="postgresql").render_as_string(False))
    yield pool
    pool.close()


@pytest.fixture
def pg_url(pg_pool: DatabasePool) -> Iterator[str]:
    """A fresh, empty database for this test (one emptied and proven empty, see _pgpool)."""
    name = pg_pool.take()
    yield pgserver.url(name)
    pg_pool.give_back(name)


@pytest.fixture
def sqlite_url(tmp_path: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"  # type: ignore[operator]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(store_url: str, clock: FakeClock) -> Iterator[SQLStore]:
    s = open_store(store_url, clock=clock)
    s.setup()
    yield s
    s.close()
