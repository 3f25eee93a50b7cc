"""Review round 3 of the LangGraph adapter: read-back boundaries (edits, replays, races)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, interrupt

from effectgate import Approver, EffectGate, Grant, money, read, send
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import EffectRecorder, FakeClock, Script, call, say, step
from effectgate_langgraph import GatedToolNode, approve, deny, edit, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, Paused, ShopGate, grant, open_shop_gate

from ._graph import LangGraphHarness, shop_graph
from .conftest import MakeLangGraphHarness

CONTEXT = {"user_id": "u1"}

CANCEL = {"subscription_id": "sub_u1"}
BILLING = Approver("bill", "billing")
EDIT_NOTICE = "A reviewer changed the arguments"


def _tool_messages(h: Any) -> list[ToolMessage]:
    return [m for m in h.messages() if isinstance(m, ToolMessage)]


def test_edited_call_settled_before_a_sibling_still_tells_the_model_of_the_edit(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Two gated calls of one step: the refund edited by a reviewer and run at the edited amount,
    then the cancel approved on a later resume. The node re-runs from the checkpoint, where the
    refund is already executed; its ToolMessage must still say that a reviewer changed it."""
    h = lg_harness(
        Script([step(call("refund_order", **REFUND), call("cancel_subscription", **CANCEL)), say("Done.")])
    )
    refund, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    edited = {**REFUND, "amount": 6000}
    after_edit = h.decide({refund.approval_id: edit(edited)}).paused
    [v2] = [p for p in after_edit if p.approval_id == refund.approval_id]
    h.decide({refund.approval_id: approve(grant(shop_gate.gate, v2))})
    assert shop_gate.shop.receiver.count("refund") == 1
    [c] = [p for p in paused_now(h) if p.approval_id == cancel.approval_id]
    done = h.decide({cancel.approval_id: approve(grant(shop_gate.gate, c, BILLING))})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    [refund_message] = [m for m in _tool_messages(h) if m.name == "refund_order"]
    assert refund_message.status == "success"
    assert EDIT_NOTICE in str(refund_message.content)
    assert '"amount": 6000' in str(refund_message.content).split("Result:")[0]


def paused_now(h: Any) -> tuple[Paused, ...]:
    from ._graph import paused_of

    return paused_of(h.last)


# -- a reviewer's edit of a gated tool that names no subject


def _post_tools(receiver: EffectRecorder) -> list[Any]:
    @tool
    def post_notice(channel: str, text: str) -> str:
        """Post a notice to a channel."""
        receiver.record("post", channel=channel, text=text)
        return "posted"

    return [post_notice]


def test_edit_of_a_gated_call_without_subject_is_refused_not_proposed_anew(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """A send row without `subject=`: the reviewer's edit must become a version of the waiting
    approval (or be refused), never a second approval the step then calls a mismatch while the
    one the reviewer answered stays pending for ever."""
    receiver = EffectRecorder()
    node = gated_node(_post_tools(receiver), {"post_notice": send("comms")}, db=f"sqlite:///{tmp_path}/eg.db")
    gates.append(node.gate)
    model = ScriptedChatModel(
        script=Script([call("post_notice", channel="ops", text="hi all"), say("Posted.")])
    )
    graph = shop_graph(node.gate, model, checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    out = graph.invoke({"messages": [HumanMessage("post it", id="m3")]}, cfg, context=CONTEXT, version="v2")
    [first] = out.interrupts[0].value["requests"]
    out = graph.invoke(
        resume({first["approval_id"]: edit({"channel": "ops", "text": "hello all"})}, out.interrupts),
        cfg,
        context=CONTEXT,
        version="v2",
    )
    [request] = out.interrupts[0].value["requests"]
    rows = node.gate.store.approvals()
    # either the edit is a new version of the same approval, or it was refused and nothing new
    # was proposed; never two approvals, one of them orphaned
    assert len(rows) == 1, [(r.id, r.status, r.version) for r in rows]
    assert request["approval_id"] == first["approval_id"]
    assert [r["approval_id"] for r in out.interrupts[0].value["refused"]] == [first["approval_id"]]
    assert receiver.effects == []


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a second reviewer edit of one call: the core answers any later call of the same user "
        "message with the current version (a replay never rolls an amendment back), so the edit "
        "is refused as 'an edit needs a pending approval' though the approval is pending; letting "
        "it through needs a core change and the step to skip the edits LangGraph replays"
    ),
)
def test_a_second_reviewer_edit_becomes_the_next_version(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Edit to 6000, then (changing one's mind) to 5000: version 3 holds 5000 and runs once."""
    h = node_or_agent(Script([call("refund_order", **REFUND), say("Done.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    [v2] = h.decide({paused.approval_id: edit({**REFUND, "amount": 6000})}).paused
    assert v2.version == 2
    [v3] = h.decide({paused.approval_id: edit({**REFUND, "amount": 5000})}).paused
    assert v3.version == 3
    assert h.decide({paused.approval_id: approve(grant(shop_gate.gate, v3))}).paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=5000) == 1
    assert shop_gate.shop.receiver.count("refund") == 1


# -- resume(): addressed only to effectgate's own interrupts


def test_resume_helper_leaves_another_nodes_interrupt_unanswered(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """A graph where the gated tools and the application's own `interrupt("Proceed?")` pause in
    the same step: `resume(decisions, out.interrupts)` answers the approval and must not answer
    the other interrupt (with `{}` or with the decisions): that question is still the person's."""
    answers: list[Any] = []
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("Refunded.")]))
    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT)
    bound = model.bind_tools(list(node.tools_by_name.values()))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    def confirm(state: MessagesState) -> dict[str, Any]:
        answers.append(interrupt("Proceed with the rest of the order?"))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "confirm")  # runs beside the tools
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", END)
    builder.add_edge("confirm", END)
    graph = builder.compile(checkpointer=checkpointer)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}

    first = {"messages": [HumanMessage("refund 1042", id="m3")]}
    out = graph.invoke(first, cfg, context=CONTEXT, version="v2")
    assert len(out.interrupts) == 2
    [gated] = [i for i in out.interrupts if isinstance(i.value, dict)]
    [request] = gated.value["requests"]
    token = grant(shop_gate.gate, Paused(request["approval_id"], 1, request["args_hash"], "refund_order"))
    out = graph.invoke(
        resume({request["approval_id"]: approve(token)}, out.interrupts), cfg, context=CONTEXT, version="v2"
    )
    assert shop_gate.shop.receiver.count("refund") == 1
    assert answers == []  # nobody answered the application's own question
    assert [i.value for i in out.interrupts] == ["Proceed with the rest of the order?"]


# -- a gated tool that asks the person a question itself


@pytest.mark.xfail(
    strict=True,
    reason=(
        "an approved gated tool whose body calls LangGraph's interrupt() (a confirmation, a 2FA "
        "code): the core takes the GraphInterrupt for an unknown outcome (needs_reconciliation), "
        "so the tool's question never reaches the person and the call never completes; pausing "
        "inside an execution needs the core to release the claim and keep the grant"
    ),
)
def test_gated_tool_that_interrupts_after_approval_asks_its_question(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    receiver = EffectRecorder()

    @tool
    def pay_invoice(invoice_id: str) -> str:
        """Pay an invoice, asking for the one-time code first."""
        code = interrupt({"question": "one-time code?"})
        receiver.record("pay", invoice_id=invoice_id, code=code)
        return "paid"

    node = gated_node(
        [pay_invoice],
        {"pay_invoice": money("finance", subject="invoice_id")},
        db=f"sqlite:///{tmp_path}/eg.db",
    )
    gates.append(node.gate)
    model = ScriptedChatModel(script=Script([call("pay_invoice", invoice_id="inv-1"), say("Paid.")]))
    graph = shop_graph(node.gate, model, checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    out = graph.invoke({"messages": [HumanMessage("pay it", id="m3")]}, cfg, context=CONTEXT, version="v2")
    [request] = out.interrupts[0].value["requests"]
    granted = node.gate.approve(request["approval_id"], version=1, approver=Approver("fiona", "finance"))
    assert isinstance(granted, Grant)
    out = graph.invoke(
        resume({request["approval_id"]: approve(granted.token)}, out.interrupts),
        cfg,
        context=CONTEXT,
        version="v2",
    )
    assert [i.value for i in out.interrupts] == [{"question": "one-time code?"}]
    graph.invoke(Command(resume="123456"), cfg, context=CONTEXT, version="v2")
    assert receiver.count("pay") == 1


def test_replay_after_a_reviewer_edit_ran_still_tells_the_model_of_the_edit(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Time travel to the checkpoint the refund paused at, after the reviewer's edit ran: the
    stored result is served (nothing runs again) and the model is still told that a reviewer
    changed the arguments its AIMessage holds."""
    h = node_or_agent(Script([call("refund_order", **REFUND), say("Refunded."), say("Refunded, again.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    [v2] = h.decide({paused.approval_id: edit({**REFUND, "amount": 6000})}).paused
    assert h.decide({paused.approval_id: approve(grant(shop_gate.gate, v2))}).paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=6000) == 1
    paused_at = [s for s in h.graph.get_state_history(h.config) if s.next == ("tools",)][-1]
    replay = h.invoke(None, paused_at.config)
    assert replay.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.executions()) == 1
    [result] = replay.results
    assert result.ok
    assert EDIT_NOTICE in result.content
    assert '"amount": 6000' in result.content.split("Result:")[0]


# -- a reviewer's text the database cannot keep


@pytest.fixture
def any_store_gate(store_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    """The shop's gate on SQLite and on PostgreSQL."""
    with open_shop_gate(store_url, clock) as parts:
        yield parts


LONE_SURROGATE = "not \ud800 this one"  # what json.loads makes of a client's "\\ud800"


@pytest.mark.parametrize(
    "decision",
    [
        deny(LONE_SURROGATE),
        edit({**REFUND, "currency": LONE_SURROGATE}),
        {"decisions": [{"type": "reject", "message": LONE_SURROGATE}]},
    ],
    ids=["deny", "edit", "hitl-reject"],
)
def test_reviewer_text_the_store_cannot_keep_is_refused_in_the_open(
    any_store_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], decision: dict[str, Any]
) -> None:
    """A decision whose text holds a lone surrogate (a JSON client's "\\ud800") is refused in the
    payload; the run does not fail with an encoding error. The approval stays pending at its
    version and a clean deny still closes it."""
    shop_gate = any_store_gate
    h = LangGraphHarness(
        shop_gate.gate,
        ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("Not refunded.")])),
        checkpointer,
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    if "decisions" in decision:  # HumanInTheLoopMiddleware's answer, to the interrupt
        again = h.invoke(Command(resume={h.interrupt.id: decision}))
    else:
        again = h.decide({paused.approval_id: decision})
    assert again.paused == (paused,)
    assert [r["approval_id"] for r in h.interrupt.value["refused"]] == [paused.approval_id]
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert (row.status, row.version) == ("pending", 1)
    done = h.decide({paused.approval_id: deny("not this one")})
    assert done.paused == ()
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "denied"
    assert shop_gate.shop.receiver.count("refund") == 0


# -- a tool's own interrupt() in the task of a settled step


@pytest.mark.parametrize("addressed", [True, False], ids=["by-id", "plain"])
@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_tool_interrupt_after_a_settled_step_gets_its_own_answer(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any], addressed: bool, run: str
) -> None:
    """One step: a gated payment and a read that asks the person a question with interrupt().
    The payment is approved and runs, then the read's question pauses the node; re-run after
    the person answers, the step is settled from the store and asks nothing, and LangGraph hands
    a task's answers to its interrupt() calls in order: the read must get the person's answer,
    never the approval's decision (with its grant token, shown to the model)."""
    if run == "ainvoke" and isinstance(checkpointer, SqliteSaver):
        pytest.skip("SqliteSaver has no async methods")
    asked: list[Any] = []
    receiver = EffectRecorder()

    @tool
    def ask_user(question: str) -> str:
        """Ask the person a question."""
        answer = interrupt({"question": question})
        asked.append(answer)
        return str(answer)

    @tool
    def pay_invoice(invoice_id: str) -> str:
        """Pay an invoice."""
        receiver.record("pay", invoice_id=invoice_id)
        return "paid"

    effects = {"ask_user": read(), "pay_invoice": money("finance", subject="invoice_id")}
    node = gated_node([pay_invoice, ask_user], effects, db=f"sqlite:///{tmp_path}/eg.db")
    gates.append(node.gate)
    script = Script(
        [step(call("pay_invoice", invoice_id="inv-1"), call("ask_user", question="colour?")), say("ok")]
    )
    graph = shop_graph(node.gate, ScriptedChatModel(script=script), checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}

    def go(value: Any) -> Any:
        if run == "invoke":
            return graph.invoke(value, cfg, context=CONTEXT, version="v2")
        return asyncio.run(graph.ainvoke(value, cfg, context=CONTEXT, version="v2"))

    out = go({"messages": [HumanMessage("pay inv-1, and ask me a colour", id="m3")]})
    [request] = out.interrupts[0].value["requests"]
    granted = node.gate.approve(request["approval_id"], version=1, approver=Approver("fiona", "finance"))
    assert isinstance(granted, Grant)
    out = go(resume({request["approval_id"]: approve(granted.token)}, out.interrupts))
    assert receiver.count("pay") == 1
    [question] = out.interrupts
    assert question.value == {"question": "colour?"}
    out = go(Command(resume={question.id: "blue"} if addressed else "blue"))
    assert out.interrupts == ()
    assert asked == ["blue"]
    assert receiver.count("pay") == 1
    shown = [str(m.content) for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert not any(granted.token in text for text in shown)
