"""Fixtures for the gate tests: the shop from the running example behind a gate on `store`.

`store` (tests/conftest.py) is parametrized over SQLite and PostgreSQL, so every test that takes
`shop_gate` or `make_gate` runs on both backends. Every gate made here is closed before its store,
so no background read writer outlives its test database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest

from effectgate import EffectGate, EffectTable, Keyring
from effectgate.examples.shop import Shop, app
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock


class ShopGate(NamedTuple):
    shop: Shop
    gate: EffectGate


MakeGate = Callable[..., EffectGate]


@pytest.fixture
def make_gate(store: SQLStore, clock: FakeClock) -> Iterator[MakeGate]:
    """`make_gate(table, **options)`: an EffectGate on `store` with the fake clock and a fresh keyring."""
    made: list[EffectGate] = []

    def make(table: EffectTable, **options: Any) -> EffectGate:
        options.setdefault("keyring", Keyring.generate())
        options.setdefault("clock", clock)
        gate = EffectGate(table, store, **options)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


@pytest.fixture
def shop_gate(store: SQLStore, clock: FakeClock) -> Iterator[ShopGate]:
    shop = Shop()
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop)
    yield ShopGate(shop, gate)
    gate.close()
