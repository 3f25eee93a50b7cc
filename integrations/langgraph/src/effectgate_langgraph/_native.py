"""LangChain tools you already have, gated by naming each one's effect.

    from effectgate import money, read
    from effectgate_langgraph import gated_node

    tools = gated_node([get_order, refund_order],
                       {"get_order": read(), "refund_order": money("finance", subject="order_id")})

`tools` goes where a ToolNode would (`gated_middleware(...)` goes in `create_agent`'s
middleware). Each tool (`@tool` function, `BaseTool` subclass, `StructuredTool`, or a plain
function, turned into a tool as ToolNode would) is read once by `native_tool`:

- its name and description;
- its schema: the JSON schema the model is shown (`convert_to_openai_tool(tool)`'s parameters,
  built from `tool.tool_call_schema`, so without injected arguments; an untyped parameter named
  `runtime`, which langchain shows but ToolNode injects by name, is left out too). The gate
  validates, hashes and puts on the reviewer's card exactly what the model was asked for;
- a function that runs it as ToolNode does (`_fidelity.invoke_tool`): inside the gated node or
  middleware, `tool.invoke(tool_call, config)` (an async-only tool: `ainvoke`), so its pydantic
  `args_schema` parses the arguments (enums, dates, nested models), its callbacks fire, and its
  ToolMessage is what the model receives; elsewhere `tool.invoke(args)`.

Injected arguments (`InjectedState`, `InjectedStore`, `ToolRuntime`, `InjectedToolCallId`, any
`InjectedToolArg`) work as under ToolNode: the model is not shown them, a value the model sends
for one is dropped before the gate sees the call (so it is never validated, hashed, approved,
shown to a reviewer or stored), and the framework supplies them when the call runs (`_fidelity`).
They are read at that moment, on a resume from the state of that re-run, and are never part of
what was approved. Such a tool runs only inside the gated node or middleware.

Limits, refused or documented rather than guessed:

- A `Command` (a state update, a goto, a handoff) returned by a read's tool goes to the graph as
  ToolNode returns it: a read is never stored or replayed. A write or gated row whose tool is
  declared to return `Command` is refused (TableError): a stored result must replay identically,
  and a state update or jump is not a result the gate can store. Should such a tool return one
  anyway, the model is told the text of its ToolMessage and the rest of the update is dropped
  (logged as a warning).
- `response_format="content_and_artifact"`: the content is the result; the artifact is not (it
  was never shown to the model). A gated call's artifact with a JSON form is kept beside its
  record, sealed, and given back when a re-run of its step answers it from the store
  (`_artifacts`).
- A result with no JSON form is stored as its text (what langchain would have shown the model).
- `handle_tool_error` turns a `ToolException` into the tool's error ToolMessage, which the model
  receives as under ToolNode; the gate records its text as a success. Leave it off and list
  `ToolException` in the row's `definite_failures=` to have a refusal recorded as a failure of a
  gated call.
- The arguments are checked against the tool's own pydantic model before it runs; a failure there
  (a validator the JSON schema cannot express) raises `InvalidToolArguments`, which the rows
  `gated_node` / `gated_middleware` build list as a definite failure: nothing ran. A validator
  raising an error pydantic does not wrap (a `TypeError`, a timeout, its own) is a definite
  failure of any row too, and `handle_tool_errors` judges that error, as ToolNode does. For a gated
  tool that check comes after the approval, because the gate proposes on the JSON schema.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as create_tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import Command

from effectgate import Effect, EffectGate, ToolSpec
from effectgate._rules import _main_module_name
from effectgate.errors import TableError
from effectgate.rows import DEFAULT_DB, NativeTool, Row, check_rows, gate_for, table_for
from effectgate.stores.base import to_json

from ._arguments import InvalidToolArguments
from ._fidelity import ainvoke_tool, injected_keys, invoke_tool, mark_native
from ._middleware import EffectGateMiddleware
from ._node import GatedToolNode

LangChainTool = BaseTool | Callable[..., Any]


def as_tool(tool: LangChainTool) -> BaseTool:
    """A BaseTool as it is; a plain function made into one, as ToolNode does."""
    if isinstance(tool, BaseTool):
        return tool
    if not callable(tool):
        raise TypeError(f"not a langchain tool or a function: {tool!r}")
    made = create_tool(tool)
    if not isinstance(made, BaseTool):  # `tool(fn)` on a function returns the tool itself
        raise TypeError(f"langchain could not make a tool of {tool!r}")
    return made


def _function(tool: BaseTool) -> Callable[..., Any]:
    """The code behind the tool: its function, or its class's `_run`."""
    found = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    return found if callable(found) else type(tool)._run


def _returns_command(fn: Callable[..., Any]) -> bool:
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotations: nothing declared that can be read
        return False
    return any(h is Command or typing.get_origin(h) is Command for h in (hint, *typing.get_args(hint)))


def _content(value: Any) -> Any:
    """What the gate stores for a tool's return value: JSON-able, as the model is shown it."""
    if isinstance(value, Command):  # a read's goes to the graph (`_fidelity`); the gate keeps the text
        update: Any = value.update
        if isinstance(update, list | tuple):
            update = dict(update) if all(isinstance(u, tuple) for u in update) else {"messages": update}
        raw = update.get("messages", []) if isinstance(update, Mapping) else []
        messages = [m for m in (raw if isinstance(raw, list) else [raw]) if isinstance(m, ToolMessage)]
        value = messages[-1].content if messages else ""
    elif isinstance(value, ToolMessage):
        value = value.content
    try:
        to_json(value)  # as the store will write it
    except (ValueError, TypeError):
        return str(value)
    return value


def native_tool(tool: LangChainTool) -> NativeTool:
    """Name, description, model-facing JSON schema and a runner for one langchain tool.

    What runs is `tool.invoke(...)` (`ainvoke` for an async-only tool), with its injected
    arguments supplied by the gated node or middleware (see the module docstring). A tool
    declared to return `Command` is refused by `gated_node` / `gated_middleware` unless its row
    is a read (this function does not know the row)."""
    tool = as_tool(tool)
    keys = injected_keys(tool)
    code = _function(tool)
    name = tool.name

    if getattr(tool, "func", True) is None and getattr(tool, "coroutine", None) is not None:

        async def run(**args: Any) -> Any:
            return _content(await ainvoke_tool(tool, args, keys))

    else:

        def run(**args: Any) -> Any:  # type: ignore[misc]
            return _content(invoke_tool(tool, args, keys))

    # The row's fingerprint names its function: name the tool's code, not this wrapper. A tool
    # of a script run as `__main__` is named as imported (by its own globals: this wrapper's
    # are this module's), so the script and `--app script:factory` fingerprint it alike.
    module = getattr(code, "__module__", None) or run.__module__
    run.__module__ = _main_module_name(code) if module == "__main__" else module
    run.__qualname__ = getattr(code, "__qualname__", None) or name
    run.__name__ = name
    run.__doc__ = tool.description
    mark_native(run, keys)
    schema = convert_to_openai_tool(tool)["function"].get("parameters") or {
        "type": "object",
        "properties": {},
    }
    return NativeTool(name=name, description=tool.description, schema=_without(schema, keys), fn=run)


def _without(schema: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """The schema without the injected keys langchain still shows the model (a parameter named
    `runtime` without a ToolRuntime annotation, which ToolNode injects by name): they are dropped
    from every call before the gate sees it, so the gate must not require them."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not keys & set(properties):
        return schema
    trimmed = {**schema, "properties": {k: v for k, v in properties.items() if k not in keys}}
    required = [r for r in schema.get("required", ()) if r not in keys]
    if required:
        trimmed["required"] = required
    else:
        trimmed.pop("required", None)
    return trimmed


def _rows(effects: Mapping[str, Row]) -> dict[str, Row]:
    """The rows with `InvalidToolArguments` as a definite failure (nothing ran)."""
    rows: dict[str, Row] = {}
    for name, row in effects.items():
        listed: object = row.options.get("definite_failures", ())
        given = (listed,) if isinstance(listed, type) else tuple(listed)  # type: ignore[arg-type]
        failures = given if InvalidToolArguments in given else (*given, InvalidToolArguments)
        rows[name] = dataclasses.replace(row, options={**row.options, "definite_failures": failures})
    return rows


def _meaning(spec: ToolSpec) -> dict[str, Any]:
    """What a row given with `gate=` must agree on with the row the tool and effects make: every
    field but the function (a new runner each time), so a check the effects name (`scope=`,
    `confirm=`, `escalate=`, ...) is never silently missing from the given gate's row."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.compare}
    return {**fields, "fn": None, "schema": dict(spec.schema or {})}


def _gate(
    tools: Sequence[BaseTool],
    effects: Mapping[str, Row],
    *,
    agent_id: str,
    db: str,
    gate: EffectGate | None,
) -> EffectGate:
    check_rows(effects)  # before a row's effect or options is read
    for t in tools:
        row = effects.get(t.name)
        if row is not None and row.effect is not Effect.READ and _returns_command(_function(t)):
            raise TableError(
                t.name,
                "tool",
                f"the tool returns a Command and its row is a {row.effect.value}: a stored result "
                "must replay identically, and a Command is a state update or jump the gate cannot "
                "store. Return the result itself (only a read's Command goes to the graph)",
            )
    natives = [native_tool(t) for t in tools]
    rows = _rows(effects)
    if gate is None:
        return gate_for(natives, rows, agent_id=agent_id, db=db)
    for spec in table_for(natives, rows, agent_id=agent_id):
        held = gate.table.get(spec.name)
        if held is None or _meaning(held) != _meaning(spec):
            raise TableError(
                spec.name,
                "effects",
                "the given gate's row for this tool differs from this tool and its effect row "
                "(effect, approver role, subject, schema or an option such as scope=); build the "
                "gate from the same tools and rows, or leave gate= out",
            )
        if not gate.table.allowed(agent_id, spec.name):
            raise TableError(
                spec.name, "allowlist", f"the given gate does not allow agent {agent_id!r} this tool"
            )
    return gate


def gated_node(
    tools: Sequence[LangChainTool],
    effects: Mapping[str, Row],
    *,
    agent_id: str = "agent",
    db: str = DEFAULT_DB,
    gate: EffectGate | None = None,
    **node_options: Any,
) -> GatedToolNode:
    """A GatedToolNode offering exactly `tools`, each gated by its row in `effects`.

    The gate (`node.gate`, to approve through) is built by `effectgate.rows.gate_for` on the store
    at `db` (the embedded SQLite file, set up on first use, its key file beside it): a tool
    without a row, or a row without a tool, is a TableError here. With `gate=`, that gate is used
    and must hold these rows. `node_options` go to `GatedToolNode` (`name`, `handle_tool_errors`,
    `messages_key`, `wrap_tool_call`, `resume_identity`, `native_approver`, ...)."""
    offered = [as_tool(t) for t in tools]
    built = _gate(offered, effects, agent_id=agent_id, db=db, gate=gate)
    return GatedToolNode(built, offered, agent_id=agent_id, **node_options)


def gated_middleware(
    tools: Sequence[LangChainTool],
    effects: Mapping[str, Row],
    *,
    agent_id: str = "agent",
    db: str = DEFAULT_DB,
    gate: EffectGate | None = None,
    **middleware_options: Any,
) -> EffectGateMiddleware:
    """`gated_node` for `create_agent`: an EffectGateMiddleware that registers `tools` with the
    agent (do not also pass them as `create_agent(tools=...)`) and gates each call by its row.
    `middleware_options` go to `EffectGateMiddleware` (`resume_identity`, `native_approver`)."""
    offered = [as_tool(t) for t in tools]
    built = _gate(offered, effects, agent_id=agent_id, db=db, gate=gate)
    return EffectGateMiddleware(built, agent_id=agent_id, tools=offered, **middleware_options)


__all__ = [
    "InvalidToolArguments",
    "as_tool",
    "gated_middleware",
    "gated_node",
    "native_tool",
]
