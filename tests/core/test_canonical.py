"""Canonical JSON and argument hashing: one frozen form per value, refusals with a JSON pointer."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectgate.canonical import (
    ENCODE,
    MAX_SAFE_INTEGER,
    args_hash,
    canonical_json,
    check_json,
    digest,
    key_of,
)
from effectgate.errors import ArgumentError


def pointer_of(value: Any) -> str:
    with pytest.raises(ArgumentError) as raised:
        canonical_json(value)
    return raised.value.pointer


# -- one form per value


def test_key_order_does_not_change_the_bytes() -> None:
    """Objects are serialised with sorted keys, whatever order they were built in."""
    assert canonical_json({"b": 1, "a": "x"}) == canonical_json({"a": "x", "b": 1}) == b'{"a":"x","b":1}'


def test_nested_key_order_does_not_change_the_hash() -> None:
    """Nested objects are sorted too: the args hash is independent of key order at every depth."""
    one = {"order": {"id": "1042", "lines": [{"sku": "a", "qty": 1}]}, "amount": 12000}
    two = {"amount": 12000, "order": {"lines": [{"qty": 1, "sku": "a"}], "id": "1042"}}
    assert args_hash("refund_order", one) == args_hash("refund_order", two)


def test_list_order_does_change_the_hash() -> None:
    """Arrays keep their order: reordered recipients are other arguments."""
    assert args_hash("send_email", {"to": ["a", "b"]}) != args_hash("send_email", {"to": ["b", "a"]})


def test_the_tool_is_part_of_the_hash() -> None:
    """The same arguments to another tool hash differently."""
    args = {"order_id": "1042"}
    assert args_hash("get_order", args) != args_hash("refund_order", args)


def test_every_argument_value_is_part_of_the_hash() -> None:
    """A one-unit change of the amount changes the hash."""
    base = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
    assert args_hash("refund_order", base) != args_hash("refund_order", {**base, "amount": 12001})


def test_args_hash_is_sha256_of_the_canonical_envelope() -> None:
    """args_hash is the digest of {"tool": ..., "args": ...}, a 64-hex-digit sha256."""
    args = {"order_id": "1042"}
    value = args_hash("get_order", args)
    assert value == digest({"tool": "get_order", "args": args})
    assert re.fullmatch("[0-9a-f]{64}", value)


def test_numbers_follow_rfc8785() -> None:
    """Floats use the ECMAScript form: 1.0 is 1, 1e21 is 1e+21, 1e-7 stays 1e-7."""
    assert canonical_json([1.0, 0.1, 1e21, 1e-7]) == b"[1,0.1,1e+21,1e-7]"


def test_strings_are_not_ascii_escaped() -> None:
    """Non-ASCII text is kept as UTF-8, control characters escaped."""
    assert canonical_json({"name": "Zoë\n"}) == '{"name":"Zoë\\n"}'.encode()


def test_canonical_form_parses_back_to_the_value() -> None:
    """The bytes are JSON that decodes to an equal value."""
    value = {"to": ["ada@example.com"], "n": 3, "ok": True, "none": None, "nested": {"x": [1, 2]}}
    assert json.loads(canonical_json(value)) == value


def test_key_of_cannot_be_confused_by_delimiters() -> None:
    """key_of is canonical JSON of the parts, so shifting text between parts changes the key."""
    assert key_of("a|b", "c") != key_of("a", "b|c")
    assert key_of("s1", "m1") == key_of("s1", "m1")
    assert key_of(["a", "b"]) != key_of("a", "b")


# -- refusals carry a JSON pointer


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_floats_are_refused_with_their_pointer(number: float) -> None:
    """NaN and ±Infinity are not JSON numbers: refused at their position."""
    assert pointer_of({"order": {"lines": [{"price": 1.5}, {"price": number}]}}) == "/order/lines/1/price"


def test_integer_beyond_the_exact_range_is_refused_with_its_pointer() -> None:
    """2**60 cannot be carried exactly by a JSON number: refused at /amount."""
    assert pointer_of({"amount": 2**60}) == "/amount"


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER + 1, -(MAX_SAFE_INTEGER + 1)], ids=["2**53", "-2**53"])
def test_first_integers_outside_the_exact_range_are_refused(value: int) -> None:
    """±2**53 is already outside the exact range."""
    assert pointer_of([value]) == "/0"


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER], ids=["2**53-1", "-(2**53-1)"])
def test_largest_exact_integers_are_accepted(value: int) -> None:
    """±(2**53 - 1) is the edge of the exact range and is accepted."""
    assert canonical_json([value]) == f"[{value}]".encode()


def test_two_integers_past_the_range_never_share_a_hash() -> None:
    """Rounding would make 2**53 and 2**53+1 one number; both are refused instead."""
    for value in (2**53, 2**53 + 1):
        with pytest.raises(ArgumentError):
            args_hash("refund_order", {"amount": value})


def test_pointer_escapes_slash_and_tilde() -> None:
    """Keys with '/' or '~' are escaped in the pointer as ~1 and ~0 (RFC 6901)."""
    assert pointer_of({"a/b": {"~c": math.nan}}) == "/a~1b/~0c"


def test_root_value_is_refused_at_the_empty_pointer() -> None:
    """A bad value at the root has the empty pointer."""
    assert pointer_of(math.nan) == ""


def test_non_string_key_is_refused() -> None:
    """Object keys must be strings."""
    with pytest.raises(ArgumentError, match="not a string"):
        canonical_json({"ok": {1: "one"}})


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, object()], ids=["bytes", "set", "object"])
def test_non_json_values_are_refused_with_their_pointer(value: Any) -> None:
    """Bytes, sets and arbitrary objects have no JSON form: refused at their position."""
    assert pointer_of({"x": [value]}) == "/x/0"


def test_check_json_points_into_the_value_it_is_given() -> None:
    """check_json reports pointers relative to the value it checks (the arguments, for the gate)."""
    with pytest.raises(ArgumentError) as raised:
        check_json({"amount": 2**60})
    assert raised.value.pointer == "/amount"


def test_argument_error_message_carries_the_pointer() -> None:
    """The error's text starts with the pointer, so a person reading it finds the value."""
    with pytest.raises(ArgumentError, match=r"^/price: "):
        canonical_json({"price": math.inf})


def test_lone_surrogate_is_refused_with_its_pointer() -> None:
    """A string with a lone surrogate (valid JSON text: "\\ud800") is refused with its pointer."""
    value = json.loads('{"subject": "\\ud800"}')
    assert pointer_of(value) == "/subject"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_the_prebuilt_encoder_writes_what_json_writes(value: object) -> None:
    """ENCODE (its C iterator built once) is byte for byte json's encoder with the same options:
    seals, hashes and stored texts made before it still verify."""
    reference = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
    assert ENCODE(value) == reference(value)
