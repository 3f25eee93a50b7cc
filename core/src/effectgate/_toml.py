"""Loading an effect table from TOML owned by the downstream teams (`EffectTable.from_toml`)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._owned import own
from ._rowcheck import check_text
from ._rules import Escalate
from .effects import Reversibility
from .errors import TableError
from .table import EffectTable, ToolSpec


def load_toml(source: str | Path, bindings: Mapping[str, Callable[..., Any]]) -> EffectTable:
    """See `EffectTable.from_toml`."""
    if not (isinstance(source, str) and "\n" in source):
        own(source)  # the policy that governs the gate is never the file tools' to rewrite
    inline = isinstance(source, str) and "\n" in source
    where = "the TOML text" if inline else str(source)
    try:  # TOML is UTF-8, whatever the locale's encoding
        data = tomllib.loads(str(source) if inline else Path(source).read_bytes().decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TableError("<toml>", "toml", f"{where} is not TOML: {exc}") from exc
    except RecursionError as exc:  # tomllib recurses into each nested array and inline table
        raise TableError("<toml>", "toml", f"{where} nests too deeply to be read") from exc
    unknown_top = set(data) - {"tools", "agents"}
    if unknown_top:
        raise TableError("<toml>", "sections", f"unknown sections {sorted(unknown_top)}")
    tools, agents = data.get("tools", {}), data.get("agents", {})
    for section, value in (("tools", tools), ("agents", agents)):
        if not isinstance(value, dict):
            raise TableError("<toml>", section, f"[{section}] must be a table")
    table = EffectTable()
    for name, row in tools.items():
        if not isinstance(row, dict):
            raise TableError(name, "row", f"[tools.{name}] must be a table of fields")
        table.register(_spec_from_toml(name, row, bindings))
    for agent, names in agents.items():
        check_text("<toml>", "agents", agent)  # an id that is not what it reads as allows no one it names
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TableError("<toml>", "agents", f"agent {agent!r}: its allowlist must list tool names")
        table.allow(agent, names)
    return table


_TOML_FIELDS = {
    "effect",
    "fn",
    "approver_role",
    "owner",
    "reversibility",
    "subject",
    "schema",
    "scope",
    "confirm",
    "snapshot",
    "reconcile",
    "escalate",
    "description",
    "definite_failures",
    "unknown_outcome",
    "transient",
}


def _reversibility(name: str, value: Any) -> Reversibility:
    try:
        return Reversibility(value)
    except ValueError:
        known = ", ".join(r.value for r in Reversibility)
        raise TableError(name, "reversibility", f"{value!r} is not one of {known}") from None


def _text(name: str, row: Mapping[str, Any], field_name: str) -> Any:
    """A text field's value (None when absent); an approver role must also name someone."""
    value = row.get(field_name)
    if value is not None and not isinstance(value, str):
        raise TableError(name, field_name, f"must be text, not {value!r}")
    if field_name == "approver_role" and value is not None and not value.strip():
        raise TableError(name, field_name, "an approver role must be a non-blank name")
    return value


def _subject(name: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TableError(name, "subject", "must be an argument name or a list of argument names")
    return tuple(names)


def _escalation(name: str, rule: Any, bindings: Mapping[str, Callable[..., Any]]) -> Escalate:
    """One rule; its limit and argument checked here (a wrong one would never escalate)."""
    if not isinstance(rule, dict):
        raise TableError(name, "escalate", f"each rule must be a table, not {rule!r}")
    limit = rule.get("count_above", 0)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TableError(name, "escalate", f"rule {rule}: count_above must be a whole number")
    try:
        return Escalate.from_rule(rule, bindings)
    except ValueError as exc:
        raise TableError(name, "escalate", str(exc)) from exc


def _spec_from_toml(
    name: str, row: Mapping[str, Any], bindings: Mapping[str, Callable[..., Any]]
) -> ToolSpec:
    unknown = set(row) - _TOML_FIELDS
    if unknown:
        raise TableError(name, sorted(unknown)[0], "unknown field in the TOML row")
    if "effect" not in row:
        raise TableError(name, "effect", "every row needs an effect")

    def bound(field_name: str, default: str | None = None) -> Any:
        ref = row.get(field_name, default)
        if ref is None:
            return None
        return bound_name(field_name, ref)

    def exceptions(field_name: str) -> tuple[type[Exception], ...]:
        names = row.get(field_name, [])
        if isinstance(names, str) or not isinstance(names, list):
            raise TableError(name, field_name, "must be a list of names bound to exception types")
        return tuple(bound_name(field_name, n) for n in names)

    def bound_name(field_name: str, ref: Any) -> Any:
        if not isinstance(ref, str) or ref not in bindings:
            raise TableError(name, field_name, f"{ref!r} is not among the bound callables")
        return bindings[ref]

    rules = row.get("escalate", [])
    if not isinstance(rules, list):
        raise TableError(name, "escalate", "must be a list of rules")
    escalate = tuple(_escalation(name, rule, bindings) for rule in rules)
    return ToolSpec(  # an escalation on an argument the tool lacks is refused there, as a subject's
        name=name,
        effect=row["effect"],
        fn=bound("fn", name),
        schema=row.get("schema"),
        approver_role=_text(name, row, "approver_role"),
        owner=_text(name, row, "owner"),
        reversibility=_reversibility(name, row.get("reversibility", "irreversible")),
        subject=_subject(name, row.get("subject", [])),
        scope=bound("scope"),
        confirm=bound("confirm"),
        snapshot=bound("snapshot"),
        reconcile=bound("reconcile"),
        escalate=escalate,
        description=_text(name, row, "description") or "",
        definite_failures=exceptions("definite_failures"),
        unknown_outcome=exceptions("unknown_outcome"),
        transient=exceptions("transient"),
    )
