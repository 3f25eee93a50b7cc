"""Effect rows for tools you already have: the table is built from the tool and one row per name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from effectgate import Approver, Effect, Executed, Grant, Pending, ToolSpec, money, read
from effectgate.errors import TableError
from effectgate.examples.shop import context
from effectgate.rows import NativeTool, gate_for, table_for
from effectgate.testing import EffectRecorder

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["order_id", "amount"],
    "additionalProperties": False,
}


def native(name: str, fn: Any, schema: dict[str, Any] = SCHEMA) -> NativeTool:
    return NativeTool(name=name, description=f"the {name} tool", schema=schema, fn=fn)


def test_a_gate_from_native_tools_pauses_the_money_tool_and_runs_it_once(tmp_path: Path) -> None:
    """Two native tools and their rows make a working gate on the embedded store: the read runs,
    the refund pauses, and once approved it runs once."""
    receiver = EffectRecorder()

    def refund(order_id: str, amount: int) -> dict[str, Any]:
        receiver.record("refund", order_id=order_id, amount=amount)
        return {"refunded": amount}

    tools = [
        native(
            "get_order",
            lambda order_id: {"order_id": order_id},
            {"type": "object", "properties": {"order_id": {"type": "string"}}},
        ),
        native("refund_order", refund),
    ]
    effects = {"get_order": read(), "refund_order": money("finance", subject="order_id")}
    gate = gate_for(tools, effects, agent_id="support", db=f"sqlite:///{tmp_path}/effectgate.db")
    try:
        ctx = context("m1")
        assert isinstance(gate.call("get_order", {"order_id": "1042"}, ctx), Executed)
        pending = gate.call("refund_order", {"order_id": "1042", "amount": 5}, ctx)
        assert isinstance(pending, Pending)
        assert (pending.card.approver_role, pending.card.subject) == ("finance", {"order_id": "1042"})
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        assert receiver.count("refund") == 1
        assert Path(f"{tmp_path}/effectgate.db.keys").exists()
    finally:
        gate.close()


def test_a_tool_without_a_row_is_refused_when_the_table_is_built() -> None:
    """The table is deny-by-default: a tool given without an effect row is an error, never a read."""
    with pytest.raises(TableError, match="no effect row for 'refund_order'"):
        table_for([native("refund_order", lambda **kw: None)], {}, agent_id="support")


def test_a_row_for_no_tool_is_refused() -> None:
    """A row naming a tool the agent was not given is an error (a typo would leave a tool unrowed)."""
    with pytest.raises(TableError, match="names no tool"):
        table_for([native("a", lambda **kw: None)], {"a": read(), "b": read()}, agent_id="x")


def test_a_schema_with_self_is_refused() -> None:
    """A tool whose schema takes `self` (a class's unbound method) is refused when the row is built,
    and so is a ToolSpec of an unbound method."""
    schema = {"type": "object", "properties": {"self": {}, "x": {"type": "integer"}}}
    with pytest.raises(TableError, match="self"):
        table_for([native("t", lambda **kw: None, schema)], {"t": read()}, agent_id="x")

    class Tool:
        def forward(self, x: int) -> int:
            return x

    with pytest.raises(TableError, match="self"):
        ToolSpec(name="t", effect=Effect.READ, fn=Tool.forward)
    assert ToolSpec(name="t", effect=Effect.READ, fn=Tool().forward).schema is not None


def test_a_row_schema_that_does_not_match_the_tool_is_refused() -> None:
    """A row that brings a schema of its own must describe the tool as the tool does."""
    other = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    with pytest.raises(TableError, match="does not match"):
        table_for(
            [native("refund_order", lambda **kw: None)],
            {"refund_order": money("finance", row_schema=other)},
            agent_id="x",
        )
