"""`json.loads` and `json.dumps` of the hot path, without json's Python layers.

The ledger's JSON columns hold compact text (canonical arguments, notes, subjects, results),
parsed several times per approved call. `parse` runs the C scanner of `json.loads` on it directly;
text it does not consume whole (surrounding whitespace, trailing data, a BOM, nothing valid) and
a value that is not a str go to `json.loads` itself, so the value or error is always its own.
`detail_json` writes an event's detail as `json.dumps(detail, default=str)` does, and `dumps` a
JSON value as `json.dumps(value)` does (the same text: `default` is never reached by one).
"""

from __future__ import annotations

import json
import re
import sys
from json.decoder import JSONDecoder
from typing import Any

from .canonical import MAX_DEPTH, canonical_json
from .errors import ArgumentError

_DETAIL = json.JSONEncoder(default=str)
_MAKE: Any = getattr(json.encoder, "c_make_encoder", None)  # None off CPython

#: The scanner of a decoder with json.loads' defaults (C's, when json has its accelerator)
_SCAN: Any = JSONDecoder().scan_once  # type: ignore[attr-defined]


def parse(text: Any) -> Any:
    """`json.loads(text)`."""
    if type(text) is not str:
        return json.loads(text)
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # its error
    if end != len(text):
        return json.loads(text)
    return value


def readable(text: str) -> str:
    """`text` (JSON) when `parse` reads it back, else ValueError: JSON carries an integer of any
    length, but Python reads none past its digit limit back (a record stored with one could never
    be loaded: its call answered "running now", then put to a person as an unknown outcome)."""
    limit = sys.get_int_max_str_digits()
    if limit and len(text) > limit and re.search(f"[0-9]{{{limit + 1}}}", text):
        parse(text)  # digits inside a string are text: only an integer raises
    return text


#: json's C encoder as `_DETAIL.encode` makes it, made once: without the check for cycles (its
#: `markers` dict is per value), so it keeps no state between values and threads can share it
_ENCODE: Any = (
    None
    if _MAKE is None
    else _MAKE(None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)
)


def detail_json(detail: Any) -> str:
    """`json.dumps(detail, default=str)`, without the encoder and layers dumps adds. A value that
    refers to itself recurses until Python stops it; `_DETAIL.encode` then raises its own error
    for it (ValueError: Circular reference detected)."""
    if _ENCODE is None or type(detail) is str:
        return _DETAIL.encode(detail)
    try:
        return "".join(_ENCODE(detail, 0))
    except RecursionError:
        return _DETAIL.encode(detail)


def dumps(value: Any) -> str:
    """`json.dumps(value)` of a JSON value (dicts, lists, strings, numbers, booleans, None): an
    approval's subject and notes."""
    return detail_json(value)


def same_json(a: Any, b: Any) -> bool:
    """The same JSON value, as canonical JSON (RFC 8785) compares it: Python's `==` takes 1 and
    true for one value, so a subject's 1 would match a write's true (whose subject key, canonical
    JSON, differs), and a marker's kept 1 a rewritten true. A value with no JSON form is no match."""
    try:
        return canonical_json(a) == canonical_json(b)
    except (ArgumentError, ValueError, TypeError, RecursionError):
        return False


def copied(value: Any, depth: int = 0) -> Any:
    """A copy of the exact dicts and lists of `value` (to `MAX_DEPTH`, past which `freeze` refuses
    it; anything else `freeze` copies): a call's arguments, taken before they are checked and
    hashed (a caller changing its dict while the call runs changes nothing that runs), and what a
    write with snapshots runs with (a tool changing its arguments changes no snapshot's)."""
    kind = type(value)
    if depth > MAX_DEPTH or (kind is not dict and kind is not list):
        return value
    if kind is dict:  # a scalar without a call each
        return {k: copied(v, depth + 1) if type(v) in (dict, list) else v for k, v in value.items()}
    return [copied(v, depth + 1) if type(v) in (dict, list) else v for v in value]
