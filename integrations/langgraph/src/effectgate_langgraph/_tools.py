"""LangChain tools built from effect-table rows: what the model is shown, never a way around the gate.

`table_tools(table, agent_id=...)` gives one `StructuredTool` per row the agent may call, with the
row's name, description and JSON schema, for `model.bind_tools(...)` and for the gated node. Called
directly, such a tool refuses: its effect runs only through the gate.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from effectgate import CallContext, EffectGate, EffectTable, ToolSpec
from effectgate.errors import PolicyViolation


def _through_gate_only(name: str) -> Any:
    def refuse(**_: Any) -> Any:
        raise PolicyViolation(f"{name} runs only through the effectgate node or middleware", code="bypass")

    return refuse


def spec_tool(spec: ToolSpec) -> BaseTool:
    """The LangChain tool for one row (its schema is the row's, so both validate the same)."""
    return StructuredTool(
        name=spec.name,
        description=spec.description or spec.name,
        args_schema=dict(spec.schema or {"type": "object"}),
        func=_through_gate_only(spec.name),
        metadata={"effect": str(spec.effect)},
    )


def table_tools(table: EffectTable, *, agent_id: str | None = None) -> list[BaseTool]:
    """Tools for every row of `table` (only those `agent_id` may call, when given)."""
    return [spec_tool(s) for s in table if agent_id is None or table.allowed(agent_id, s.name)]


def may_call(gate: EffectGate, ctx: CallContext, name: str) -> bool:
    """Whether `name` is a row the context's agent may call. A call of one the node or agent does
    not offer is answered as ToolNode answers it; any other unknown call goes to the gate (which
    refuses it and records the refusal)."""
    return name in gate.table and gate.table.allowed(ctx.agent_id, name)
