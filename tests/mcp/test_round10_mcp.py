"""Round 10 of the review of the MCP side (`mcp serve`, `mcp proxy`), on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import pydantic

from effectgate import EffectGate, Keyring
from effectgate.effects import Effect
from effectgate.mcp._common import Identity
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec
from effectgate.testing import FakeClock

from ._serving import outcome, run, text
from .test_round7_serve import over_the_wire


class Order(pydantic.BaseModel):
    order_id: str
    total: float
    placed: datetime.date


@dataclass
class Stock:
    sku: str
    count: int


def test_a_read_returning_a_model_or_a_dataclass_is_answered_as_its_json(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read returned a pydantic model (and another a dataclass), as typed tools do. The server
    answered it as the object's Python text (`order_id='1042' total=12.5 ...`, `Stock(...)`), not
    as the JSON the gate stores for such a result and the other adapters give the model, and
    with no structured content. It is answered as that JSON, in its text and structured form."""
    runs: list[str] = []

    def get_order(order_id: str) -> Order:
        runs.append(order_id)
        return Order(order_id=order_id, total=12.5, placed=datetime.date(2026, 1, 2))

    def get_stock(sku: str) -> list[Stock]:
        runs.append(sku)
        return [Stock(sku=sku, count=3)]

    table = EffectTable(
        [
            ToolSpec(name="get_order", effect=Effect.READ, fn=get_order),
            ToolSpec(name="get_stock", effect=Effect.READ, fn=get_stock),
        ]
    )
    table.allow_all("a10")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        identity = Identity(user_id="u1", session_id="s10", agent_id="a10")
        async with over_the_wire(g, identity) as session:
            order = await session.call_tool("get_order", {"order_id": "1042"})
            stock = await session.call_tool("get_stock", {"sku": "X-1"})
            return order, stock

    try:
        order, stock = run(scenario)
    finally:
        g.close()
    assert runs == ["1042", "X-1"]
    assert outcome(order)["status"] == "executed"
    expected = {"order_id": "1042", "total": 12.5, "placed": "2026-01-02"}
    assert json.loads(text(order)) == expected
    assert order.structured_content == expected
    assert json.loads(text(stock)) == [{"sku": "X-1", "count": 3}]


def nested(depth: int, *, key: str | None = None) -> Any:
    """A value nested `depth` levels deep: objects {key: ...} with a key, else lists."""
    value: Any = 1
    for _ in range(depth):
        value = {key: value} if key is not None else [value]
    return value


def test_a_read_whose_result_nests_deeply_is_answered_not_an_internal_error(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read returned a document nested a few hundred levels deep (a parsed JSON or XML tree an
    outsider wrote). The server handed the object to the SDK as structured content, which it
    cannot serialise past its depth limit, or walked it recursively past Python's: the tool ran,
    and the client got a JSON-RPC "Internal error" instead of an answer (the server logged a
    traceback). A write of the same value is stored and answered. Each is answered now: the
    object as its JSON text (nothing structured past the limit), the list with a note saying it
    is nested too deeply to be written out."""
    runs: list[str] = []
    deep_object = nested(300, key="k")
    deep_list = nested(600)

    def tree(doc: str) -> Any:
        runs.append(doc)
        return deep_object if doc == "object" else deep_list

    table = EffectTable([ToolSpec(name="tree", effect=Effect.READ, fn=tree)])
    table.allow_all("a10")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> list[types.CallToolResult]:
        identity = Identity(user_id="u1", session_id="s10", agent_id="a10")
        async with over_the_wire(g, identity) as session:
            return [await session.call_tool("tree", {"doc": doc}) for doc in ("object", "list")]

    try:
        by_object, by_list = run(scenario)
    finally:
        g.close()
    assert runs == ["object", "list"]
    assert by_object.is_error is False
    assert outcome(by_object)["status"] == "executed"
    assert json.loads(text(by_object)) == deep_object
    assert by_list.is_error is False
    assert outcome(by_list)["status"] == "executed"
    assert "nested too deeply" in text(by_list)
