"""Canonical JSON (RFC 8785) and argument hashing: the one place effectgate freezes data.

Every hash that binds an approval to its arguments, and every key that identifies an operation,
is computed here, so two processes that see the same arguments always agree on the hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import rfc8785

from .errors import ArgumentError

# RFC 8785 serialises numbers as IEEE doubles; an integer beyond 2**53 - 1 would be rounded,
# so two different amounts could hash the same. Refuse them instead.
MAX_SAFE_INTEGER = 2**53 - 1


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def check_json(value: Any, pointer: str = "") -> None:
    """Raise ArgumentError at the first value RFC 8785 cannot represent exactly."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise ArgumentError(pointer, "a lone surrogate is not valid Unicode text")
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ArgumentError(pointer, f"integer {value} is outside the exact JSON range ±2**53-1")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArgumentError(pointer, f"{value} is not a JSON number (NaN and Infinity are refused)")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ArgumentError(pointer, f"object key {key!r} is not a string")
            check_json(item, f"{pointer}/{_escape(key)}")
        return
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for index, item in enumerate(value):
            check_json(item, f"{pointer}/{index}")
        return
    raise ArgumentError(pointer, f"{type(value).__name__} is not a JSON value")


def plain_json(value: Any) -> bool:
    """True when RFC 8785 output equals sorted, compact `json.dumps` for this value.

    That holds for trees of dicts, lists, strings, booleans, None and exact integers: both
    escape the same characters the same way (quote, backslash, \\b \\f \\n \\r \\t, other
    controls as lowercase \\u00xx). It fails for floats (ECMAScript number formatting), for keys
    outside the Basic Multilingual Plane (RFC 8785 sorts by UTF-16 code units, Python by code
    points), and for lone surrogates (refused by RFC 8785). Those take the rfc8785 package.
    tests/core/test_canonical.py checks the equality on generated values.
    """
    if value is None or value is True or value is False:
        return True
    kind = type(value)
    if kind is str:
        return bool(value.isascii() or not _SURROGATE.search(value))
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _BMP_SAFE.fullmatch(k)) or not plain_json(v):
                return False
        return True
    if kind is list:
        return all(plain_json(v) for v in value)
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")
_BMP_SAFE = re.compile("[^\ud800-\udfff\U00010000-\U0010ffff]*")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of a JSON value; ArgumentError (with a JSON pointer) if it has none."""
    if plain_json(value):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError):
        check_json(value, "")
        raise  # pragma: no cover - check_json raises for every value rfc8785 refuses


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))


def args_hash(tool: str, args: Mapping[str, Any]) -> str:
    """The frozen hash of one call: sha256 over canonical `{"tool": ..., "args": ...}`."""
    return digest({"tool": tool, "args": args})


def key_of(*parts: Any) -> str:
    """A stable key from ordered parts; canonical JSON of the list, so no delimiter can collide."""
    return digest(list(parts))
