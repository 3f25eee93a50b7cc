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
_PG_BEFORE = pytest.StashKey[bool]()  # whether a server ran before this pytest run (xdist's controller)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist each worker starts the server on its first PostgreSQL test (idempotent,
    # locked); none stops it, since another may still be using it: the controller does, at the
    # end, if there was none before the run.
    if not _xdist_worker(config):
        config.stash[_PG_BEFORE] = pgserver.PORT_FILE.exists() or bool(os.environ.get("EFFECTGATE_PG_URL"))


def pytest_unconfigure(config: pytest.Config) -> None:
    workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin("xdist") else None
    if not _xdist_worker(config) and workers and not config.stash.get(_PG_BEFORE, True):
        pgserver.stop()


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[str]:
    started_here = not (pgserver.PORT_FILE.exists() or os.environ.get("EFFECTGATE_PG_URL"))
    started_here = started_here and not _xdist_worker(pytestconfig)
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
