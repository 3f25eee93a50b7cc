"""The store contracts on PostgreSQL: a throwaway database per test (see tests/conftest.py)."""

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

pytestmark = pytest.mark.postgres


class TestPostgresIdempotency(IdempotencyStoreContract):
    @pytest.fixture
    def make_store(self, pg_url: str, clock: FakeClock) -> Iterator[StoreFactory]:
        with store_factory(pg_url, clock) as make:
            yield make


class TestPostgresApprovals(ApprovalStoreContract):
    @pytest.fixture
    def make_store(self, pg_url: str, clock: FakeClock) -> Iterator[StoreFactory]:
        with store_factory(pg_url, clock) as make:
            yield make
