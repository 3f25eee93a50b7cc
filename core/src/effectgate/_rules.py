"""Escalation rules and the provider's reconciliation answer: parts of a table row.

An `Escalate` rule raises the approver role for some arguments (`above`, `count_above`, or a
predicate); `possible_roles` evaluates a row's rules in their canonical (recorded) form, as the
audit does for an approval made under an older table.
"""

from __future__ import annotations

import decimal
import functools
import inspect
import math
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .canonical import canonical_json, digest
from .context import ToolContext
from .effects import Effect
from .errors import ArgumentError, TableError, storable_text


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
    if isinstance(obj, functools.partial):  # "functools.partial" would name every one alike
        bound = [*map(_bound, obj.args), *(f"{k}={_bound(v)}" for k, v in sorted(obj.keywords.items()))]
        return f"{_qualname(obj.func)}({', '.join(bound)})"
    module = getattr(obj, "__module__", None) or ""
    if module == "__main__":
        module = _main_module_name(obj)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}"


def _bound(value: object) -> str:
    """A partial's argument as a fingerprint names it: its canonical JSON, else its (type's) name."""
    if callable(value):
        return _qualname(value) or ""
    try:
        return canonical_json(value).decode()
    except (ArgumentError, TypeError, ValueError):
        return _qualname(type(value)) or ""


def _annotated(fn: Any) -> Any:
    """What holds the annotations of `fn`'s parameters: a partial's function, a callable
    object's `__call__` (an object reads its class's variable annotations as its own)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn) or isinstance(fn, type) or "__annotations__" in getattr(fn, "__dict__", {}):
        return fn
    return type(fn).__call__ if callable(fn) else fn


def _context_params(fn: Callable[..., Any]) -> tuple[set[str], dict[str, Any]]:
    """Names of parameters that receive a ToolContext, and the resolved hints (with what
    `Annotated` adds: a schema derived from them keeps `Field(gt=0, le=1000)`)."""
    annotated = _annotated(fn)
    try:
        hints = typing.get_type_hints(annotated, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        hints = dict(getattr(annotated, "__annotations__", {}))
    bare = {
        n: typing.get_args(h)[0] if typing.get_origin(h) is typing.Annotated else h for n, h in hints.items()
    }
    try:  # not one a partial already binds (it would get the argument twice)
        params: Any = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = hints
    names = {name for name, hint in bare.items() if hint is ToolContext and name in params}
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
    """`Escalate.above`'s test: the argument is a number greater than `limit`; a text (pydantic's
    Decimal takes one) as the number it reads as, or above it if it reads as no finite number;
    a float limit as its shortest text (999.99, not its binary value 999.99000000000000909...).
    Given as anything else (an object, a list, a bool: a schema that leaves its type open admits
    it), it reads as no number too: what the tool makes of it, the lower role never approves."""
    value = args.get(arg)
    if value is not None and (isinstance(value, bool) or not isinstance(value, str | int | float)):
        return True
    if isinstance(value, str):
        try:
            number = decimal.Decimal(value)
        except decimal.InvalidOperation:
            return True
        bound = decimal.Decimal(repr(limit) if isinstance(limit, float) else limit)  # as written
        return not number.is_finite() or number > bound
    return isinstance(value, int | float) and not isinstance(value, bool) and value > limit


def _shown(value: Any) -> str:
    """An `above` rule's value on a card: a number or text as given, else its kind (no number)."""
    plain = isinstance(value, str | int | float) and not isinstance(value, bool)
    return str(value) if plain else f"a {type(value).__name__}, no number"


def count_of(args: Mapping[str, Any], arg: str) -> int:
    """`Escalate.count_above`'s count: 1 for a string, the length of a list (or of an object,
    which a schema that leaves its type open admits: its keys may be the recipients), else 0."""
    value = args.get(arg)
    if isinstance(value, str):
        return 1
    return len(value) if isinstance(value, Sequence | Mapping) else 0


def with_defaults(schema: Any, args: Mapping[str, Any]) -> Mapping[str, Any]:
    """`args` with the schema's `default` of each argument they leave out: what the tool runs
    with, and so what a declarative rule tests (a model that leaves out `max_recipients`, whose
    default is over the rule's limit, does not keep the lower role)."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return args
    left_out = {
        name: declared["default"]
        for name, declared in properties.items()
        if name not in args and isinstance(declared, Mapping) and "default" in declared
    }
    return {**left_out, **args} if left_out else args


def possible_roles(row: Mapping[str, Any], args: Mapping[str, Any]) -> set[str]:
    """The approver roles a row in its canonical form (as recorded) can require for `args`:
    declarative rules are evaluated; a `when` predicate (code) may or may not have matched."""
    roles: set[str] = set()
    args = with_defaults(row.get("schema"), args)
    for rule in row.get("escalate", ()):  # a rule the gate never writes (a limit in text) is refused
        if type(rule["role"]) is not str or type(rule.get("above", 0)) not in (int, float):
            raise TypeError(f"not an escalation rule of a table row: {rule!r}")
        if "above" in rule:
            if exceeds(args, rule["arg"], rule["above"]):
                return roles | {rule["role"]}
        elif "count_above" in rule:
            if count_of(args, rule["arg"]) > rule["count_above"]:
                return roles | {rule["role"]}
        else:
            roles.add(rule["role"])
    return roles | {row["approver_role"]}


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
            describe=lambda args: f"{arg} = {_shown(args.get(arg))} (> {limit})",
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
