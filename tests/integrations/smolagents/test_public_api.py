"""The adapter's public surface: `__all__`, the lockstep version, typing marker, direct-call refusal."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

import effectgate
import effectgate_smolagents
from effectgate.errors import EffectGateError
from effectgate_smolagents import table_tools
from tests.conformance.adapters import ShopGate

PUBLIC = [
    "ApprovalRequired",
    "Approve",
    "AwaitingApproval",
    "Decision",
    "DecisionMismatch",
    "Deny",
    "Finished",
    "GatedAgent",
    "GatedTool",
    "MissingIdentity",
    "RunOutcome",
    "TamperedState",
    "UnknownTool",
    "__version__",
    "continuation",
    "gate_agent",
    "native_tool",
    "native_tools",
    "restore_memory",
    "save_memory",
    "spec_tool",
    "table_tools",
]


def test_all_is_pinned() -> None:
    assert effectgate_smolagents.__all__ == PUBLIC
    for name in PUBLIC:
        assert hasattr(effectgate_smolagents, name), name


def test_version_is_in_lockstep_with_the_core() -> None:
    assert effectgate_smolagents.__version__ == effectgate.__version__
    assert importlib.metadata.version("effectgate-smolagents") == effectgate.__version__


def test_the_package_is_typed() -> None:
    assert (Path(effectgate_smolagents.__file__).parent / "py.typed").is_file()


def test_a_table_tool_called_outside_the_gate_refuses(shop_gate: ShopGate) -> None:
    [refund] = [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "refund_order"]
    with pytest.raises(EffectGateError, match="only through effectgate"):
        refund(order_id="1042", amount=12000, currency="GBP")
    assert shop_gate.shop.receiver.count("refund") == 0
