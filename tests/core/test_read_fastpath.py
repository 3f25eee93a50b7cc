"""The read hot path's shortcuts decide exactly what the full path decides.

`canonical.plain_checker` (one walk that checks, freezes and writes the canonical text for a
simple schema) and `Calls.call` (a read run without a generator) are shortcuts: every value they
accept must be one the full path (`freeze_plain`, the schema validators, `canonical_text`) accepts
with the same frozen form and text, and every other value must fall back to that path.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectgate import (
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Invalid,
    ToolSpec,
    flow,
    open_store,
)
from effectgate._calls import Calls
from effectgate.canonical import MAX_SAFE_INTEGER, args_hash, canonical_text, hash_of_text, plain_checker


class Level(enum.IntEnum):
    LOW = 1


class Key(str):
    pass


def _props(**kinds: str) -> dict[str, Any]:
    return {name: {"type": kind, "title": name.upper()} for name, kind in kinds.items()}


SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": _props(a="integer", b="integer"),
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": _props(n="number", s="string", f="boolean", z="null"),
        "required": ["s"],
        "additionalProperties": False,
        "title": "mixed",
    },
    {"type": "object", "properties": _props(q="string"), "additionalProperties": False},
]

_scalars = st.one_of(
    st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([0, 1, -1, MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, -MAX_SAFE_INTEGER - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.0, 2.0, -0.0, True, False, None, Level.LOW, Key("x"), "\ud800", "é", ""]),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_keys = st.sampled_from(["a", "b", "n", "s", "f", "z", "q", "extra", Key("a"), Key("s")])


def _closed(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


def _spec(schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name="t", effect=Effect.READ, fn=lambda **kw: kw, schema=schema)


SPECS = [_spec(schema) for schema in SCHEMAS]


@settings(max_examples=600, deadline=None)
@given(index=st.integers(0, len(SCHEMAS) - 1), args=st.dictionaries(_keys, _scalars, max_size=5))
def test_the_fast_check_accepts_only_what_the_full_path_accepts_as_plain(index: int, args: Any) -> None:
    """A text from the fast check means valid, plain JSON as given, and the full path's text."""
    spec = SPECS[index]
    check = plain_checker(spec.schema or {})
    assert check is not None
    text = check(args)
    full = Calls.validate(spec, args)
    if text is None:
        return
    assert not isinstance(full, Invalid)
    frozen, plain = full
    assert plain
    assert frozen == args
    assert text == canonical_text(frozen, plain=True)
    assert hash_of_text("t", text) == args_hash("t", frozen)


def test_the_fast_check_takes_the_common_valid_calls() -> None:
    """The shortcut is taken for ordinary valid arguments (else it saves nothing)."""
    assert plain_checker(SCHEMAS[0])({"b": 2, "a": 1}) == '{"a":1,"b":2}'  # type: ignore[misc]
    check = plain_checker(SCHEMAS[1])
    assert check is not None
    assert check({"s": 'q"\n', "f": True, "z": None, "n": -3}) == '{"f":true,"n":-3,"s":"q\\"\\n","z":null}'
    assert check({"s": "é"}) == '{"s":"é"}'


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": _props(a="integer")},  # open: additionalProperties absent
        {"type": "object", "properties": _props(a="integer"), "additionalProperties": True},
        {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0}},
            "additionalProperties": False,
        },
        _closed({"a": {"enum": [1, 2]}}),
        _closed({"a": {"type": ["integer", "null"]}}),
        {
            "type": "object",
            "properties": {"a": {"anyOf": [{"type": "integer"}]}},
            "additionalProperties": False,
        },
        _closed({"a": {"type": "array"}}),
        _closed({"é": {"type": "integer"}}),
        {
            "type": "object",
            "properties": _props(a="integer"),
            "required": ["b"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": _props(a="integer"),
            "additionalProperties": False,
            "minProperties": 1,
        },
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": _props(a="integer"),
            "additionalProperties": False,
        },
    ],
)
def test_a_schema_with_anything_more_has_no_fast_check(schema: dict[str, Any]) -> None:
    """Any keyword beyond scalar types, required names and a closed object takes the full path."""
    assert plain_checker(schema) is None


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def gate(tmp_path: Path) -> Any:
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    store.setup()
    table = EffectTable([ToolSpec(name="add", effect=Effect.READ, fn=add)], allow={"bot": ["add"]})
    with EffectGate(table, store) as g:
        yield g
    store.close()


CTX = CallContext(session_id="s", origin_message_id="m1", user_id="u", agent_id="bot")


def test_gate_call_and_the_flow_agree_on_every_read_outcome(gate: EffectGate) -> None:
    """`gate.call` (inline) and the driven flow return equal outcomes for valid and invalid reads."""
    cases: list[tuple[Any, bool]] = [  # the arguments, and whether the read runs
        ({"a": 1, "b": 2}, True),
        ({"a": 1.0, "b": 2}, True),
        ({Key("a"): 1, "b": 2}, True),
        ({"a": True, "b": 2}, False),
        ({"a": 1}, False),
        ({"a": 1, "b": 2, "c": 3}, False),
        ({"a": "1", "b": 2}, False),
        ({"a": 2**60, "b": 1}, False),
        ([1, 2], False),
    ]
    for args, runs in cases:
        inline = gate.call("add", args, CTX)
        driven = flow.drive(gate.flows.call("add", args, CTX))
        assert inline == driven, args
        assert isinstance(inline, Executed) is runs, args


def test_a_read_record_hashes_the_arguments_as_they_were_at_call_time(gate: EffectGate) -> None:
    """Mutating the caller's dict after the call changes nothing recorded."""
    args = {"a": 1, "b": 2}
    assert gate.call("add", args, CTX) == Executed(tool="add", result=3)
    args["a"] = 5
    gate.flush()
    reads = gate.store.events(kind="read")
    assert [r.args_hash for r in reads] == [args_hash("add", {"a": 1, "b": 2})]


def test_an_inline_read_outcome_is_an_ordinary_executed(gate: EffectGate) -> None:
    """The fast-built Executed equals, hashes and prints like one built by its constructor."""
    out = gate.call("add", {"a": 1, "b": 2}, CTX)
    plain = Executed(tool="add", result=3)
    assert out == plain
    assert hash(out) == hash(plain)
    assert repr(out) == repr(plain)
    assert vars(out) == vars(plain)
