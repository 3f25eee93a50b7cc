"""Checks of a table row's fields as given (`ToolSpec`), before the row decides anything.

A row routes every call of its tool: a name, a role or a rule that is not what it looks like, or
that can never match, would route calls silently elsewhere. Each check raises `TableError`
naming the tool and the field.

- Names and roles are text that reads as what it is: not blank, no leading or trailing space, no
  control, invisible or bidirectional character, no letters of lookalike scripts mixed in one
  word (`_textcheck`), in Unicode's normal form NFKC: a TOML file's reviewer cannot tell
  "refund" from "refund\\u200b", nor an approver "finance" from "fin\\u0430nce".
- The arguments a row names (its subject's, its escalation rules') are the tool's, and declared as
  what each rule's test reads; a rule that an earlier one on the same argument always matches
  first (`above 100` before `above 10000`) is refused: it never matches, and every call it was
  meant for would keep the earlier, lower role.
"""

from __future__ import annotations

import copy
import functools
import inspect
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pydantic_core

from ._rules import Escalate, _context_params
from ._textcheck import reveal, text_warnings
from .effects import Effect, Policy
from .errors import TableError


def check_text(tool: str, field: str, value: object, *, optional: bool = False) -> None:
    """TableError unless `value` is text that reads as what it is (None too, if `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise TableError(str(tool), field, f"must be a non-blank name (text), not {value!r}")
    warnings = text_warnings(value, limit=1)
    if unicodedata.normalize("NFKC", value) != value:  # "cafe\u0301" reads as "café", "ｆ" as "f"
        warnings = ("not in Unicode's normal form NFKC: another text reads the same", *warnings)
    if value != value.strip() or not value.isprintable() or warnings:
        why = warnings[0].split(": ", 1)[-1] if warnings else "space or control characters around or in it"
        raise TableError(
            reveal(tool), field, f"{reveal(value)!r} is not what it looks like ({why}): use plain text"
        )


def subject_of(tool: str, value: object) -> tuple[str, ...]:
    """The subject's argument names: one name, or a list of names."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TableError(tool, "subject", f"must be an argument name or a list of them, not {value!r}")
    return tuple(names)


def escalations(tool: str, value: object) -> tuple[Escalate, ...]:
    """The escalation rules: a list of `Escalate`, each with a role that reads as what it is."""
    rules = value if isinstance(value, Sequence) and not isinstance(value, str) else None
    if rules is None or not all(isinstance(rule, Escalate) for rule in rules):
        raise TableError(tool, "escalate", f"must be a list of Escalate rules, not {value!r}")
    for rule in rules:
        check_text(tool, "escalate", rule.role)
    return tuple(rules)


def check_raises(tool: str, role: str | None, escalate: Sequence[Escalate], policy: Policy) -> None:
    """TableError for an escalation rule whose role the row's own role outranks (the policy's
    `role_grants` let it approve for the rule's role, not the other way): where it matches, more
    people may approve than where it does not, and the rule lowers the bar it was meant to raise."""
    for rule in escalate:
        if role and policy.role_satisfies(role, rule.role) and not policy.role_satisfies(rule.role, role):
            raise TableError(
                tool,
                "escalate",
                f"the rule to {rule.role!r} lowers the bar: {role!r} may approve for {rule.role!r} "
                "(role_grants), so the calls it matches could be approved by more people, not fewer",
            )


def own_copy(tool: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The row's own copy of its schema: a change its caller makes to the dict afterwards changes
    neither what the row validates nor its fingerprint."""
    try:
        return copy.deepcopy(dict(schema))
    except RecursionError as exc:  # an upstream's schema may nest without end
        raise TableError(tool, "schema", "nests too deeply to be checked") from exc


def check_fn(tool: str, effect: Effect, fn: object) -> None:
    """`fn` is callable and, for a write or gated row, no generator function: a generator's body
    runs only when iterated, never by the gate (its call would be recorded as run when nothing
    ran, or, iterated by the result's serialization, as a success when its body raised)."""
    if not callable(fn):
        raise TableError(tool, "fn", "fn must be callable")
    while isinstance(fn, functools.partial):
        fn = fn.func
    if effect is not Effect.READ and (inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)):
        raise TableError(tool, "fn", "a write or gated tool must be a function, not a generator")


def check_snapshot(tool: str, snapshot: object) -> None:
    """TableError unless the row's `snapshot` is a function the gate can call and take the state
    from, synchronously, before and after the tool: an async one would return a coroutine that
    is never awaited, and every call of the row would fail on it (a gated one after its grant)."""
    if snapshot is None:
        return
    if not callable(snapshot):
        raise TableError(tool, "snapshot", f"must be callable (args -> state), not {snapshot!r}")
    if is_async(snapshot):
        raise TableError(tool, "snapshot", "must be a plain function: the gate takes the state synchronously")


def check_confirm(tool: str, confirm: object) -> None:
    """TableError for an async `confirm` check: the gate runs it synchronously, in the decision's
    transaction, so its coroutine would never be awaited and every call of the row refused."""
    if confirm is not None and is_async(confirm):
        raise TableError(tool, "confirm", "must be a plain function: the gate runs the check synchronously")


def is_async(fn: object) -> bool:
    """As async as an `async def`: behind a `functools.partial` or a plain decorator
    (`functools.wraps`) too, or an object with an async `__call__`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    try:
        fns: tuple[Any, ...] = (fn, inspect.unwrap(fn))  # type: ignore[arg-type]
    except ValueError:  # a cycle of `__wrapped__`
        fns = (fn,)
    return any(inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(type(f).__call__) for f in fns)


def check_by_name(tool: str, fn: Callable[..., Any], schema: Mapping[str, Any]) -> None:
    """TableError for a parameter the gate cannot pass: it calls `fn(**arguments)`, so one that is
    positional-only (`def f(x, /)`, as many builtins) and required, or named in the schema, would
    fail every call with a TypeError (a gated call's after its approval, as an unknown outcome);
    so would an argument the schema requires, or a closed one names, that is no parameter (and no
    `**kwargs` takes it; an open schema's other arguments are refused per call: `accepted`),
    and a required parameter no argument of the schema names (where its top level names them all
    and refuses any other)."""
    try:
        params = taken(fn)
    except (TypeError, ValueError):  # no signature to read
        return
    properties = schema.get("properties")
    named = properties if isinstance(properties, Mapping) else {}
    context, _ = _context_params(fn)  # passed by the gate, never by the model
    for param in params:
        if param.kind is param.POSITIONAL_ONLY and (param.default is param.empty or param.name in named):
            raise TableError(
                tool, "fn", f"{param.name!r} is positional-only: the gate passes arguments by name"
            )
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - context
    required = schema.get("required")
    musts = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    if not any(p.kind is p.VAR_KEYWORD for p in params):  # a closed schema's optional ones too
        names = set(named) if schema.get("additionalProperties") is False else set(named) & musts
        for arg in sorted(names - by_name, key=lambda a: (a not in musts, a)):
            fails = "every call" if arg in musts else "a call that gives it"
            raise TableError(tool, "schema", f"{arg!r} is no parameter of fn: {fails} would fail")
    if (
        not isinstance(properties, Mapping)
        or set(schema) & _COMBINED
        or schema.get("additionalProperties") is not False
    ):
        return  # the arguments a call may give are not (only) named at the top level
    for param in params:
        if param.name in by_name and param.default is param.empty and param.name not in named:
            raise TableError(
                tool,
                "schema",
                f"fn requires {param.name!r}, no argument of the schema: every call would fail",
            )


def taken(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """`fn`'s parameters as the gate's `fn(**arguments)` meets them: its own, unless it takes any
    name (a decorator's `**kwargs`, `functools.wraps`), then those of the function it wraps."""
    params = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return list(inspect.signature(fn).parameters.values())
    return params


def accepted(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The argument names `fn(**arguments)` takes (not the gate's context parameters), or None for
    any (a `**kwargs`, or no signature to read): a call giving another is `Invalid` before anything
    is stored, never approved to fail binding after (an unknown outcome of a call that never ran).
    Read as `taken`: a wrapper that takes fewer names than the function it wraps decides."""
    try:
        params = taken(fn)
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return frozenset(by_name - _context_params(fn)[0])


def unaccepted(tool: str, names: frozenset[str] | None, args: Any) -> list[tuple[str, str]]:
    """(pointer, message) for each argument of `args` that is none of `names` (`accepted`)."""
    if names is None or not isinstance(args, Mapping) or args.keys() <= names:
        return []
    return [
        (pointer([k]), f"{k!r} is not an argument of {tool}") for k in sorted(args.keys() - names, key=str)
    ]


def pointer(path: Iterable[Any]) -> str:
    """The JSON pointer (RFC 6901) of a path into the arguments."""
    return "".join(f"/{str(p).replace('~', '~0').replace('/', '~1')}" for p in path)


#: Schema keywords that name arguments beside the top level `properties`.
_COMBINED = {
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "patternProperties",
    "$ref",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
}


def check_defaults(
    tool: str,
    fn: Callable[..., Any],
    schema: Mapping[str, Any],
    subject: Sequence[str],
    rules: Sequence[Escalate],
) -> None:
    """TableError for an argument a row names (its subject's, a declarative rule's) that a call
    may leave out, where the tool runs with a default of its own that is not the schema's: the
    rule (or the subject) reads the schema's (`with_defaults`), and would test another value
    than the one the tool acts on (a refund of 10**9 approved by the lower role)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    properties, required = schema.get("properties", {}), schema.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    named = [(arg, None) for arg in subject] + [(str(r.rule["arg"]), r) for r in rules if "arg" in r.rule]
    for arg, rule in named:
        param = params.get(arg)
        if arg in required or param is None or param.default is param.empty:
            continue
        try:
            runs = pydantic_core.to_jsonable_python(param.default)  # as a derived schema declares it
        except (pydantic_core.PydanticSerializationError, ValueError, TypeError):
            continue  # no JSON value: no schema could declare it
        declared = properties[arg] if isinstance(properties[arg], Mapping) else {}
        tested = {arg: declared["default"]} if "default" in declared else {}
        if rule is not None and rule.predicate({arg: runs}) == rule.predicate(tested):
            continue
        if rule is None and _same(runs) == _same(tested.get(arg)):
            continue
        raise TableError(
            tool,
            "escalate" if rule else "subject",
            f"{arg!r} left out is tested at the schema's default ({tested.get(arg)!r}), but fn runs with "
            f"{param.default!r}: declare that default in the schema, or require {arg!r}",
        )


def _same(value: Any) -> Any:
    """A value as a subject names it (a list as the set of its items)."""
    return sorted(map(repr, value)) if isinstance(value, list) else value


def check_flags(tool: str, **flags: object) -> None:
    """TableError unless each flag is a bool (a text such as "no" would be taken as true)."""
    for field, flag in flags.items():
        if not isinstance(flag, bool):
            raise TableError(tool, field, f"must be True or False, not {flag!r}")


#: The JSON types each declarative test reads: `exceeds` a number, `count_of` a text or a list.
_READS = {"above": {"number", "integer"}, "count_above": {"string", "array"}}


def check_named_args(
    name: str, schema: Mapping[str, Any], subject: Sequence[str], escalate: Sequence[Escalate], fn: Any
) -> None:
    """TableError unless each argument a row names (its subject's, its escalation rules') is
    one of the tool's, and each rule's argument is declared as what its test reads: a rule on a
    text `above`, or on a number `count_above`, would never match (a typo neither), and every
    call would keep the lower role. So would a rule behind one on the same argument and test
    with a limit not above its own."""
    properties = schema.get("properties", {})
    rules = [e.rule for e in escalate if isinstance(e.rule, Mapping) and "arg" in e.rule]
    named = [("subject", arg) for arg in subject] + [("escalate", str(rule["arg"])) for rule in rules]
    for field_name, arg in named:
        if arg not in properties:
            raise TableError(name, field_name, f"{arg!r} is not an argument of the tool")
    lowest: dict[tuple[str, str], Any] = {}  # (arg, test): the lowest limit of the rules so far
    for rule in rules:
        declared = properties[str(rule["arg"])]
        kind = declared.get("type") if isinstance(declared, Mapping) else None
        kinds = {kind} if isinstance(kind, str) else set(kind or ())
        for test, reads in _READS.items():
            if test in rule and kind is not None and not reads & kinds:
                raise TableError(
                    name, "escalate", f"{test} never matches {rule['arg']!r}, declared of type {kind!r}"
                )
            limit, kind_of = rule.get(test, 0), int if test == "count_above" else int | float
            if isinstance(limit, bool) or not isinstance(limit, kind_of):
                raise TableError(name, "escalate", f"{test} must be a number, not {limit!r}")
            key = (str(rule["arg"]), test)
            if test in rule and key in lowest and rule[test] >= lowest[key]:
                raise TableError(
                    name,
                    "escalate",
                    f"the rule {test} {rule[test]} on {rule['arg']!r} never matches: the earlier rule "
                    f"{test} {lowest[key]} matches every call it would (the first match wins; put the "
                    "higher limit first)",
                )
            if test in rule:
                lowest[key] = min(rule[test], lowest.get(key, rule[test]))
    check_defaults(name, fn, schema, subject, escalate)  # and at the value the tool runs with
