"""A smolagents tool as the gate sees it: its own name, description, input schema and call.

`native_tool(tool)` reads a `@tool` function or a `Tool` subclass (class-based, `forward(self,
...)`) as an `effectgate.rows.NativeTool`, so a row names only the effect:

    GatedAgent(ToolCallingAgent(tools=[get_order, RefundTool()], model=model),
               effects={"get_order": read(), "refund_order": money("finance", subject="order_id")})

The schema is built from `tool.inputs`, the same dict smolagents shows the model (so the gate
validates what the model was told, and `self` never appears):

- `string`, `integer`, `number`, `boolean`, `array`, `object`, `null` are JSON types; `any` allows
  any JSON value. A list of types is a union. `items`, `enum`, `additionalProperties`, ... are
  kept as smolagents gives them.
- `nullable: True` (smolagents' mark for an argument with a default) is not required and may be
  null.
- `image` and `audio` are refused (`TableError`): the gate hashes, stores and shows a reviewer
  the arguments as JSON, which a picture or a waveform is not; take a path or URL instead.
- No other argument is accepted (`additionalProperties: false`).

The function calls `tool(**arguments)`, not `tool.forward`: smolagents' `__call__` runs the
tool's `setup()` on first use (once here, under a lock, since a ToolCallingAgent runs a step's
calls in threads) and some tools override `__call__` itself. A `setup()` that raises is a
definite failure (`SetupFailed`: `forward` never ran), shown to the model as its own error.
Inputs and outputs are not sanitized there: the arguments are the JSON the gate validated, the
raw result is what the gate records (its JSON form, what the agent gets; an output with none,
such as an image, is stored as `{"unserializable": TYPE}` and the run that made it gets the
output itself, `own_output`), and the `GatedTool` standing for the tool converts it for the model
as smolagents would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from smolagents import Tool

from effectgate import Executed
from effectgate.errors import TableError
from effectgate.flow import NotStarted
from effectgate.rows import NativeTool

_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_MEDIA_TYPES = frozenset({"image", "audio"})
# keywords whose value is a schema, or a list or mapping of schemas, that may use smolagents types
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")


def native_tool(tool: Tool) -> NativeTool:
    """The gate's view of a smolagents tool: name, description, JSON schema from `tool.inputs`
    and a function that calls the tool (see the module docstring). `TableError` for an input the
    gate cannot hold (image, audio, a type smolagents does not know)."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg, spec in tool.inputs.items():
        schema, nullable = _input_schema(tool.name, arg, spec)
        properties[arg] = schema
        if not nullable:
            required.append(arg)
    schema_: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema_["required"] = required
    return NativeTool(name=tool.name, description=tool.description, schema=schema_, fn=_caller(tool))


def _input_schema(tool: str, arg: str, spec: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """One input's JSON schema, and whether it may be left out (and be null)."""
    if not isinstance(spec, Mapping):
        raise TableError(tool, "inputs", f"input {arg!r} is not a dict with a type and a description")
    schema = _json_schema(tool, arg, spec)
    branches = spec.get("anyOf")
    nullable = spec.get("nullable") is True or (
        isinstance(branches, list)
        and any(isinstance(b, Mapping) and b.get("type") == "null" for b in branches)
    )
    if nullable:
        _allow_null(schema)
    return schema, nullable


def _json_schema(tool: str, arg: str, node: Mapping[str, Any]) -> dict[str, Any]:
    """`node` with smolagents' types made JSON schema, recursively through sub-schemas."""
    out: dict[str, Any] = {}
    if "type" in node:
        kinds = node["type"]
        listed = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed) or not listed:
            raise TableError(tool, "inputs", f"input {arg!r}: type must be a name or a list of names")
        media = sorted(_MEDIA_TYPES.intersection(listed))
        if media:
            raise TableError(
                tool,
                "inputs",
                f"input {arg!r} is of type {media[0]!r}: the gate hashes, stores and shows arguments "
                "as JSON, which it cannot be; take a path or a URL (a string) instead",
            )
        unknown = [k for k in listed if k != "any" and k not in _JSON_TYPES]
        if unknown:
            raise TableError(tool, "inputs", f"input {arg!r}: unknown type {unknown[0]!r}")
        if "any" not in listed:
            out["type"] = listed[0] if len(listed) == 1 else list(dict.fromkeys(listed))
    out.update((k, v) for k, v in node.items() if k not in ("type", "nullable"))
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), Mapping):
            out[key] = _json_schema(tool, arg, node[key])
    for key in _SUBSCHEMAS:
        if isinstance(node.get(key), list):
            out[key] = [_json_schema(tool, arg, s) if isinstance(s, Mapping) else s for s in node[key]]
    if isinstance(node.get("properties"), Mapping):
        out["properties"] = {
            k: _json_schema(tool, arg, s) if isinstance(s, Mapping) else s
            for k, s in node["properties"].items()
        }
    return out


def _allow_null(schema: dict[str, Any]) -> None:
    """Let a schema accept null as well (an input smolagents marks nullable)."""
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "null":
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        schema["type"] = [*kind, "null"]
    enum = schema.get("enum")
    if isinstance(enum, list) and None not in enum:
        schema["enum"] = [*enum, None]


def _caller(tool: Tool) -> Callable[..., Any]:
    """`tool(**arguments)`, with its `setup()` run once before the first call."""
    lock = threading.Lock()

    def call(**arguments: Any) -> Any:
        if not getattr(tool, "is_initialized", False):
            with lock:
                if not getattr(tool, "is_initialized", False):
                    try:
                        tool.setup()
                    except Exception as exc:  # `forward` never ran: nothing happened
                        raise SetupFailed(f"{type(exc).__name__}: {exc}") from exc
        output = tool(**arguments)
        kept = _OWN.get()
        if kept is not None:
            kept.append(output)
        return output

    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = tool.description
    return call


class SetupFailed(NotStarted):
    """The tool's `setup()` raised: its `forward` never ran, so the gate records a definite
    failure (`NotStarted`), never an unknown outcome; the model is shown the setup's own error."""


def own_error(exc: Exception) -> Exception:
    """The error smolagents would show for `exc`: a failed setup's own."""
    cause = exc.__cause__
    return cause if isinstance(exc, SetupFailed) and isinstance(cause, Exception) else exc


#: The own outputs of the native tools that ran in the current `GatedAgent._call` (`own_output`)
_OWN: ContextVar[list[Any] | None] = ContextVar("effectgate_smolagents_own", default=None)


@contextmanager
def keeping_output() -> Iterator[list[Any]]:
    """Keep the output of a native tool that runs inside (the gate runs it in this context)."""
    kept: list[Any] = []
    token = _OWN.set(kept)
    try:
        yield kept
    finally:
        _OWN.reset(token)


def own_output(outcome: Executed, kept: list[Any]) -> Any:
    """What the agent gets of a call that ran: the result as stored (its JSON form, what a replay
    gets), unless the tool ran just now and its output has none (an image, `output_type="image"`):
    that run gets the output itself, as smolagents gives a plain tool's (the record keeps
    `{"unserializable": TYPE}`)."""
    ran_now = not outcome.replay and len(kept) == 1
    if ran_now and outcome.result == {"unserializable": type(kept[0]).__name__}:
        return kept[0]
    return outcome.result
