"""What the per-run fast paths of the adapter keep: the SDK still hands a gated tool the full
`ToolContext`, `is_enabled` still settles native decisions before it answers, and `StepHooks`
still forwards every hook but `on_llm_end` to the agent's own hooks (whichever they are now)."""

from __future__ import annotations

import asyncio
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, AgentHooks, FunctionTool, RunContextWrapper, Tool, function_tool
from agents.items import ToolApprovalItem
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from effectgate import read, send
from effectgate_openai_agents import StepHooks, gate_agent, gate_of

from ._harness import context


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def _tools(agent: Agent[Any]) -> list[FunctionTool]:
    tools = [t for t in agent.tools if isinstance(t, FunctionTool)]
    assert len(tools) == len(agent.tools)
    return tools


@function_tool
def get_order(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}"


@function_tool
def email_customer(order_id: str) -> str:
    """Email the customer."""
    return f"emailed about {order_id}"


def test_a_gated_tool_declares_its_context_as_the_sdk_tool_context(db: str) -> None:
    """The gated `on_invoke_tool` declares a resolved `ToolContext` first parameter, so the SDK
    passes the full ToolContext (not the reduced RunContextWrapper) without evaluating strings."""
    agent = gate_agent(Agent(name="support", tools=[get_order]), effects={"get_order": read()}, db=db)
    with gate_of(agent):
        [tool] = _tools(agent)
        hints = typing.get_type_hints(tool.on_invoke_tool)
        assert typing.get_origin(hints["ctx"]) is ToolContext
        assert not any(isinstance(v, str) for v in tool.on_invoke_tool.__annotations__.values())


def test_is_enabled_answers_at_once_without_decisions_and_settles_with_them(db: str) -> None:
    """With no SDK decisions in the run, a gated tool's `is_enabled` is its own bool at once; once
    the run carries decisions, it is an awaitable that settles them first (still the tool's answer)."""
    agent = gate_agent(
        Agent(name="support", tools=[get_order, email_customer]),
        effects={"get_order": read(), "email_customer": send("support")},
        db=db,
    )
    with gate_of(agent):
        fresh = RunContextWrapper(context("m1"))
        for tool in _tools(agent):
            assert callable(tool.is_enabled)
            assert tool.is_enabled(fresh, agent) is True
        decided = RunContextWrapper(context("m2"))
        decided.approve_tool(_approval_item(agent, "email_customer"))
        enabled = _tools(agent)[1].is_enabled
        assert callable(enabled)
        answer = enabled(decided, agent)
        assert inspect.isawaitable(answer)
        assert asyncio.run(_awaited(answer)) is True


async def _awaited(answer: Any) -> Any:
    return await answer


def _approval_item(agent: Agent[Any], name: str) -> ToolApprovalItem:
    raw = ResponseFunctionToolCall(
        id="fc1", call_id="c1", type="function_call", name=name, arguments='{"order_id": "1"}'
    )
    return ToolApprovalItem(agent=agent, raw_item=raw)


class Own(AgentHooks[Any]):
    def __init__(self, label: str) -> None:
        self.label = label
        self.seen: list[str] = []

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Tool) -> None:
        self.seen.append(f"{self.label}:{tool.name}")


def test_step_hooks_forward_to_the_agents_own_hooks_whichever_they_are_now() -> None:
    """Every hook but `on_llm_end` is the inner hooks' own; replacing or removing the inner hooks
    changes what is forwarded, and without inner hooks the SDK's no-op hooks answer."""
    first, second = Own("first"), Own("second")
    hooks = StepHooks(first)
    assert hooks.on_tool_start == first.on_tool_start
    hooks.inner = second
    assert hooks.inner is second
    assert hooks.on_tool_start == second.on_tool_start
    hooks.inner = None
    assert hooks.inner is None
    assert type(hooks).on_tool_start is AgentHooks.on_tool_start
    assert "on_tool_start" not in vars(hooks)
    assert StepHooks.on_llm_end is not AgentHooks.on_llm_end
