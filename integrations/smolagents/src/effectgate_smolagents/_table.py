"""Tools for the rows of an effect table: what a `GatedAgent` wraps when the table is the source.

support = GatedAgent(ToolCallingAgent(tools=table_tools(gate, agent_id="support"), model=model),
                     gate, agent_id="support")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smolagents import Tool

from effectgate import EffectGate, ToolSpec


def spec_tool(spec: ToolSpec) -> Tool:
    """A smolagents Tool for one effect-table row (inputs from the row's JSON schema).

    Called outside the gate it refuses; give it to a `GatedAgent`. Its code is self-contained, so a
    gated agent of such tools saves (`agent.save`, `to_dict`) as one of your own tools does."""
    schema = spec.schema or {}
    properties: Mapping[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    inputs: dict[str, dict[str, Any]] = {}
    for name, prop in properties.items():
        kind = prop.get("type", "any") if isinstance(prop, Mapping) else "any"
        entry: dict[str, Any] = {
            "type": kind if isinstance(kind, str) else "any",
            "description": (prop.get("description") if isinstance(prop, Mapping) else None) or name,
        }
        if name not in required:
            entry["nullable"] = True
        inputs[name] = entry

    class RowTool(Tool):
        skip_forward_signature_validation = True

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            # imported here and named through `self`: `agent.save` writes this method alone
            from effectgate.errors import EffectGateError

            raise EffectGateError(f"{self.name} runs only through effectgate: give it to a GatedAgent")

    RowTool.name = spec.name
    RowTool.description = spec.description or spec.name
    RowTool.inputs = inputs
    RowTool.output_type = "any"
    return RowTool()


def table_tools(gate: EffectGate, *, agent_id: str) -> list[Tool]:
    """Unwrapped Tools for every row `agent_id` may call (a `GatedAgent` wraps them)."""
    return [spec_tool(s) for s in gate.table if gate.table.allowed(agent_id, s.name)]
