"""Fixtures for the proofs: the payment provider, and child processes that start quickly.

Every proof starts fresh Python processes (spawned racers, SIGKILLed executors). Where the
environment forbids bytecode caching (PYTHONDONTWRITEBYTECODE), each child would compile
effectgate and SQLAlchemy from source, about three times the cost of loading them; the children
are pointed at a bytecode cache of their own under pytest's cache directory instead, which
changes nothing but their start-up time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._receiver import PaymentProvider

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def child_pycache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The children's bytecode cache, filled once per session; None when Python may cache anyway."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return None
    cache = request.config.cache
    path = cache.mkdir("proofs-pycache") if cache is not None else tmp_path_factory.mktemp("pycache")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # Spawned children inherit -B from this interpreter: they read the cache but never write it,
    # so one plain child fills it first.
    warm = "import tests.proofs._executor, tests.proofs._racers"
    subprocess.run(
        [sys.executable, "-c", warm], cwd=ROOT, env={**env, "PYTHONPYCACHEPREFIX": str(path)}, check=True
    )
    return path


@pytest.fixture(scope="module", autouse=True)
def fast_children(child_pycache: Path | None) -> Iterator[None]:
    """Children started by this module's tests use the cache; the environment is restored after."""
    with pytest.MonkeyPatch.context() as env:
        if child_pycache is not None:
            env.delenv("PYTHONDONTWRITEBYTECODE")
            env.setenv("PYTHONPYCACHEPREFIX", str(child_pycache))
        yield


@pytest.fixture
def provider() -> Iterator[PaymentProvider]:
    """A provider that honours Idempotency-Key and can be asked by key."""
    with PaymentProvider(honour_keys=True) as p:
        yield p


@pytest.fixture
def careless_provider() -> Iterator[PaymentProvider]:
    """A provider that ignores Idempotency-Key: every POST charges, and it cannot be asked."""
    with PaymentProvider(honour_keys=False) as p:
        yield p
