"""The store contracts on file-backed SQLite (never :memory:, so threads really share a file)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effectgate.testing import FakeClock
from tests.conformance.stores import (
    ApprovalStoreContract,
    IdempotencyStoreContract,
    StoreFactory,
    store_factory,
)


class TestSQLiteIdempotency(IdempotencyStoreContract):
    @pytest.fixture
    def make_store(self, sqlite_url: str, clock: FakeClock) -> Iterator[StoreFactory]:
        with store_factory(sqlite_url, clock) as make:
            yield make


class TestSQLiteApprovals(ApprovalStoreContract):
    @pytest.fixture
    def make_store(self, sqlite_url: str, clock: FakeClock) -> Iterator[StoreFactory]:
        with store_factory(sqlite_url, clock) as make:
            yield make
