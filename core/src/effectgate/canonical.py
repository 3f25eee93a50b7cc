"""Canonical JSON (RFC 8785) and argument hashing: the one place effectgate freezes data.

Every hash that binds an approval to its arguments, and every key that identifies an operation,
is computed here, so two processes that see the same arguments always agree on the hash.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

import rfc8785

from .errors import ArgumentError

# RFC 8785 serialises numbers as IEEE doubles; an integer beyond 2**53 - 1 would be rounded,
# so two different amounts could hash the same. Refuse them instead.
MAX_SAFE_INTEGER = 2**53 - 1
#: Arguments nested deeper than this (objects and arrays) are refused as invalid.
MAX_DEPTH = 32


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


Schema = Mapping[str, Any]


def _resolve(schema: Any, root: Schema) -> Any:
    """Follow a local `$ref` ("#/$defs/Name" or "#/definitions/Name"); anything else as is."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, Mapping) else None
        schema = node
    return schema


def _branches(schema: Any, root: Schema) -> list[Any]:
    schema = _resolve(schema, root)
    if not isinstance(schema, Mapping):
        return []
    out = [schema]
    for word in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(word, ()):
            out.extend(_branches(branch, root))
    return out


def _types(schema: Any, root: Schema) -> set[str]:
    found: set[str] = set()
    for branch in _branches(schema, root):
        kind = branch.get("type")
        found.update([kind] if isinstance(kind, str) else kind if isinstance(kind, list) else [])
    return found


def _child(schema: Any, root: Schema, key: str | int) -> Any:
    """The sub-schema for one object member or array item (None when the schema says nothing)."""
    for branch in _branches(schema, root):
        if isinstance(key, str):
            props = branch.get("properties")
            if isinstance(props, Mapping) and key in props:
                return props[key]
            patterns = branch.get("patternProperties")  # a match excludes additionalProperties
            for pattern, sub in patterns.items() if isinstance(patterns, Mapping) else ():
                with suppress(re.error, TypeError):  # not a pattern Python reads: jsonschema judges it
                    if re.search(pattern, key):
                        return sub
            extra = branch.get("additionalProperties")
            if isinstance(extra, Mapping):
                return extra
        else:
            prefix = branch.get("prefixItems")
            if isinstance(prefix, list) and key < len(prefix):
                return prefix[key]
            items = branch.get("items")
            if isinstance(items, Mapping):
                return items
    return None


def freeze(value: Any, schema: Schema | None = None) -> Any:
    """A plain JSON form of `value`, as it will be hashed, stored and passed to the tool.

    dict (and dict subclasses), list and tuple become dict and list; str, int, float, bool and
    None stay (subclasses such as IntEnum become the plain value). Where `schema` says a value is
    an integer (and not any number), an integral float becomes an int: 12000.0 arrives, and is
    hashed, as 12000. Raises ArgumentError, with a JSON pointer, for every value that has no
    exact JSON form: other Mapping or Sequence types, non-string keys, lone surrogates in text
    or keys, NaN and Infinity, integers beyond ±2**53-1, nesting deeper than MAX_DEPTH.
    A value that is already plain JSON (dicts, lists, text, exact integers, booleans, None: no
    float to coerce, nothing to convert) is returned as it is, after one walk; anything else is
    copied. The gate hashes and serialises the arguments at call time, so a caller or a tool that
    mutates them later changes nothing that was checked, hashed or recorded.
    """
    return freeze_plain(value, schema)[0]


def freeze_plain(value: Any, schema: Schema | None = None) -> tuple[Any, bool]:
    """`freeze(value, schema)`, and whether the value was plain JSON as given (then its canonical
    form is `json.dumps`'s sorted, compact output: see `args_hash(..., plain=True)`)."""
    if _plain(value, 0):
        return value, True
    root: Schema = schema or {}
    return _freeze(value, schema, root, "", 0), False


def _freeze(value: Any, schema: Any, root: Schema, pointer: str, depth: int) -> Any:
    kind = type(value)
    if kind is str:
        if not value.isascii() and _SURROGATE.search(value):
            raise ArgumentError(pointer, "a lone surrogate is not valid Unicode text")
        return value
    if value is None or kind is bool:
        return value
    if kind is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise ArgumentError(pointer, f"integer {value} is outside the exact JSON range ±2**53-1")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ArgumentError(pointer, f"{value} is not a JSON number (NaN and Infinity are refused)")
        if value.is_integer() and schema is not None:
            types = _types(schema, root)
            if "integer" in types and "number" not in types:
                return _freeze(int(value), schema, root, pointer, depth)
        return value
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            raise ArgumentError(pointer, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if type(key) is not str:
                    if not isinstance(key, str):
                        raise ArgumentError(pointer, f"object key {key!r} is not a string")
                    key = str.__str__(key)
                here = f"{pointer}/{_escape(key)}"
                if not key.isascii() and _SURROGATE.search(key):
                    raise ArgumentError(here, "an object key holds a lone surrogate")
                out[key] = _freeze(item, _child(schema, root, key), root, here, depth + 1)
            return out
        return [
            _freeze(item, _child(schema, root, i), root, f"{pointer}/{i}", depth + 1)
            for i, item in enumerate(value)
        ]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return _freeze(str.__str__(value), schema, root, pointer, depth)
    if isinstance(value, int):
        return _freeze(int.__index__(value), schema, root, pointer, depth)
    if isinstance(value, float):
        return _freeze(float.__float__(value), schema, root, pointer, depth)
    if isinstance(value, Mapping | Sequence) and not isinstance(value, bytes | bytearray):
        raise ArgumentError(
            pointer, f"{type(value).__name__} is not a JSON value: pass a dict, a list or a tuple"
        )
    raise ArgumentError(pointer, f"{type(value).__name__} is not a JSON value")


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
            if _SURROGATE.search(key):
                raise ArgumentError(f"{pointer}/{_escape(key)}", "an object key holds a lone surrogate")
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
    return _plain(value, 0)


def _plain(value: Any, depth: int) -> bool:
    kind = type(value)
    if kind is str:
        return bool(value.isascii() or not _SURROGATE.search(value))
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if value is None or kind is bool:
        return True
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _BMP_SAFE.fullmatch(k)):
                return False
            item = type(v)  # the scalar cases of the top of this function, without a call each
            if item is str:
                if not (v.isascii() or not _SURROGATE.search(v)):
                    return False
            elif item is int:
                if not -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
                    return False
            elif not (v is None or item is bool or _plain(v, depth + 1)):
                return False
        return True
    if kind is list:
        return all(_plain(v, depth + 1) for v in value)
    return False


# One encoder, built once: json.dumps with options builds a new encoder on every call, and so does
# JSONEncoder.encode (its C iterator, with a dict for circular checks). The C iterator is built
# here once, without the circular check: every value reaching ENCODE is plain JSON (walked by
# `plain_json`, parsed from JSON, or a seal's list of text and integers), and a cycle would still
# end in RecursionError. The output is JSONEncoder.encode's, byte for byte (tests/core/test_canonical.py).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_MAKE = getattr(json.encoder, "c_make_encoder", None)  # None off CPython
_BASESTRING: Any = getattr(json.encoder, "encode_basestring")  # noqa: B009 (untyped in typeshed)
_C_ITER: Any = (
    _MAKE(None, _ENCODER.default, _BASESTRING, None, ":", ",", True, False, True)
    if _MAKE is not None
    else None
)


def _encode_fast(value: Any) -> str:
    if type(value) is str:
        return str(_BASESTRING(value))
    return "".join(_C_ITER(value, 0))


ENCODE = _ENCODE = _encode_fast if _C_ITER is not None else _ENCODER.encode
_SURROGATE = re.compile("[\ud800-\udfff]")
_BMP_SAFE = re.compile("[^\ud800-\udfff\U00010000-\U0010ffff]*")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of a JSON value; ArgumentError (with a JSON pointer) if it has none."""
    if plain_json(value):
        return _ENCODE(value).encode()
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


def canonical_text(value: Any, *, plain: bool = False) -> str:
    """RFC 8785 text of a JSON value; `plain=True` when `freeze_plain` said it is plain JSON
    (one C-level encode, no second walk). This is what the ledger stores as `args_json`."""
    return _ENCODE(value) if plain else canonical_json(value).decode()


def hash_of_text(tool: str, args_text: str) -> str:
    """The args hash of a call from its arguments' canonical text: sha256 over
    `{"args":<text>,"tool":<tool>}`, which is the canonical form of that object (the keys sort
    "args" before "tool"). The audit recomputes every stored hash this way, without parsing."""
    body = '{"args":' + args_text + _tool_tail(tool)
    return _SHA256(body.encode("utf-8", "surrogatepass")).hexdigest()


_SHA256 = hashlib.sha256


@functools.lru_cache(maxsize=4096)
def _tool_tail(tool: str) -> str:
    return ',"tool":' + canonical_json(tool).decode() + "}"


# -- the fast path of simple schemas: one walk checks, freezes and writes the canonical text

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_SCALARS = ("integer", "number", "string", "boolean", "null")
_MISSING = object()
TextCheck = Callable[[Any], "str | None"]


def plain_checker(schema: Schema) -> TextCheck | None:
    """For a closed object schema whose properties are scalars of one type each (what a
    function of ints, strings and booleans derives), a check returning the canonical text of
    arguments that are plain JSON (`plain_json`) and valid under the schema, or None for any
    others (the full path, `freeze_plain` then the schema validators, decides those). None when
    the schema is not that simple. Only certain validity takes the fast path: an "integer" or
    "number" is an exact int (a float or a bool falls back), keys are exact str, and the schema
    has no keyword but `type`, `properties`, `required`, `additionalProperties: false` and
    annotations, so nothing it refuses can pass."""
    if not set(schema) <= {"type", "properties", "required", "additionalProperties"} | _ANNOTATIONS:
        return None
    props, required = schema.get("properties"), schema.get("required", [])
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        return None
    if not isinstance(props, Mapping) or not isinstance(required, list):
        return None
    if not all(type(name) is str and name.isascii() for name in props):
        return None
    order: list[tuple[str, str, str, bool]] = []
    for name in sorted(props):  # ascii names: code point order is RFC 8785's UTF-16 order
        sub = props[name]
        if not isinstance(sub, Mapping):
            return None
        kind = sub.get("type")
        if kind not in _SCALARS or not set(sub) <= {"type"} | _ANNOTATIONS:
            return None
        order.append((name, _BASESTRING(name) + ":", kind, name in required))
    if not all(type(r) is str and r in props for r in required):
        return None
    return functools.partial(_plain_text, tuple(order))


def _plain_text(order: tuple[tuple[str, str, str, bool], ...], args: Any) -> str | None:
    if type(args) is not dict:
        return None
    parts = []
    get = args.get
    for name, prefix, kind, needed in order:
        value = get(name, _MISSING)
        item = type(value)
        if item is int:
            if (kind != "integer" and kind != "number") or not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                return None
            parts.append(prefix + int.__repr__(value))
        elif item is str:
            if kind != "string" or not (value.isascii() or not _SURROGATE.search(value)):
                return None
            parts.append(prefix + _BASESTRING(value))
        elif value is _MISSING:
            if needed:
                return None
        elif item is bool:
            if kind != "boolean":
                return None
            parts.append(prefix + ("true" if value else "false"))
        elif value is None and kind == "null":
            parts.append(prefix + "null")
        else:
            return None
    if len(parts) != len(args):  # a key that is no property (the schema is closed)
        return None
    for key in args:
        if type(key) is not str:  # a str subclass equal to a name: the full path converts it
            return None
    return "{" + ",".join(parts) + "}"


def args_hash(tool: str, args: Mapping[str, Any], *, plain: bool = False) -> str:
    """The frozen hash of one call: sha256 over canonical `{"tool": ..., "args": ...}`.
    `plain=True` says `args` is known to be plain JSON (`freeze_plain`): one C-level dump, no
    second walk."""
    if plain and type(tool) is str and _plain(tool, 0):
        return sha256_hex(_ENCODE({"args": args, "tool": tool}).encode())
    return digest({"tool": tool, "args": args})


def key_of(*parts: Any) -> str:
    """A stable key from ordered parts; canonical JSON of the list, so no delimiter can collide."""
    return digest(list(parts))
