"""Property-based tests over argument values (hypothesis).

- Two argument sets that are not the same JSON never share a hash; two that are, always do.
- No generated value crashes `call`: it is an Outcome (Invalid when the value has no exact JSON
  form), never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectgate import Effect, EffectGate, EffectTable, Executed, Invalid, Keyring, ToolSpec, open_store
from effectgate.canonical import MAX_SAFE_INTEGER, args_hash, freeze
from effectgate.errors import ArgumentError
from effectgate.examples.shop import context
from effectgate.testing import FakeClock

SAFE_INT = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(
    st.none() | st.booleans() | SAFE_INT | FINITE | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary(max_size=4)
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(
            st.text(max_size=4) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
            children,
            max_size=3,
        )
        | st.dictionaries(st.integers(), children, max_size=2)
        | st.frozensets(st.integers(), max_size=2)
    ),
    max_leaves=12,
)


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, numbers compare by value, arrays in order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def usable(value: Any) -> bool:
    """Values RFC 8785 represents exactly (no lone surrogates in text or keys)."""
    try:
        freeze(value)
    except ArgumentError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(JSON, JSON)
def test_different_json_never_shares_a_hash(a: Any, b: Any) -> None:
    """Two argument values hash the same exactly when they are the same JSON."""
    if not (usable(a) and usable(b)):
        return
    assert (args_hash("t", {"v": a}) == args_hash("t", {"v": b})) == same_json(a, b)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_a_value_and_its_frozen_copy_share_a_hash(a: Any) -> None:
    """Freezing never changes what a JSON value hashes to, and a float and its integer agree."""
    if not usable(a):
        return
    assert args_hash("t", {"v": freeze(a)}) == args_hash("t", {"v": a})
    if isinstance(a, float) and math.isfinite(a) and a.is_integer() and abs(a) <= MAX_SAFE_INTEGER:
        assert args_hash("t", {"v": a}) == args_hash("t", {"v": int(a)})


@pytest.fixture(scope="module")
def echo_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EffectGate]:
    """A gate with one write tool that takes any JSON value (SQLite, file-backed)."""

    def keep(value: Any = None) -> str:
        """Keep a value."""
        return "kept"

    table = EffectTable([ToolSpec(name="keep", effect=Effect.WRITE, fn=keep, schema={"type": "object"})])
    table.allow_all("support")
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('prop')}/p.db", clock=FakeClock())
    store.setup()
    gate = EffectGate(table, store, keyring=Keyring.generate())
    yield gate
    gate.close()
    store.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY, n=st.integers(min_value=0, max_value=10**9))
def test_no_generated_value_crashes_call(echo_gate: EffectGate, value: Any, n: int) -> None:
    """Whatever the model sends, `call` returns an Outcome: Executed or Invalid, never an exception."""
    out = echo_gate.call("keep", {"value": value}, context(f"m{n}"))
    assert isinstance(out, Executed | Invalid)
    assert isinstance(out, Executed) == usable(value)
