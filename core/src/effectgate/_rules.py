"""Escalation rules and the provider's reconciliation answer: parts of a table row.

An `Escalate` rule raises the approver role for some arguments (`above`, `count_above`, or a
predicate); `possible_roles` evaluates a row's rules in their canonical (recorded) form, as the
audit does for an approval made under an older table.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .canonical import digest
from .context import ToolContext
from .effects import Effect
from .errors import ArgumentError, TableError, storable_text

if typing.TYPE_CHECKING:
    from jsonschema import Draft202012Validator


def _main_module_name(obj: object) -> str:
    """The name a module run as `__main__` has when imported, so a row's fingerprint does not
    depend on how its file was started: `python -m pkg.mod` -> "pkg.mod" (its spec's name);
    `python path/to/mod.py` -> "mod", the file's stem, which is what `--app mod:factory` imports
    when run from that directory (the path is not made into a package name). Kept "__main__"
    when there is no file (`python -c`, a REPL). A function names its own module through its
    globals, so this holds after `runpy.run_path` has restored `sys.modules["__main__"]`; a class
    (an exception type) is named through the running `sys.modules["__main__"]`."""
    namespace = getattr(obj, "__globals__", None)
    if not isinstance(namespace, dict):
        main = sys.modules.get("__main__")
        namespace = vars(main) if main is not None else {}
    spec = namespace.get("__spec__")
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name and name != "__main__":
        return name
    file = namespace.get("__file__")
    if isinstance(file, str) and file:
        return Path(file).stem
    return "__main__"


def _qualname(obj: object) -> str | None:
    if obj is None:
        return None
    module = getattr(obj, "__module__", None) or ""
    if module == "__main__":
        module = _main_module_name(obj)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}"


def _annotated(fn: Any) -> Any:
    """What holds the annotations of `fn`'s parameters: a partial's function, a callable
    object's `__call__` (an object reads its class's variable annotations as its own)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn) or isinstance(fn, type) or "__annotations__" in getattr(fn, "__dict__", {}):
        return fn
    return type(fn).__call__ if callable(fn) else fn


def _context_params(fn: Callable[..., Any]) -> tuple[set[str], dict[str, Any]]:
    """Names of parameters that receive a ToolContext, and the resolved hints."""
    annotated = _annotated(fn)
    try:
        hints = typing.get_type_hints(annotated)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        hints = dict(getattr(annotated, "__annotations__", {}))
    try:  # not one a partial already binds (it would get the argument twice)
        params: Any = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = hints
    names = {name for name, hint in hints.items() if hint is ToolContext and name in params}
    return names, hints


def read_context(name: str, effect: Effect, fn: Callable[..., Any]) -> frozenset[str]:
    """A row's ToolContext parameters. A read gets none (it has no idempotency key): a read row
    whose fn requires one is refused here, not by a TypeError on every call."""
    names, _ = _context_params(fn)
    if names and effect is Effect.READ:
        params = inspect.signature(fn).parameters
        for required in sorted(n for n in names if n in params and params[n].default is params[n].empty):
            raise TableError(
                name, "fn", f"a read gets no ToolContext: give {required!r} a default (None) or drop it"
            )
    return frozenset(names)


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
    return jsonschema.Draft202012Validator(dict(schema), registry=REGISTRY)


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
    `dependentSchemas`) from `start` comes back to a schema on the way: such a schema recurses on
    any instance that reaches it (a reference to itself, two that name each other, an `anyOf`
    that names its own schema). Schemas known to lead nowhere back are kept in `acyclic`."""
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
        dependent = node.get("dependentSchemas")
        if isinstance(dependent, Mapping):
            stack.extend((item, resolver, False) for item in dependent.values())


@dataclass(frozen=True)
class Reconciled:
    """What a tool's `reconcile(key)` learned from the provider.

    `found=True` with a `result`: the effect happened; the record completes with it.
    `found=False`: the provider never saw the key; the call may run again with the same key.
    `None` from `reconcile` itself means the provider cannot tell either; the record stays.
    """

    found: bool
    result: Any = None
    provider_ref: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.provider_ref, str):  # stored as text: a lone surrogate escaped, as an
            object.__setattr__(self, "provider_ref", storable_text(self.provider_ref))  # error's is


def check_fingerprint(name: str, canonical: Mapping[str, Any]) -> None:
    """TableError unless a row's canonical form (`ToolSpec.canonical`) has a JSON form: its
    fingerprint, and the table's, recorded with every call of every tool, are its digest. A row
    without one (a lone surrogate in an upstream's description) is refused when it is built."""
    try:
        digest(canonical)
    except ArgumentError as exc:
        field = exc.pointer.split("/")[1] if exc.pointer.count("/") else "row"
        raise TableError(name, field, f"has no JSON form ({exc}), so the row has no fingerprint") from exc


def exceeds(args: Mapping[str, Any], arg: str, limit: int | float) -> bool:
    """`Escalate.above`'s test: the argument is a number greater than `limit`."""
    value = args.get(arg)
    return isinstance(value, int | float) and not isinstance(value, bool) and value > limit


def count_of(args: Mapping[str, Any], arg: str) -> int:
    """`Escalate.count_above`'s count: 1 for a string, the length of a list, else 0."""
    value = args.get(arg)
    if isinstance(value, str):
        return 1
    return len(value) if isinstance(value, Sequence) else 0


def possible_roles(row: Mapping[str, Any], args: Mapping[str, Any]) -> set[str]:
    """The approver roles a row in its canonical form (as recorded) can require for `args`:
    declarative rules are evaluated; a `when` predicate (code) may or may not have matched."""
    roles: set[str] = set()
    for rule in row.get("escalate", ()):
        if "above" in rule:
            if exceeds(args, rule["arg"], rule["above"]):
                return roles | {rule["role"]}
        elif "count_above" in rule:
            if count_of(args, rule["arg"]) > rule["count_above"]:
                return roles | {rule["role"]}
        else:
            roles.add(rule["role"])
    return roles | {row["approver_role"]}


#: The JSON types each declarative test reads: `exceeds` a number, `count_of` a text or a list.
_READS = {"above": {"number", "integer"}, "count_above": {"string", "array"}}


def check_named_args(
    name: str, schema: Mapping[str, Any], subject: Sequence[str], escalate: Sequence[Escalate]
) -> None:
    """TableError unless each argument a row names (its subject's, its escalation rules') is
    one of the tool's, and each rule's argument is declared as what its test reads: a rule on a
    text `above`, or on a number `count_above`, would never match (a typo neither), and every
    call would keep the lower role."""
    properties = schema.get("properties", {})
    rules = [e.rule for e in escalate if isinstance(e.rule, Mapping) and "arg" in e.rule]
    named = [("subject", arg) for arg in subject] + [("escalate", str(rule["arg"])) for rule in rules]
    for field_name, arg in named:
        if arg not in properties:
            raise TableError(name, field_name, f"{arg!r} is not an argument of the tool")
    for rule in rules:
        declared = properties[str(rule["arg"])]
        kind = declared.get("type") if isinstance(declared, Mapping) else None
        kinds = {kind} if isinstance(kind, str) else set(kind or ())
        for test, reads in _READS.items():
            if test in rule and kind is not None and not reads & kinds:
                raise TableError(
                    name, "escalate", f"{test} never matches {rule['arg']!r}, declared of type {kind!r}"
                )


@dataclass(frozen=True, kw_only=True)
class Escalate:
    """An argument-dependent rule that raises the approver role; the first matching rule wins.

    Build one with `Escalate.above("amount", 100000, role="finance_lead")`,
    `Escalate.count_above("to", 500, role="marketing_lead", note="bulk send")`, or
    `Escalate.when(predicate, role=..., note=...)` for anything else.
    """

    role: str
    note: str
    predicate: Callable[[Mapping[str, Any]], bool]
    rule: Mapping[str, Any]
    describe: Callable[[Mapping[str, Any]], str] | None = None

    @classmethod
    def above(cls, arg: str, limit: int | float, *, role: str, note: str = "") -> Escalate:
        return cls(
            role=role,
            note=note or f"{arg} above {limit}",
            predicate=lambda args: exceeds(args, arg, limit),
            rule={"arg": arg, "above": limit},
            describe=lambda args: f"{arg} = {args.get(arg)} (> {limit})",
        )

    @classmethod
    def count_above(cls, arg: str, limit: int, *, role: str, note: str = "") -> Escalate:
        return cls(
            role=role,
            note=note or f"more than {limit} {arg}",
            predicate=lambda args: count_of(args, arg) > limit,
            rule={"arg": arg, "count_above": limit},
            describe=lambda args: f"{arg}: {count_of(args, arg)} (> {limit})",
        )

    @classmethod
    def when(cls, predicate: Callable[[Mapping[str, Any]], bool], *, role: str, note: str) -> Escalate:
        return cls(role=role, note=note, predicate=predicate, rule={"when": _qualname(predicate)})

    @classmethod
    def from_rule(cls, rule: Mapping[str, Any], bindings: Mapping[str, Callable[..., Any]]) -> Escalate:
        """Build a rule from its TOML form: {arg, above | count_above, role, note} or {when, role}."""
        role = rule.get("role")
        if not isinstance(role, str) or not role.strip():  # as an approver_role: someone to hold it
            raise ValueError(f"escalation rule {dict(rule)} needs a role")
        unknown = sorted(set(rule) - {"arg", "above", "count_above", "when", "role", "note"})
        if unknown:
            raise ValueError(f"escalation rule {dict(rule)}: unknown keys {unknown}")
        if sum(test in rule for test in ("above", "count_above", "when")) > 1:  # one would be ignored
            raise ValueError(f"escalation rule {dict(rule)}: give one of above, count_above or when")
        note = str(rule.get("note", ""))
        if ("above" in rule or "count_above" in rule) and not isinstance(rule.get("arg"), str):
            raise ValueError(f"escalation rule {dict(rule)} needs the argument it tests (arg = ...)")
        if "above" in rule:
            limit = rule["above"]  # compared with every call's argument, and part of the fingerprint
            if not isinstance(limit, int | float) or isinstance(limit, bool) or not math.isfinite(limit):
                raise ValueError(f"escalation rule {dict(rule)}: above must be a finite number")
            return cls.above(str(rule["arg"]), limit, role=role, note=note)
        if "count_above" in rule:
            return cls.count_above(str(rule["arg"]), int(rule["count_above"]), role=role, note=note)
        if "when" in rule:
            name = str(rule["when"])
            if name not in bindings:
                raise ValueError(f"escalation predicate {name!r} is not bound")
            return cls.when(bindings[name], role=role, note=note or name)
        raise ValueError(f"escalation rule {dict(rule)} needs above, count_above or when")
