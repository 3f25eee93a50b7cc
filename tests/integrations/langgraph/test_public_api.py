"""The adapter's public surface: `__all__`, the lockstep version, typing marker, direct-call refusal."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

import effectgate
import effectgate_langgraph
from effectgate.errors import EffectGateError, PolicyViolation, TableError
from effectgate.testing import Script, call
from effectgate_langgraph import GatedToolNode, MissingIdentity, table_tools
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import ShopGate

from ._graph import shop_graph

PUBLIC = [
    "ARTIFACT_KEY",
    "ApprovalPayload",
    "ApprovalRequest",
    "DecisionMismatch",
    "EffectGateMiddleware",
    "GatedToolNode",
    "InvalidToolArguments",
    "MissingIdentity",
    "RefusedDecision",
    "TamperedState",
    "__version__",
    "approve",
    "deny",
    "edit",
    "gated_middleware",
    "gated_node",
    "gated_tool_node",
    "native_tool",
    "resume",
    "spec_tool",
    "table_tools",
]


def test_all_is_pinned() -> None:
    """`effectgate_langgraph.__all__` is exactly the curated list."""
    assert effectgate_langgraph.__all__ == PUBLIC
    for name in PUBLIC:
        assert hasattr(effectgate_langgraph, name), name


def test_version_is_in_lockstep_with_the_core() -> None:
    """The adapter and its installed distribution carry the core's version."""
    assert effectgate_langgraph.__version__ == effectgate.__version__
    assert importlib.metadata.version("effectgate-langgraph") == effectgate.__version__


def test_the_package_is_typed() -> None:
    """The distribution ships py.typed."""
    assert (Path(effectgate_langgraph.__file__).parent / "py.typed").is_file()


def test_table_tools_mirror_the_rows_an_agent_may_call(shop_gate: ShopGate) -> None:
    """The queue summariser is offered neither send_email nor refund_order; schemas are the table's."""
    tools = {t.name: t for t in table_tools(shop_gate.gate.table, agent_id="queue_summarizer")}
    assert "refund_order" not in tools
    assert "send_email" not in tools
    assert tools["get_order"].args_schema == dict(shop_gate.gate.table["get_order"].schema or {})


def test_a_table_tool_called_directly_refuses(shop_gate: ShopGate) -> None:
    """Invoking a table tool outside the gate raises and refunds nothing."""
    [refund] = [t for t in table_tools(shop_gate.gate.table) if t.name == "refund_order"]
    with pytest.raises(PolicyViolation):
        refund.invoke({"order_id": "1042", "amount": 12000, "currency": "GBP"})
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_node_cannot_offer_a_tool_without_a_row(shop_gate: ShopGate) -> None:
    """Building a node with a tool the effect table lacks fails at once."""

    def transfer_funds(to: str) -> str:
        """Move money."""
        return to

    with pytest.raises(TableError):
        GatedToolNode(shop_gate.gate, [transfer_funds])


def test_a_run_without_a_user_id_fails_before_any_call(shop_gate: ShopGate) -> None:
    """No user in the context or config: the run fails with MissingIdentity and nothing is recorded."""
    model = ScriptedChatModel(script=Script([call("get_order", order_id="1042")]))
    graph = shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver())
    with pytest.raises(MissingIdentity) as caught:
        graph.invoke({"messages": [HumanMessage("hi", id="m1")]}, {"configurable": {"thread_id": "t"}})
    assert isinstance(caught.value, EffectGateError)
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.store.events() == []
