"""Review round 2 of the framework adapters: each probe runs inside the real framework runtime."""

from __future__ import annotations

from effectgate.testing import Script, call, say, step
from effectgate_smolagents import AwaitingApproval, Finished
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import EMAIL, REFUND, ShopGate
from tests.integrations.smolagents._harness import support_agent


def _approvals(shop_gate: ShopGate) -> list[tuple[str, str]]:
    return [(c.approval_id, c.tool) for c in shop_gate.gate.pending()]


def test_smolagents_reused_call_id_registers_no_unseen_approval(shop_gate: ShopGate) -> None:
    """smolagents keeps only the last call of a step per tool-call id (a dict by id): a gated call
    it drops never runs, so the gate must not register an approval no run pauses on."""
    script = Script(
        [step(call("send_email", id="dup", **EMAIL), call("refund_order", id="dup", **REFUND)), say("ok")]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund 1042 and email me", session_id="s-ada", origin_message_id="m3", user_id="u1")
    shown = {p.approval_id for p in out.pending} if isinstance(out, AwaitingApproval) else set()
    assert isinstance(out, AwaitingApproval | Finished)
    assert {a for a, _ in _approvals(shop_gate)} <= shown


def test_langgraph_node_runs_no_table_row_it_does_not_offer(shop_gate: ShopGate) -> None:
    """A GatedToolNode offering only `get_order` (a read-only node of a larger table): the model
    calling a table row the node does not offer gets ToolNode's "not a valid tool" answer, and
    neither the write runs nor an approval is registered for the refund."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from effectgate_langgraph import GatedToolNode, table_tools
    from effectgate_langgraph.testing import ScriptedChatModel
    from tests.integrations.langgraph._graph import shop_graph

    offered = [t for t in table_tools(shop_gate.gate.table, agent_id="support") if t.name == "get_order"]
    node = GatedToolNode(shop_gate.gate, offered, agent_id="support")
    script = Script(
        [
            step(
                call("update_ticket_tags", ticket_id="t-17", tags=["urgent"]),
                call("refund_order", **REFUND),
            ),
            say("done"),
        ]
    )
    model = ScriptedChatModel(script=script)
    graph = shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver(), node=node)
    out = graph.invoke(
        {"messages": [HumanMessage("hi", id="m1")]},
        {"configurable": {"thread_id": "s-ada"}},
        context={"user_id": "u1"},
        version="v2",
    )
    assert shop_gate.shop.receiver.count("ticket_tags") == 0
    assert shop_gate.gate.pending() == []
    assert out.interrupts == ()
    answers = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["error", "error"]
    assert all("is not a valid tool" in str(m.content) for m in answers)


def test_langgraph_middleware_runs_no_table_row_the_agent_does_not_offer(shop_gate: ShopGate) -> None:
    """create_agent given its own tools (`tools=[]` on the middleware): a call of a table row the
    agent does not offer is answered as create_agent's ToolNode answers it; the write does not
    run, and the sibling gated call registers no approval for the refund nobody was offered."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from effectgate_langgraph import EffectGateMiddleware, table_tools
    from effectgate_langgraph.testing import ScriptedChatModel

    rows = table_tools(shop_gate.gate.table, agent_id="support")
    offered = [t for t in rows if t.name in ("get_order", "send_email")]
    script = Script(
        [
            step(
                call("update_ticket_tags", ticket_id="t-17", tags=["urgent"]),
                call("refund_order", **REFUND),
                call("send_email", **EMAIL),
            ),
            say("done"),
        ]
    )
    agent = create_agent(
        ScriptedChatModel(script=script),
        tools=offered,
        middleware=[EffectGateMiddleware(shop_gate.gate, agent_id="support", tools=[])],
        checkpointer=InMemorySaver(),
    )
    out = agent.invoke(
        {"messages": [HumanMessage("hi", id="m1")]},
        {"configurable": {"thread_id": "s-ada"}},
        context={"user_id": "u1"},
        version="v2",
    )
    assert shop_gate.shop.receiver.count("ticket_tags") == 0
    assert [c.tool for c in shop_gate.gate.pending()] == ["send_email"]
    answers = {m.name: m for m in out.value["messages"] if isinstance(m, ToolMessage)}
    assert "is not a valid tool" in str(answers["update_ticket_tags"].content)
    assert "is not a valid tool" in str(answers["refund_order"].content)


def test_smolagents_resume_goes_on_after_an_unknown_outcome(
    shop_gate: ShopGate,
) -> None:
    """Two approved calls of one step: the refund's provider times out (the outcome is unknown).
    The resume still runs the email once and continues the run, telling the model the refund
    needs reconciliation, instead of raising out of `resume` with the email never sent."""
    from effectgate_smolagents import Approve
    from tests.conformance.adapters import FINANCE, SUPPORT_LEAD

    script = Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL)), say("Both handled.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund 1042 and email me", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, AwaitingApproval)
    by_tool = {p.card.tool: p for p in out.pending}
    approver = {"refund_order": FINANCE, "send_email": SUPPORT_LEAD}
    decisions = {}
    for tool, p in by_tool.items():
        grant = shop_gate.gate.approve(p.approval_id, version=p.version, approver=approver[tool])
        decisions[p.approval_id] = Approve(grant)  # type: ignore[arg-type]
    shop_gate.shop.provider.timeouts_to_inject = 1
    done = gated.resume(out, decisions)
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 1
    outcomes = dict(done.decided)
    assert getattr(outcomes[by_tool["refund_order"].approval_id], "code", None) == "needs_reconciliation"
