"""The adapter's public surface: `__all__`, the lockstep version, typing marker, direct-call refusal."""

from __future__ import annotations

import asyncio
import importlib.metadata
from pathlib import Path

import pytest

import effectgate
import effectgate_openai_agents
from effectgate.errors import EffectGateError
from effectgate_openai_agents import table_tools
from tests.conformance.adapters import ShopGate

PUBLIC = [
    "STATE_KEY",
    "DecisionMismatch",
    "EffectGateContext",
    "MissingIdentity",
    "PendingApproval",
    "StepHooks",
    "TamperedState",
    "UnknownTool",
    "__version__",
    "aexecute_deferred",
    "approval_of",
    "approve",
    "approve_as",
    "call_context",
    "deferred_operations",
    "deferred_payload",
    "execute_deferred",
    "gate_agent",
    "gate_of",
    "gate_tools",
    "is_deferred",
    "native_tool",
    "outcome_message",
    "pending_approvals",
    "reject",
    "spec_tool",
    "table_tools",
    "with_outcome",
]


def test_all_is_pinned() -> None:
    """`effectgate_openai_agents.__all__` is exactly the curated list."""
    assert effectgate_openai_agents.__all__ == PUBLIC
    for name in PUBLIC:
        assert hasattr(effectgate_openai_agents, name), name


def test_version_is_in_lockstep_with_the_core() -> None:
    assert effectgate_openai_agents.__version__ == effectgate.__version__
    assert importlib.metadata.version("effectgate-openai-agents") == effectgate.__version__


def test_the_package_is_typed() -> None:
    assert (Path(effectgate_openai_agents.__file__).parent / "py.typed").is_file()


def test_table_tools_mirror_the_rows_an_agent_may_call(shop_gate: ShopGate) -> None:
    """The queue summariser is offered neither send_email nor refund_order; schemas are the table's."""
    tools = {t.name: t for t in table_tools(shop_gate.gate, agent_id="queue_summarizer")}
    assert "refund_order" not in tools
    assert "send_email" not in tools
    assert tools["get_order"].params_json_schema == dict(shop_gate.gate.table["get_order"].schema or {})


def test_a_table_tool_invoked_outside_the_gate_refuses(shop_gate: ShopGate) -> None:
    """An unwrapped table tool raises when invoked and refunds nothing."""
    [refund] = [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "refund_order"]
    with pytest.raises(EffectGateError, match="only through effectgate"):
        asyncio.run(refund.on_invoke_tool(None, '{"order_id": "1042", "amount": 12000, "currency": "GBP"}'))  # type: ignore[arg-type]
    assert shop_gate.shop.receiver.count("refund") == 0
