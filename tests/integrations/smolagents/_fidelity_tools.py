"""Self-contained tools for the fidelity tests: smolagents can save their code, and each counts its
effect at the receiver (`RECEIVER`, imported inside the tool so the saved code still finds it)."""

from __future__ import annotations

from typing import Any

from smolagents import Tool, tool

from effectgate import money, read, write
from effectgate.rows import Row
from effectgate.testing import EffectRecorder

RECEIVER = EffectRecorder()
EFFECTS: dict[str, Row] = {
    "get_order": read(),
    "tag_ticket": write(),
    "refund_order": money("finance", subject="order_id"),
    "order_summary": read(),
}


@tool
def get_order(order_id: str) -> str:
    """Look up an order.

    Args:
        order_id: the order's id.
    """
    from tests.integrations.smolagents import _fidelity_tools

    _fidelity_tools.RECEIVER.record("order_read", order_id=order_id)
    if order_id == "missing":
        raise KeyError(f"no order {order_id}")
    return f"order {order_id}: delivered"


@tool
def tag_ticket(ticket_id: str, tag: str) -> str:
    """Tag a support ticket.

    Args:
        ticket_id: the ticket.
        tag: the tag to add.
    """
    from tests.integrations.smolagents import _fidelity_tools

    _fidelity_tools.RECEIVER.record("ticket_tag", ticket_id=ticket_id, tag=tag)
    return f"ticket {ticket_id} tagged {tag}"


class RefundTool(Tool):  # type: ignore[misc]
    name = "refund_order"
    description = "Refund part of an order, in pence."
    inputs = {  # noqa: RUF012 - smolagents documents a Tool's inputs as a class attribute
        "order_id": {"type": "string", "description": "the order's id"},
        "amount": {"type": "integer", "description": "how much, in pence"},
    }
    output_type = "string"

    def forward(self, order_id: str, amount: int) -> Any:
        from tests.integrations.smolagents import _fidelity_tools

        _fidelity_tools.RECEIVER.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on order {order_id}"


class OrderSummaryTool(Tool):  # type: ignore[misc]
    name = "order_summary"
    description = "An order's summary, as a typed object."
    inputs = {"order_id": {"type": "string", "description": "the order's id"}}  # noqa: RUF012
    output_type = "object"
    output_schema = {  # noqa: RUF012 - as smolagents documents it
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "total": {"type": "integer"}},
    }

    def forward(self, order_id: str) -> Any:
        from pydantic import BaseModel

        from tests.integrations.smolagents import _fidelity_tools

        class Summary(BaseModel):
            order_id: str
            total: int

        _fidelity_tools.RECEIVER.record("order_read", order_id=order_id)
        return Summary(order_id=order_id, total=12000)


def tools() -> list[Tool]:
    return [get_order, tag_ticket, RefundTool(), OrderSummaryTool()]
