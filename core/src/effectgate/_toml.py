"""Loading an effect table from TOML owned by the downstream teams (`EffectTable.from_toml`)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._rules import Escalate
from .effects import Reversibility
from .errors import TableError
from .table import EffectTable, ToolSpec


def load_toml(source: str | Path, bindings: Mapping[str, Callable[..., Any]]) -> EffectTable:
    """See `EffectTable.from_toml`."""
    text = source if isinstance(source, str) and "\n" in source else Path(source).read_text()
    data = tomllib.loads(text)
    unknown_top = set(data) - {"tools", "agents"}
    if unknown_top:
        raise TableError("<toml>", "sections", f"unknown sections {sorted(unknown_top)}")
    table = EffectTable()
    for name, row in data.get("tools", {}).items():
        table.register(_spec_from_toml(name, row, bindings))
    for agent, names in data.get("agents", {}).items():
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
        if ref not in bindings:
            raise TableError(name, field_name, f"{ref!r} is not among the bound callables")
        return bindings[ref]

    def exceptions(field_name: str) -> tuple[type[Exception], ...]:
        names = row.get(field_name, [])
        if isinstance(names, str) or not isinstance(names, list):
            raise TableError(name, field_name, "must be a list of names bound to exception types")
        return tuple(bound_name(field_name, n) for n in names)

    def bound_name(field_name: str, ref: Any) -> Any:
        if ref not in bindings:
            raise TableError(name, field_name, f"{ref!r} is not among the bound callables")
        return bindings[ref]

    try:
        escalate = tuple(Escalate.from_rule(rule, bindings) for rule in row.get("escalate", []))
    except ValueError as exc:
        raise TableError(name, "escalate", str(exc)) from exc
    return ToolSpec(
        name=name,
        effect=row["effect"],
        fn=bound("fn", name),
        schema=row.get("schema"),
        approver_role=row.get("approver_role"),
        owner=row.get("owner"),
        reversibility=_reversibility(name, row.get("reversibility", "irreversible")),
        subject=tuple([row["subject"]] if isinstance(row.get("subject"), str) else row.get("subject", ())),
        scope=bound("scope"),
        confirm=bound("confirm"),
        snapshot=bound("snapshot"),
        reconcile=bound("reconcile"),
        escalate=escalate,
        description=row.get("description", ""),
        definite_failures=exceptions("definite_failures"),
        unknown_outcome=exceptions("unknown_outcome"),
        transient=exceptions("transient"),
    )
