"""Nothing on a gated agent runs outside the gate: MCP servers, handoffs and agents as tools.

`gate_agent` refuses, when it wraps, every way the model could make something run that is not one
of the agent's gated function tools (an MCP server not fronted by effectgate's proxy, a handoff or
an agent-as-tool whose agent is not gated on the same gate, a Handoff whose target cannot be
inspected), and checks the agent again on each model answer. Effects are counted at the tools.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, Handoff, Runner, RunState, function_tool, handoff
from agents.mcp import MCPServer
from mcp.types import CallToolResult, ListPromptsResult, TextContent
from mcp.types import Tool as MCPTool

from effectgate import money, read
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import approve_as, gate_agent, gate_of, pending_approvals, table_tools
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate

from ._harness import context, tool_results


class Bank(MCPServer):
    """An MCP server with one tool, `wire_money`, that moves money when called (counted)."""

    def __init__(self, receiver: EffectRecorder) -> None:
        super().__init__()
        self.receiver = receiver

    @property
    def name(self) -> str:
        return "bank"

    async def connect(self) -> None:
        return None

    async def cleanup(self) -> None:
        return None

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[MCPTool]:
        schema = {"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}}}
        return [MCPTool(name="wire_money", description="Wire money", inputSchema=schema)]

    async def call_tool(self, tool_name: str, arguments: Any, meta: Any = None) -> CallToolResult:
        self.receiver.record("wire", **dict(arguments or {}))
        return CallToolResult(content=[TextContent(type="text", text="wired")])

    async def list_prompts(self) -> ListPromptsResult:
        return ListPromptsResult(prompts=[])

    async def get_prompt(self, name: str, arguments: Any = None) -> Any:
        raise NotImplementedError


def _tools(receiver: EffectRecorder) -> tuple[FunctionTool, FunctionTool]:
    @function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    @function_tool
    def transfer_funds(to: str, amount: int) -> str:
        """Move money to another account."""
        receiver.record("transfer", to=to, amount=amount)
        return "sent"

    return get_order, transfer_funds


def _db(tmp_path: Path, name: str = "eg") -> str:
    return f"sqlite:///{tmp_path / name}.db"


def _payments(receiver: EffectRecorder, script: list[Any]) -> Agent[Any]:
    """An ungated agent whose own tool moves money."""
    _, transfer_funds = _tools(receiver)
    return Agent(name="payments", model=ScriptedModel(Script(script)), tools=[transfer_funds])


def test_an_mcp_server_is_refused_at_wrap_and_one_added_later_never_runs(tmp_path: Path) -> None:
    """An MCP server on the agent is a TypeError at gate_agent naming effectgate's MCP proxy and
    `mcp_proxies`; one appended to the gated agent afterwards ends the run at the model's answer,
    before its `wire_money` runs (0 wires at the server). Named in `mcp_proxies`, the connection
    is accepted (the proxy's gate decides its calls)."""
    receiver = EffectRecorder()
    get_order, _ = _tools(receiver)
    bank = Bank(receiver)

    def agent(*servers: Bank) -> Agent[Any]:
        script = Script([call("wire_money", to="attacker", amount=999999), say("ok")])
        return Agent(name="support", model=ScriptedModel(script), tools=[get_order], mcp_servers=[*servers])

    with pytest.raises(TypeError, match=r"(?s)MCP server 'bank'.*effectgate mcp proxy.*mcp_proxies"):
        gate_agent(agent(bank), effects={"get_order": read()}, db=_db(tmp_path))

    gated = gate_agent(agent(), effects={"get_order": read()}, db=_db(tmp_path, "b"))
    gated.mcp_servers.append(bank)
    with pytest.raises(TypeError, match=r"(?s)changed after gate_agent.*MCP server 'bank'"):
        Runner.run_sync(gated, "hi", context=context("m1"))
    assert receiver.count("wire") == 0
    gate_of(gated).close()

    proxied = gate_agent(
        agent(bank), effects={"get_order": read()}, mcp_proxies=[bank], db=_db(tmp_path, "c")
    )
    assert Runner.run_sync(proxied, "hi", context=context("m1")).final_output == "ok"
    assert receiver.count("wire") == 1  # the application named it as effectgate's proxy
    gate_of(proxied).close()


def test_a_handoff_to_an_ungated_agent_is_refused_at_wrap(tmp_path: Path) -> None:
    """A handoff (an Agent, or `handoff(agent)`) to an agent gate_agent did not make, a Handoff
    whose target cannot be inspected, and an agent gated on another gate are each a TypeError
    saying to gate the target on the same gate; nothing is wrapped."""
    receiver = EffectRecorder()
    get_order, _ = _tools(receiver)
    payments = _payments(receiver, [])
    effects = {"get_order": read()}
    opaque = Handoff(
        tool_name="transfer_to_payments",
        tool_description="Hand off to payments.",
        input_json_schema={},
        on_invoke_handoff=lambda ctx, args: asyncio.sleep(0, payments),
        agent_name="payments",
    )
    elsewhere = gate_agent(payments, effects={"transfer_funds": money("finance")}, db=_db(tmp_path, "x"))
    cases = [
        (payments, "which effectgate has not gated"),
        (handoff(payments), "which effectgate has not gated"),
        (opaque, "cannot be inspected"),
        (elsewhere, "gated by another gate"),
    ]
    for target, why in cases:
        base = Agent(name="support", tools=[get_order], handoffs=[target])
        with pytest.raises(TypeError, match=rf"(?s){why}.*Gate the target on this gate first"):
            gate_agent(base, effects=effects, db=_db(tmp_path))
    gate_of(elsewhere).close()


def test_an_ungated_handoff_added_after_wrapping_never_runs_its_tool(tmp_path: Path) -> None:
    """The review's attack: the model hands off to an agent whose own tool moves money. Appended to
    the gated agent's handoffs after gate_agent, the handoff ends the run at the model's answer,
    before the handoff happens: `transfer_funds` runs 0 times."""
    receiver = EffectRecorder()
    get_order, _ = _tools(receiver)
    payments = _payments(receiver, [call("transfer_funds", to="attacker", amount=5), say("paid")])
    base = Agent(
        name="support", model=ScriptedModel(Script([call("transfer_to_payments")])), tools=[get_order]
    )
    gated = gate_agent(base, effects={"get_order": read()}, db=_db(tmp_path))
    gated.handoffs.append(payments)
    with pytest.raises(TypeError, match="reaches agent 'payments', which effectgate has not gated"):
        Runner.run_sync(gated, "hi", context=context("m1"))
    assert receiver.count("transfer") == 0
    gate_of(gated).close()


def test_an_agent_as_tool_must_be_gated_on_the_same_gate(tmp_path: Path) -> None:
    """`agent.as_tool(...)` of an ungated agent is a TypeError at gate_agent even with a row for the
    tool (its agent's own tools would run outside the table); a function tool appended to the
    gated agent after wrapping ends the run before it runs (0 transfers)."""
    receiver = EffectRecorder()
    get_order, transfer_funds = _tools(receiver)
    helper = _payments(receiver, []).as_tool(tool_name="payments", tool_description="Pays.")
    base = Agent(name="support", tools=[get_order, helper])
    with pytest.raises(
        TypeError, match=r"(?s)tool 'payments' reaches agent 'payments'.*gate_agent\(agent, gate\)"
    ):
        gate_agent(base, effects={"get_order": read(), "payments": read()}, db=_db(tmp_path))

    script = Script([call("transfer_funds", to="attacker", amount=5), say("sent")])
    gated = gate_agent(
        Agent(name="support", model=ScriptedModel(script), tools=[get_order]),
        effects={"get_order": read()},
        db=_db(tmp_path, "b"),
    )
    gated.tools.append(transfer_funds)
    with pytest.raises(TypeError, match="tool 'transfer_funds' does not run through this gate"):
        Runner.run_sync(gated, "hi", context=context("m1"))
    assert receiver.count("transfer") == 0
    gate_of(gated).close()


@pytest.mark.parametrize("as_handoff", [False, True], ids=["agent", "handoff-object"])
def test_a_handoff_to_an_agent_gated_on_the_same_gate_keeps_its_tools_gated(
    shop_gate: ShopGate, as_handoff: bool
) -> None:
    """Triage hands off to billing, both gated on the shop's gate: billing's refund pauses (0
    refunds), is approved through the gate on the restored snapshot, and runs once."""
    gate = shop_gate.gate
    billing_model = ScriptedModel(Script([call("refund_order", **REFUND), say("Refunded.")]))
    billing = gate_agent(
        Agent(name="billing", model=billing_model, tools=table_tools(gate, agent_id="support")),
        gate,
        agent_id="support",
    )
    triage_model = ScriptedModel(Script([call("transfer_to_billing")]))
    target: Any = handoff(billing) if as_handoff else billing
    triage = gate_agent(Agent(name="triage", model=triage_model, handoffs=[target]), gate, agent_id="support")

    result = Runner.run_sync(triage, "Please refund order 1042", context=context("m3"))
    assert [p.tool for p in pending_approvals(result)] == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 0
    state = asyncio.run(RunState.from_string(triage, result.to_state().to_string()))
    [paused] = pending_approvals(state)
    approve_as(gate, state, paused, FINANCE)
    done = Runner.run_sync(triage, state)
    assert done.final_output == "Refunded."
    assert [(o.tool, o.ok) for o in tool_results(done) if o.tool == "refund_order"] == [
        ("refund_order", True)
    ]
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]
    triage_model.assert_complete()
    billing_model.assert_complete()


def test_a_handoff_whose_invoke_returns_an_ungated_agent_is_refused_when_it_runs(shop_gate: ShopGate) -> None:
    """A `handoff(billing)` (billing gated on the same gate, so accepted at wrap) whose
    `on_invoke_handoff` was replaced to return an ungated agent: the handoff is refused when it
    runs, before the SDK switches agents, and the ungated agent's tool runs 0 times."""
    receiver = EffectRecorder()
    payments = _payments(receiver, [call("transfer_funds", to="attacker", amount=5), say("paid")])
    gate = shop_gate.gate
    billing = gate_agent(
        Agent(name="billing", tools=table_tools(gate, agent_id="support")), gate, agent_id="support"
    )
    swapped = handoff(billing)

    async def to_payments(ctx: Any, arguments: str) -> Agent[Any]:
        return payments

    swapped.on_invoke_handoff = to_payments
    triage_model = ScriptedModel(Script([call("transfer_to_billing")]))
    triage = gate_agent(
        Agent(name="triage", model=triage_model, handoffs=[swapped]), gate, agent_id="support"
    )
    with pytest.raises(
        TypeError, match="the handoff reaches agent 'payments', which effectgate has not gated"
    ):
        Runner.run_sync(triage, "Please pay", context=context("m1"))
    assert receiver.count("transfer") == 0
