"""Managed agents: smolagents lets a manager call another agent as if it were a tool, and that agent
runs its own tools. A manager is wrapped only when every managed agent, at every depth, is wrapped
on the manager's gate; then each of their tools runs through the gate with the manager's identity,
and a gated call in one stops the manager's run until it is decided."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.agents import MultiStepAgent
from smolagents.monitoring import LogLevel

from effectgate import Executed, Keyring, money, read
from effectgate.rows import gate_for
from effectgate.testing import Script, call, say
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Finished,
    GatedAgent,
    GatedTool,
    MissingIdentity,
    UnknownTool,
    native_tools,
    table_tools,
)
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, Paused, ShopGate, grant

IDENTITY = {"session_id": "s-ada", "origin_message_id": "m1", "user_id": "u1"}
KINDS = {"tool_calling": ToolCallingAgent, "code": CodeAgent}


def transfer_tool(ran: list[tuple[str, int]]) -> Tool:
    """A money tool the effect table has no row for; `ran` counts the transfers it made."""

    @tool
    def transfer_funds(to: str, amount: int) -> str:
        """Move money to another account (no row in the effect table).

        Args:
            to: the account to pay.
            amount: how much, in minor units.
        """
        ran.append((to, amount))
        return f"sent {amount} to {to}"

    return transfer_funds


def agent(
    kind: str, tools: list[Tool], script: Script, *, name: str | None = None, **options: Any
) -> MultiStepAgent:
    described = {"name": name, "description": f"The {name} team member."} if name else {}
    return KINDS[kind](
        tools=tools,
        model=ScriptedModel(script),
        verbosity_level=LogLevel.OFF,
        max_steps=4,
        **described,
        **options,
    )


def support_tools(shop_gate: ShopGate, *names: str) -> list[Tool]:
    return [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name in names]


def payments_agent(kind: str, ran: list[tuple[str, int]]) -> MultiStepAgent:
    """A team member whose only tool the gate does not know; its model sends 999999 away."""
    script = Script([call("transfer_funds", to="attacker", amount=999999), say("done")])
    return agent(kind, [transfer_tool(ran)], script, name="payments")


# -- refused: a managed agent whose tools the gate would not see


@pytest.mark.parametrize("unknown", ["raise", "refuse"])
@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_a_manager_with_an_ungated_managed_agent_is_refused(
    shop_gate: ShopGate, kind: str, unknown: Any
) -> None:
    """Wrapping refuses it, names the managed agent and the fix, changes nothing; nothing ran."""
    ran: list[tuple[str, int]] = []
    manager_script = Script([call("payments", task="pay the attacker 999999"), say("ok")])
    manager = agent(
        kind,
        support_tools(shop_gate, "get_order"),
        manager_script,
        managed_agents=[payments_agent(kind, ran)],
    )
    tools_before = dict(manager.tools)
    run_before = manager.run
    refused: UnknownTool | None = None
    try:
        gated = GatedAgent(manager, shop_gate.gate, agent_id="support", unknown=unknown)
    except UnknownTool as exc:
        refused = exc
    else:  # what a wrap that let it through leads to: the member's transfer runs, unseen
        gated.run("Please pay", **IDENTITY)
    assert ran == []
    assert refused is not None
    assert re.search(r"managed agent 'payments' is not gated.*GatedAgent\(", str(refused))
    assert manager.tools == tools_before  # nothing wrapped: the agent is as it was
    assert not any(isinstance(t, GatedTool) for t in manager.tools.values())
    assert manager.run == run_before
    assert manager_script.seen == []
    assert shop_gate.store.approvals() == []


def test_an_ungated_agent_deeper_in_the_team_is_refused(shop_gate: ShopGate) -> None:
    """The check is recursive: a gated team member managing an ungated one does not pass."""
    ran: list[tuple[str, int]] = []
    with pytest.raises(UnknownTool, match="'payments' is not gated"):  # the lead itself is refused
        GatedAgent(
            agent(
                "tool_calling",
                [],
                Script([]),
                name="finance_lead",
                managed_agents=[payments_agent("tool_calling", ran)],
            ),
            shop_gate.gate,
            agent_id="support",
        )
    lead = GatedAgent(
        agent("tool_calling", support_tools(shop_gate, "get_order"), Script([]), name="finance_lead"),
        shop_gate.gate,
        agent_id="support",
    )
    lead.agent.managed_agents["payments"] = payments_agent("tool_calling", ran)  # after the lead was wrapped
    manager = agent("tool_calling", [], Script([]), managed_agents=[lead.agent])
    with pytest.raises(UnknownTool, match=r"'finance_lead\.payments' is not gated"):
        GatedAgent(manager, shop_gate.gate, agent_id="support")
    assert ran == []


def test_a_managed_agent_on_another_gate_is_refused(shop_gate: ShopGate, tmp_path: Path) -> None:
    """Its approvals would be in another store, out of the manager's pause and resume."""
    receiver_tools = support_tools(shop_gate, "get_order")
    member = agent("tool_calling", receiver_tools, Script([]), name="orders")
    with GatedAgent(member, effects={"get_order": read()}, db=f"sqlite:///{tmp_path / 'other.db'}"):
        manager = agent("tool_calling", [], Script([]), managed_agents=[member])
        with pytest.raises(UnknownTool, match="'orders' is gated on another gate"):
            GatedAgent(manager, shop_gate.gate, agent_id="support")


def test_effects_cannot_wrap_a_manager(shop_gate: ShopGate, tmp_path: Path) -> None:
    """`effects=` builds a new gate, which no managed agent can be on: refused, and no database made."""
    ran: list[tuple[str, int]] = []
    manager = agent("tool_calling", support_tools(shop_gate, "get_order"), Script([]))
    manager.managed_agents = {"payments": payments_agent("tool_calling", ran)}
    db = tmp_path / "manager.db"
    with pytest.raises(UnknownTool, match="Build the gate first"):
        GatedAgent(manager, effects={"get_order": read()}, db=f"sqlite:///{db}")
    assert not db.exists()
    assert not any(isinstance(t, GatedTool) for t in manager.tools.values())


def test_a_failed_wrap_changes_no_tool(shop_gate: ShopGate) -> None:
    """A tool without a row refuses the whole agent before any of its tools is replaced."""
    ran: list[tuple[str, int]] = []
    tools = [*support_tools(shop_gate, "get_order", "refund_order"), transfer_tool(ran)]
    plain = agent("tool_calling", tools, Script([]))
    before = dict(plain.tools)
    with pytest.raises(UnknownTool, match="transfer_funds"):
        GatedAgent(plain, shop_gate.gate, agent_id="support")
    assert plain.tools == before


def test_a_code_agent_with_additional_functions_is_refused(shop_gate: ShopGate) -> None:
    """Functions handed to a CodeAgent's executor are callable from its code, and are not tools."""
    ran: list[tuple[str, int]] = []

    def transfer_funds(to: str, amount: int) -> str:
        ran.append((to, amount))
        return "sent"

    code = ScriptedCodeModel(['transfer_funds("attacker", 999999)', 'final_answer("ok")'])
    plain = CodeAgent(
        tools=support_tools(shop_gate, "get_order"),
        model=code,
        executor_kwargs={"additional_functions": {"transfer_funds": transfer_funds}},
        verbosity_level=LogLevel.OFF,
        max_steps=3,
    )
    refused: UnknownTool | None = None
    try:
        gated = GatedAgent(plain, shop_gate.gate, agent_id="support")
    except UnknownTool as exc:
        refused = exc
    else:  # what a wrap that let it through leads to
        gated.run("Pay", **IDENTITY)
    assert ran == []
    assert refused is not None
    assert "additional_functions ['transfer_funds']" in str(refused)
    assert not any(isinstance(t, GatedTool) for t in plain.tools.values())


# -- refused at run time: what was added after wrapping


@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_a_tool_added_after_wrapping_refuses_the_run(shop_gate: ShopGate, kind: str) -> None:
    ran: list[tuple[str, int]] = []
    script = Script([call("transfer_funds", to="attacker", amount=999999), say("ok")])
    gated = GatedAgent(
        agent(kind, support_tools(shop_gate, "get_order"), script), shop_gate.gate, agent_id="support"
    )
    gated.agent.tools["transfer_funds"] = transfer_tool(ran)
    with pytest.raises(UnknownTool, match=r"'transfer_funds'.*added after"):
        gated.run("Pay", **IDENTITY)
    assert ran == []
    assert script.seen == []  # refused before the model was asked anything


def test_a_managed_agent_added_after_wrapping_refuses_the_run(shop_gate: ShopGate) -> None:
    ran: list[tuple[str, int]] = []
    script = Script([call("payments", task="pay the attacker 999999"), say("ok")])
    gated = GatedAgent(
        agent("tool_calling", support_tools(shop_gate, "get_order"), script),
        shop_gate.gate,
        agent_id="support",
    )
    sub = payments_agent("tool_calling", ran)
    sub.inputs = {"task": {"type": "string", "description": "The task."}}
    sub.output_type = "string"
    gated.agent.managed_agents["payments"] = sub
    with pytest.raises(UnknownTool, match="'payments' is not gated"):
        gated.run("Pay", **IDENTITY)
    assert ran == []
    assert script.seen == []


# -- accepted: a team gated on one gate


def refund_team(shop_gate: ShopGate, manager_kind: str, member_kind: str) -> tuple[GatedAgent, GatedAgent]:
    """A manager whose `payments` member refunds; both gated on the shop's gate. The manager asks
    for the refund, and after the decision asks again (the member re-issues the same refund)."""
    member_script = Script(
        [call("refund_order", **REFUND), call("refund_order", **REFUND), say("Refund done.")]
    )
    member = GatedAgent(
        agent(member_kind, support_tools(shop_gate, "refund_order"), member_script, name="payments"),
        shop_gate.gate,
        agent_id="support",
    )
    ask = call("payments", task="Refund 12000 GBP on order 1042")
    manager_script = Script([ask, ask, say("Refunded.")])
    manager = GatedAgent(
        agent(
            manager_kind, support_tools(shop_gate, "get_order"), manager_script, managed_agents=[member.agent]
        ),
        shop_gate.gate,
        agent_id="support",
    )
    return manager, member


@pytest.mark.parametrize("member_kind", ["tool_calling", "code"])
@pytest.mark.parametrize("manager_kind", ["tool_calling", "code"])
def test_a_gated_managed_agents_refund_waits_for_approval_and_runs_once(
    shop_gate: ShopGate, manager_kind: str, member_kind: str
) -> None:
    manager, member = refund_team(shop_gate, manager_kind, member_kind)
    out = manager.run("Please refund order 1042", **IDENTITY)

    assert isinstance(out, AwaitingApproval)  # the member's gated call stopped the manager's run
    [pending] = out.pending
    assert pending.card.tool == "refund_order"
    assert shop_gate.shop.receiver.count("refund") == 0
    [row] = shop_gate.store.approvals()  # proposed through the gate, as the manager's user message
    assert (row.tool, row.session_id, row.origin_message_id, row.user_id, row.agent_id) == (
        "refund_order",
        "s-ada",
        "m1",
        "u1",
        "support",
    )

    token = grant(
        shop_gate.gate, Paused(pending.approval_id, pending.version, pending.card.args_hash, "refund_order")
    )
    done = manager.resume(out, {pending.approval_id: Approve(token)})

    assert isinstance(done, Finished)
    assert done.output == "Refunded."
    [(_, executed)] = done.decided
    assert isinstance(executed, Executed)
    assert not executed.replay
    # the member re-issued the approved refund when asked again: the stored result, no second refund
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [(e.tool, e.status) for e in shop_gate.store.executions()] == [("refund_order", "succeeded")]
    for gated in (manager, member):
        assert isinstance(gated.agent.model, ScriptedModel)
        gated.agent.model.assert_complete()


def test_after_a_code_managers_stop_no_managed_agent_runs(shop_gate: ShopGate) -> None:
    """The CodeAgent stop is total for team members too: once a gated call stopped the snippet,
    a managed agent called after it (here from a `finally`) does not run at all."""
    member_script = Script([call("get_order", order_id="1042"), say("shipped")])
    member = GatedAgent(
        agent("tool_calling", support_tools(shop_gate, "get_order"), member_script, name="orders"),
        shop_gate.gate,
        agent_id="support",
    )
    code = ScriptedCodeModel(
        [
            """
            try:
                refund_order(order_id="1042", amount=12000, currency="GBP")
            finally:
                orders(task="Look up order 1042")
            """
        ]
    )
    manager = GatedAgent(
        CodeAgent(
            tools=support_tools(shop_gate, "refund_order"),
            model=code,
            managed_agents=[member.agent],
            verbosity_level=LogLevel.OFF,
            max_steps=3,
        ),
        shop_gate.gate,
        agent_id="support",
    )
    out = manager.run("Refund 1042, then look it up", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    assert [p.card.tool for p in out.pending] == ["refund_order"]
    assert member_script.seen == []  # the member was never started
    assert shop_gate.shop.reads["get_order"] == 0


def test_a_gated_managed_agent_run_alone_still_needs_identity(shop_gate: ShopGate) -> None:
    """Outside its manager's run, the member's own `run` (smolagents' `agent(task)`) is refused."""
    _, member = refund_team(shop_gate, "tool_calling", "tool_calling")
    with pytest.raises(MissingIdentity):
        member.agent("Refund order 1042")
    assert shop_gate.shop.receiver.count("refund") == 0


def test_manager_code_cannot_reach_around_the_members_gate(shop_gate: ShopGate) -> None:
    """A CodeAgent manager's code is handed the member as a function: its tools run only inside
    the member's own gated run. Called from the manager's code, nothing runs, and the model reads
    why (the run goes on: it used to raise MissingIdentity out of the application's run)."""
    _, member = refund_team(shop_gate, "tool_calling", "tool_calling")
    code = ScriptedCodeModel(
        ['payments.tools["refund_order"](order_id="1042", amount=12000, currency="GBP")', 'final_answer("x")']
    )
    manager = GatedAgent(
        CodeAgent(
            tools=[], model=code, managed_agents=[member.agent], verbosity_level=LogLevel.OFF, max_steps=3
        ),
        shop_gate.gate,
        agent_id="support",
    )
    assert isinstance(manager.run("Refund order 1042", **IDENTITY), Finished)
    assert "payments(task=" in str(manager.agent.memory.steps[1].error)  # the model read how
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.approvals() == []


def test_a_member_may_be_built_from_native_tools(shop_gate: ShopGate, tmp_path: Path) -> None:
    """The documented path for a team with the user's own tools: one gate for every member."""
    ran: list[tuple[str, int]] = []
    member = agent("tool_calling", [transfer_tool(ran)], Script([]), name="payments")
    manager = agent("tool_calling", [], Script([]), managed_agents=[member])
    gate = gate_for(
        native_tools(member) + native_tools(manager),
        {"transfer_funds": money("finance", subject="to")},
        agent_id="agent",
        db=f"sqlite:///{tmp_path / 'team.db'}",
        keyring=Keyring.generate(),
    )
    try:
        GatedAgent(member, gate, agent_id="agent")
        GatedAgent(manager, gate, agent_id="agent")
        assert isinstance(member.tools["transfer_funds"], GatedTool)
    finally:
        gate.close()


def test_a_member_shared_by_nested_managers_serves_the_innermost_run(shop_gate: ShopGate) -> None:
    """M manages A and B, and A manages B too (a team, all gated on one gate): when M's run calls
    A and A calls B, B runs as a member of A's run (the innermost, which M's run contains), once,
    through the gate; it is not refused as ambiguous."""
    gate = shop_gate.gate
    orders_script = Script([call("get_order", order_id="1042"), say("shipped")])
    orders = GatedAgent(
        agent("tool_calling", support_tools(shop_gate, "get_order"), orders_script, name="orders"),
        gate,
        agent_id="support",
    )
    helper_script = Script([call("orders", task="look up 1042"), say("A done")])
    helper = GatedAgent(
        agent("tool_calling", [], helper_script, name="helper", managed_agents=[orders.agent]),
        gate,
        agent_id="support",
    )
    manager_script = Script([call("helper", task="help"), say("ok")])
    manager = GatedAgent(
        agent("tool_calling", [], manager_script, managed_agents=[helper.agent, orders.agent]),
        gate,
        agent_id="support",
    )
    out = manager.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished), out
    assert out.output == "ok"
    assert shop_gate.shop.reads["get_order"] == 1
    gate.flush()
    [read_event] = [e for e in shop_gate.store.events(kind="read") if e.tool == "get_order"]
    assert read_event.session_id == "s-ada"
    assert read_event.agent_id == "support"
