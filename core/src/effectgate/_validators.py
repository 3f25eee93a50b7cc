"""A row's schema validators: the fast one (fastjsonschema, draft 7) where it enforces all the
schema says, and the full one (jsonschema, 2020-12, with an exact `multipleOf`), both fetching
nothing: every `$ref` is resolved within the schema when the row is built, and one that does not
resolve, or that leads back to itself without descending into the arguments, is a `TableError`."""

from __future__ import annotations

import fractions
import functools
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from typing import Any

import fastjsonschema

from .errors import TableError

if typing.TYPE_CHECKING:
    from jsonschema import Draft202012Validator


class _NoFetch(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema's remote handlers: every scheme refused (no schema makes the gate fetch)."""

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        def refuse(uri: str) -> Any:
            raise fastjsonschema.JsonSchemaDefinitionException(f"remote reference {uri!r} is not fetched")

        return refuse

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _compile(schema: Mapping[str, Any]) -> Callable[[Any], Any] | None:
    try:
        schema = ecma_patterns(schema)  # within the try: a schema may nest too deeply to copy
        # use_default=False: validation only (filled defaults would change the frozen arguments)
        return fastjsonschema.compile(dict(schema), handlers=_NoFetch(), use_default=False)
    except Exception:  # a construct the fast compiler lacks: the full validator alone decides
        return None


#: Keywords of JSON Schema 2019-09 and 2020-12 that the fast validator (fastjsonschema, draft 7)
#: does not know, and so would let through whatever they refuse.
_LATER_KEYWORDS = frozenset(
    {"prefixItems", "dependentRequired", "dependentSchemas", "unevaluatedItems", "unevaluatedProperties"}
    | {"minContains", "maxContains", "$dynamicRef"}
)
_BESIDE_REF = frozenset({"$ref", "title", "description", "default", "examples", "$comment", "$defs"})


def fast_validates(schema: Any) -> bool:
    """Whether the fast validator enforces all a row's schema says (under 2020-12, as jsonschema
    does): no keyword it lacks (`_LATER_KEYWORDS`), no constraint beside a `$ref` (draft 7
    ignores them), no `$schema` naming draft 4 or 6 (it would drop `const`, `if`...). Otherwise
    jsonschema alone validates: the fast one may only ever accept what the full one accepts."""
    version = schema.get("$schema") if isinstance(schema, Mapping) else None
    if isinstance(version, str) and ("draft-04" in version or "draft-06" in version):
        return False
    return _draft7(schema)


def _draft7(node: Any) -> bool:
    if isinstance(node, Mapping):
        if _LATER_KEYWORDS & node.keys() or ("$ref" in node and node.keys() - _BESIDE_REF):
            return False
        return all(_draft7(value) for value in node.values())
    return all(_draft7(value) for value in node) if isinstance(node, list) else True


#: Keywords whose values are data, not subschemas: a "$ref" key in one is a value, not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def full_validator(name: str, schema: Mapping[str, Any]) -> Draft202012Validator:
    """A row's full (2020-12) validator, which fetches nothing. Refused here (TableError): a
    schema that is not one, or with a `$ref` that does not resolve within it (or to a draft's
    metaschema): jsonschema would fetch it on the calls that reach it (a URL, a file:// path,
    whoever wrote the schema) or raise on each of them."""
    import jsonschema
    from jsonschema_specifications import REGISTRY  # type: ignore[import-untyped]  # no retrieval
    from referencing.jsonschema import DRAFT202012, specification_with

    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise TableError(name, "schema", f"not a valid JSON schema: {exc.message}") from exc
    except RecursionError as exc:  # the checker recurses: an upstream's schema may nest without end
        raise TableError(name, "schema", "nests too deeply to be checked") from exc
    dialect = schema.get("$schema")
    spec = specification_with(dialect, default=DRAFT202012) if isinstance(dialect, str) else DRAFT202012
    contents = dict(schema)  # one copy: what references resolve to is identified by identity
    try:
        _resolve_refs(contents, REGISTRY.resolver_with_root(spec.create_resource(contents)), spec)
    except _Endless as exc:
        raise TableError(
            name,
            "schema",
            f"{exc} leads back to where it starts without descending into the arguments: "
            "validating a call could recurse without end",
        ) from exc
    except Exception as exc:  # referencing's Unresolvable and its kin
        raise TableError(
            name, "schema", f"a reference does not resolve within the schema ({exc}); none is fetched"
        ) from exc
    return _full_class()(ecma_patterns(schema, names_only=True), registry=REGISTRY)


@functools.cache
def _full_class() -> type[Draft202012Validator]:
    """jsonschema's 2020-12 validator with an exact `multipleOf`: a number as JSON writes it (the
    float's shortest text), as the fast validator reads it. Its own divides binary floats, and
    refuses most prices in cents (19.99 / 0.01 = 1998.9999999999998)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    inexact = base.VALIDATORS["multipleOf"]

    def multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "number"):
            return
        if not (isinstance(step, float) or isinstance(instance, float)):
            yield from inexact(validator, step, instance, schema)  # integers: exact already
        elif (_exact(instance) / _exact(step)).denominator != 1:
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")

    def pattern(validator: Any, regex: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not _search(regex, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

    def dependencies(validator: Any, needs: Any, instance: Any, schema: Any) -> Iterator[Any]:
        """Draft 7's `dependencies` (2020-12 dropped it: its constraint would pass unchecked)."""
        if not (validator.is_type(instance, "object") and isinstance(needs, Mapping)):
            return
        for name, need in needs.items():
            if name not in instance:
                continue
            if isinstance(need, list):
                for other in (other for other in need if other not in instance):
                    yield jsonschema.ValidationError(f"{other!r} is a dependency of {name!r}")
            elif isinstance(need, Mapping | bool):  # anything else draft 7 would refuse: no rule
                yield from validator.descend(instance, need, schema_path=name)

    extended = jsonschema.validators.extend(
        base, {"multipleOf": multiple_of, "pattern": pattern, "dependencies": dependencies}
    )  # type: ignore[no-untyped-call]
    return typing.cast("type[Draft202012Validator]", extended)


def _exact(number: Any) -> fractions.Fraction:
    """A JSON number's exact value: a float as its shortest text (what the JSON says), not its
    binary approximation."""
    return fractions.Fraction(repr(number) if isinstance(number, float) else number)


def _resolve_refs(schema: Any, resolver: Any, spec: Any) -> None:
    """Look every reference up where it stands (without recursion: a schema may nest deeply)."""
    stack: list[tuple[Any, Any]] = [(schema, resolver)]
    acyclic: set[int] = set()
    while stack:
        node, resolver = stack.pop()
        if isinstance(node, list):
            stack.extend((item, resolver) for item in node)
        elif isinstance(node, Mapping):
            if isinstance(node.get("$id"), str):  # a base of its own for the references inside it
                resolver = resolver.in_subresource(spec.create_resource(dict(node)))
            for key in ("$ref", "$dynamicRef"):
                if isinstance(node.get(key), str):
                    resolver.lookup(node[key])
                    _refuse_cycle(node, resolver, spec, acyclic)
            stack.extend((value, resolver) for key, value in node.items() if key not in _DATA_KEYWORDS)


class _Endless(ValueError):
    """A reference cycle that applies to the same instance (raised with the reference's text)."""


#: Keywords that apply their subschemas to the instance itself (not to a part of it).
_IN_PLACE = ("$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not", "if", "then", "else")


def _refuse_cycle(start: Mapping[str, Any], resolver: Any, spec: Any, acyclic: set[int]) -> None:
    """Raise `_Endless` when following references and in-place keywords (`_IN_PLACE`,
    `dependentSchemas`, `dependencies`) from `start` comes back to a schema on the way: such a
    schema recurses on any instance that reaches it (a reference to itself, two that name each
    other, an `anyOf` that names its own schema). Schemas known to lead nowhere back are kept in `acyclic`."""
    path: set[int] = set()
    stack: list[tuple[Any, Any, bool]] = [(start, resolver, False)]
    while stack:
        node, resolver, leaving = stack.pop()
        if leaving:
            path.discard(id(node))
            acyclic.add(id(node))
            continue
        if not isinstance(node, Mapping) or id(node) in acyclic:
            continue
        if id(node) in path:
            raise _Endless(f"the reference {start.get('$ref') or start.get('$dynamicRef')!r}")
        path.add(id(node))
        stack.append((node, resolver, True))
        if isinstance(node.get("$id"), str) and node is not start:
            resolver = resolver.in_subresource(spec.create_resource(dict(node)))
        for key in _IN_PLACE:
            value = node.get(key)
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                found = resolver.lookup(value)
                stack.append((found.contents, found.resolver, False))
            elif isinstance(value, list):
                stack.extend((item, resolver, False) for item in value)
            elif isinstance(value, Mapping):
                stack.append((value, resolver, False))
        for word in ("dependentSchemas", "dependencies"):  # schemas applied to the instance itself
            dependent = node.get(word)
            if isinstance(dependent, Mapping):
                stack.extend((item, resolver, False) for item in dependent.values())


#: What `\\d`, `\\w` and `\\s` match in a JSON Schema pattern (ECMA-262): ASCII digits and word
#: characters; white space and line terminators (with U+FEFF, without Python's \\x1c-\\x1f and \\x85).
_ECMA = {
    "d": "0-9",
    "w": "A-Za-z0-9_",
    "s": r"\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff",
}
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def ecma_pattern(pattern: str) -> str:
    """A JSON Schema `pattern` (an ECMA-262 regex) as a Python regex that matches the same text:
    `$` is the end of the text (Python's also matches before a final newline: "1042\\n" passed
    `^[0-9]+$`), `.` matches no line terminator, `\\d` and `\\w` are ASCII (Python's take any
    script's digits: 1042 in Arabic-Indic digits passed `^\\d+$`, and `int()` reads it), `\\s`
    is ECMA-262's white space (Python's lacks U+FEFF: "a\\ufeffb" passed `^\\S+$`). Both
    validators match the translated pattern."""
    out: list[str] = []
    i, klass, size = 0, -1, len(pattern)  # klass: where the open character class starts
    while i < size:
        char = pattern[i]
        if char == "\\" and i + 1 < size:
            after = pattern[i + 1]
            if after in _ECMA:
                char = _ECMA[after] if klass >= 0 else f"[{_ECMA[after]}]"
            elif after.lower() in _ECMA and klass < 0:
                char = f"[^{_ECMA[after.lower()]}]"
            else:
                char += after
            i += 1
        elif klass >= 0:
            if char == "]" and i > klass + 1 and pattern[klass + 1 : i] != "^":
                klass = -1  # a "]" first in a class is a member (Python's reading)
        elif char == "[":
            klass = i
        elif char == "$":
            char = "\\Z"
        elif char == ".":  # no line terminator of ECMA-262's (Python's "." only skips "\n")
            char = "[^\\n\\r\\u2028\\u2029]"
        out.append(char)
        i += 1
    with suppress(re.error):  # one Python reads only as given (`[\\w-.]`) is left to jsonschema
        return re.compile("".join(out)).pattern
    return pattern


@functools.lru_cache(maxsize=512)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(ecma_pattern(regex))


def _search(regex: str, text: str) -> bool:
    return _compiled(regex).search(text) is not None


def ecma_patterns(schema: Any, within: str = "", *, names_only: bool = False) -> Any:
    """A copy of `schema` whose `pattern`s and `patternProperties` names are `ecma_pattern`'s
    (what both validators check: a name's `$` let "12\\n" through `^[0-9]+$` beside
    `additionalProperties: false`). `names_only`: the names alone (the full validator translates a
    `pattern` as it matches it). Two names that translate alike keep both schemas (`allOf`)."""
    if isinstance(schema, list):
        return [ecma_patterns(item, names_only=names_only) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    if within in _SCHEMA_MAPS:  # names, each to a schema (patternProperties': regexes too)
        out: dict[Any, Any] = {}
        for name, sub in schema.items():
            sub = ecma_patterns(sub, names_only=names_only)
            if within == "patternProperties" and isinstance(name, str):
                name = ecma_pattern(name)
            out[name] = {"allOf": [out[name], sub]} if name in out else sub
        return out
    return {
        key: ecma_pattern(value)
        if key == "pattern" and isinstance(value, str) and not names_only
        else value
        if key in _DATA_KEYWORDS
        else ecma_patterns(value, key, names_only=names_only)
        for key, value in schema.items()
    }
