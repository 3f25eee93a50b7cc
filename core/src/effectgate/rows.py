"""Effect rows for tools you already have: name the effect, keep the framework's tool.

The full `EffectTable` of `ToolSpec`s stays the source of truth and the advanced path. For a
newcomer with existing framework tools, an adapter builds that table from the tools themselves
(their name, description and input schema) and one `Row` per tool name:

    effects = {"get_order": read(), "refund_order": money("finance", subject="order_id")}

`read()`, `write()`, `send(role)`, `money(role)` and `destructive(role)` make rows; every keyword
of `ToolSpec` but the function, schema and description (the tool's) can be given (`scope=`,
`confirm=`, `escalate=`, `definite_failures=`, ...). A tool with no row is refused when the table
is built: the table is deny-by-default, and a forgotten row must not become a silent read.

`gate_for(tools, effects, agent_id=...)` builds the table (the agent may call exactly the tools it
was given), opens the embedded SQLite store (`sqlite:///effectgate.db`, set up on first use, its
key file beside it) and returns the gate. Each adapter's one-line entry point calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._json import same_json
from .effects import Effect, Policy
from .errors import TableError
from .gate import EffectGate
from .stores import open_store
from .table import EffectTable, ToolSpec
from .tokens import Keyring

DEFAULT_DB = "sqlite:///effectgate.db"


@dataclass(frozen=True)
class Row:
    """An effect row without its function: the tool comes from the framework."""

    effect: Effect
    approver_role: str | None = None
    subject: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict[str, Any])


def _row(effect: Effect, role: str | None, subject: str | Sequence[str], options: Mapping[str, Any]) -> Row:
    for banned in ("fn", "schema", "name", "effect", "approver_role", "subject", "description"):
        if banned in options:
            raise TypeError(f"{banned}= is set by the row helper or the tool itself, not as an option")
    return Row(effect, role, (subject,) if isinstance(subject, str) else tuple(subject), dict(options))


def read(*, subject: str | Sequence[str] = (), **options: Any) -> Row:
    """A read: runs at once, logged (scope checks and retries as options)."""
    return _row(Effect.READ, None, subject, options)


def write(*, subject: str | Sequence[str] = (), **options: Any) -> Row:
    """A write: runs once per (session, tool, user message, arguments), before/after recorded."""
    return _row(Effect.WRITE, None, subject, options)


def send(approver_role: str, *, subject: str | Sequence[str] = (), **options: Any) -> Row:
    """A send: waits for `approver_role`; runs once with a single-use grant."""
    return _row(Effect.SEND, approver_role, subject, options)


def money(approver_role: str, *, subject: str | Sequence[str] = (), **options: Any) -> Row:
    """A money movement: waits for `approver_role`; runs once with a single-use grant."""
    return _row(Effect.MONEY, approver_role, subject, options)


def destructive(approver_role: str, *, subject: str | Sequence[str] = (), **options: Any) -> Row:
    """A destructive call: two distinct approvers holding `approver_role`."""
    return _row(Effect.DESTRUCTIVE, approver_role, subject, options)


@dataclass(frozen=True)
class NativeTool:
    """What an adapter reads off a framework tool: its name, description, input schema (what
    the model is shown) and a function the gate calls with the arguments as keywords."""

    name: str
    description: str
    schema: Mapping[str, Any]
    fn: Callable[..., Any]


def spec_of(tool: NativeTool, row: Row) -> ToolSpec:
    """The table row for one framework tool. Refused (TableError) when the row names a schema
    of its own that differs from the tool's, or the tool's schema takes `self`."""
    options = dict(row.options)
    given = options.pop("row_schema", None)
    if given is not None and not same_json(dict(given), dict(tool.schema)):  # true is not 1
        raise TableError(tool.name, "schema", "the row's schema does not match the tool's own input schema")
    if "self" in (tool.schema.get("properties") or {}):
        raise TableError(
            tool.name,
            "schema",
            "the tool's input schema has a `self` parameter: wrap the tool object (or a bound method), "
            "not the class's unbound function",
        )
    return ToolSpec(
        name=tool.name,
        effect=row.effect,
        fn=tool.fn,
        schema=dict(tool.schema),
        approver_role=row.approver_role,
        subject=row.subject,
        description=tool.description,
        **options,
    )


def check_rows(effects: Mapping[str, Row]) -> None:
    """TableError for an `effects` value that is not a row (a label such as "read", which TOML
    and `Effect.from_label` take): rows are made by the row helpers."""
    for name, row in effects.items():
        if not isinstance(row, Row):
            raise TableError(
                str(name),
                "effects",
                f"{row!r} is not a row: make it with read(), write(), send(role), money(role) or "
                f'destructive(role), e.g. effects={{"{name}": read()}}',
            )


def table_for(tools: Sequence[NativeTool], effects: Mapping[str, Row], *, agent_id: str) -> EffectTable:
    """An effect table of `tools` with their rows; the agent may call exactly these tools."""
    check_rows(effects)
    names = [t.name for t in tools]
    missing = [n for n in names if n not in effects]
    extra = sorted(set(effects) - set(names))
    if missing:  # no example row: a copied `read()` would make a refund run ungated
        typo = f"; the rows {extra} name no tool the agent was given (a typo?)" if extra else ""
        raise TableError(
            missing[0],
            "effects",
            f"no effect row for {', '.join(repr(n) for n in missing)}: name each tool's effect with "
            f"read(), write(), send(role), money(role) or destructive(role){typo} (the table is "
            "deny-by-default)",
        )
    if extra:
        raise TableError(extra[0], "effects", "an effect row names no tool the agent was given")
    table = EffectTable([spec_of(t, effects[t.name]) for t in tools])
    table.allow(agent_id, names)
    return table


def gate_for(
    tools: Sequence[NativeTool],
    effects: Mapping[str, Row],
    *,
    agent_id: str,
    db: str = DEFAULT_DB,
    policy: Policy | None = None,
    keyring: Keyring | None = None,
    **options: Any,
) -> EffectGate:
    """The gate for these tools and rows on the store at `db` (the embedded SQLite default, set up
    on first use; its key file beside it). Other options go to `EffectGate`."""
    table = table_for(tools, effects, agent_id=agent_id)
    store = open_store(db)
    store.setup()
    return EffectGate(table, store, policy=policy, keyring=keyring, **options)


__all__ = [
    "DEFAULT_DB",
    "NativeTool",
    "Row",
    "destructive",
    "gate_for",
    "money",
    "read",
    "send",
    "spec_of",
    "table_for",
    "write",
]
