"""The canonical-JSON fast path is byte-identical to the rfc8785 package wherever it is taken."""

from __future__ import annotations

import random
from typing import Any

import rfc8785

from effectgate.canonical import canonical_json, plain_json

CHARS = ["a", "Z", '"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "\u2028", "\u20ac",
         "\ue000", "\uffff", "😀", "/", "<", "\b", "\f", "\r"]  # fmt: skip


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 6)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice([None, True, False, rng.randint(-(2**53) + 1, 2**53 - 1), rng.randint(-5, 5),
                           _string(rng), rng.random() * 1e6])  # fmt: skip
    if roll < 0.65:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_string(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_fast_path_matches_rfc8785_on_generated_values() -> None:
    """For 20,000 seeded random values, every one the fast path accepts encodes as rfc8785 does."""
    rng = random.Random(8785)
    taken = 0
    for _ in range(20_000):
        value = _value(rng)
        if plain_json(value):
            taken += 1
            assert canonical_json(value) == rfc8785.dumps(value), value
    assert taken > 5_000  # the comparison really exercised the fast path


def test_fast_path_declines_what_it_cannot_encode_exactly() -> None:
    """Floats, keys outside the BMP, lone surrogates and unsafe integers go to rfc8785."""
    assert not plain_json({"amount": 1.5})
    assert not plain_json({"😀": 1})
    assert not plain_json(["\ud800"])
    assert not plain_json({"n": 2**53})
    assert canonical_json({"😀": 1, "\uffff": 2}) == rfc8785.dumps({"😀": 1, "\uffff": 2})
