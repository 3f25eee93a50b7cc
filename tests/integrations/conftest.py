"""What every adapter suite shares: the shop behind its gate on a fresh SQLite store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effectgate.testing import FakeClock
from tests.conformance.adapters import ShopGate, open_shop_gate


@pytest.fixture
def shop_gate(sqlite_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    with open_shop_gate(sqlite_url, clock) as parts:
        yield parts
