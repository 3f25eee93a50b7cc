"""FunctionTools for `gate_tools` to wrap: from plain functions, or from effect-table rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, function_tool
from agents.strict_schema import ensure_strict_json_schema
from agents.tool_context import ToolContext

from effectgate import EffectGate, ToolSpec
from effectgate.errors import EffectGateError


def as_function_tool(tool: FunctionTool | Callable[..., Any]) -> FunctionTool:
    if isinstance(tool, FunctionTool):
        return tool
    if callable(tool):
        made = function_tool(tool)
        if isinstance(made, FunctionTool):
            return made
    raise TypeError(
        f"gate_tools wraps FunctionTools and plain functions; got {type(tool).__name__} "
        f"(hosted tools, handoffs and MCP tools are not gated by this adapter)"
    )


def spec_tool(spec: ToolSpec) -> FunctionTool:
    """A FunctionTool for one effect-table row (name, description, the row's schema).

    Called outside the gate it refuses; wrap it with `gate_tools` (or `gate_agent`)."""
    schema = dict(spec.schema or {"type": "object", "properties": {}})
    try:
        strict_schema = ensure_strict_json_schema(json.loads(json.dumps(schema)))
        strict = strict_schema == schema
    except Exception:
        strict = False

    async def through_gate_only(ctx: ToolContext[Any], arguments: str) -> Any:
        raise EffectGateError(f"{spec.name} runs only through effectgate: wrap it with gate_tools")

    return FunctionTool(
        name=spec.name,
        description=spec.description or spec.name,
        params_json_schema=schema,
        on_invoke_tool=through_gate_only,
        strict_json_schema=strict,
    )


def table_tools(gate: EffectGate, *, agent_id: str) -> list[FunctionTool]:
    """Unwrapped FunctionTools for every row `agent_id` may call (wrap them with `gate_tools`)."""
    return [spec_tool(s) for s in gate.table if gate.table.allowed(agent_id, s.name)]


__all__ = ["as_function_tool", "spec_tool", "table_tools"]
