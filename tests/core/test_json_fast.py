"""The hot path's JSON and ids give exactly what the standard library gives."""

from __future__ import annotations

import datetime
import json
import math
import uuid
from typing import Any

import pytest

from effectgate._clock import uuid4_hex
from effectgate._json import detail_json, parse

TEXTS = [
    '{"a":1,"b":[true,false,null],"c":"é\\u2028"}',
    "[]",
    '"plain"',
    "12.5e3",
    '  {"a": 1}  ',
    '{"a":1} x',
    '{"a":1}{"b":2}',
    "\ufeff{}",
    "",
    "{",
    "NaN",
    '{"a":"\\ud800"}',
    '{"k":1,"k":2}',
    b'{"bytes": true}',
    bytearray(b"[1]"),
]


def _loads(value: Any) -> tuple[str, Any]:
    try:
        return "value", json.loads(value)
    except Exception as exc:  # the error json.loads raises, its type and message
        return type(exc).__name__, str(exc)


def _parse(value: Any) -> tuple[str, Any]:
    try:
        return "value", parse(value)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("text", TEXTS)
def test_parse_is_json_loads(text: Any) -> None:
    got, want = _parse(text), _loads(text)
    if want[0] == "value" and isinstance(want[1], float) and math.isnan(want[1]):
        assert got[0] == "value"
        assert math.isnan(got[1])
    else:
        assert got == want


DETAILS: list[Any] = [
    {"b": 1, "a": [1, 2.5, None, True], "é": "\u2028 ü"},
    {"when": datetime.date(2026, 12, 4), "obj": object.__name__},
    {"nested": {"deep": [{"x": float("inf")}, {"y": float("nan")}]}},
    [1, "two", {"3": 4}],
    "just text",
    7,
    {1: "int key", None: "none key", 2.5: "float key"},
    {"set": {1}},  # not JSON: default=str writes its str
]


@pytest.mark.parametrize("detail", DETAILS)
def test_detail_json_is_json_dumps_with_default_str(detail: Any) -> None:
    assert detail_json(detail) == json.dumps(detail, default=str)


def test_detail_json_refuses_a_cycle_as_json_dumps_does() -> None:
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    with pytest.raises(ValueError, match="Circular reference"):
        detail_json(cycle)


def test_uuid4_hex_is_a_version_4_uuid() -> None:
    seen = {uuid4_hex() for _ in range(200)}
    assert len(seen) == 200
    for text in seen:
        parsed = uuid.UUID(hex=text)
        assert parsed.hex == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
