"""Shared fixtures: a fake clock, and stores on SQLite (file-backed) and PostgreSQL.

`store_url` is parametrized over both backends; every store and gate test that takes it runs on
each. PostgreSQL uses a throwaway database per test on the server from tests/pgserver.py. Under
CI=true a PostgreSQL test that cannot reach its server fails; elsewhere it skips with the hint.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from effectgate import open_store
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from . import pgserver

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


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database for this test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(pg_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    yield pgserver.url(name)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.dispose()


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
