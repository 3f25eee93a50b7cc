"""Review round 4 of the LangGraph adapter: what a reviewer is offered, forged answers, parity."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, interrupt

from effectgate import Approver, EffectGate, Grant, money, read, send
from effectgate.redact import retain
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, edit, gated_middleware, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._graph import LangGraphHarness, edit_paused_call, shop_graph
from ._paused import paused_refund, plain_resume, status_of
from .conftest import MakeLangGraphHarness

CONTEXT = {"user_id": "u1"}


def _post_tools(receiver: EffectRecorder) -> list[Any]:
    @tool
    def post_notice(channel: str, text: str) -> str:
        """Post a notice to a channel."""
        receiver.record("post", channel=channel, text=text)
        return "posted"

    return [post_notice]


def _post_graph(
    kind: str,
    receiver: EffectRecorder,
    db: str,
    checkpointer: BaseCheckpointSaver[Any],
    gates: list[EffectGate],
) -> Any:
    script = Script([call("post_notice", channel="ops", text="hi all"), say("Posted.")])
    model = ScriptedChatModel(script=script)
    effects = {"post_notice": send("comms")}  # no subject=
    if kind == "node":
        node = gated_node(_post_tools(receiver), effects, db=db)
        gates.append(node.gate)
        return shop_graph(node.gate, model, checkpointer=checkpointer, node=node)
    middleware = gated_middleware(_post_tools(receiver), effects, db=db)
    gates.append(middleware.gate)
    return create_agent(model, middleware=[middleware], checkpointer=checkpointer)


# -- what the payload offers for a row that names no subject


@pytest.mark.parametrize("kind", ["node", "agent"])
def test_subject_less_call_is_not_offered_an_edit_it_cannot_take(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any], kind: str
) -> None:
    """A gated row without `subject=`: the step refuses every edit of its call (the core would
    propose a second approval), so neither the payload's `allowed_decisions` nor langchain's
    `review_configs` may offer one; an edit sent anyway is refused and nothing runs."""
    receiver = EffectRecorder()
    graph = _post_graph(kind, receiver, f"sqlite:///{tmp_path}/eg.db", checkpointer, gates)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
    out = graph.invoke({"messages": [HumanMessage("post it", id="m3")]}, cfg, context=CONTEXT, version="v2")
    [pending] = out.interrupts
    [request] = pending.value["requests"]
    [review] = pending.value["review_configs"]
    assert "edit" not in request["allowed_decisions"]
    assert "edit" not in review["allowed_decisions"]
    assert request["allowed_decisions"] == ["approve", "deny"]
    assert review["allowed_decisions"] == ["approve", "reject"]
    out = graph.invoke(
        resume({request["approval_id"]: edit({"channel": "ops", "text": "hello"})}, out.interrupts),
        cfg,
        context=CONTEXT,
        version="v2",
    )
    [refused] = out.interrupts[0].value["refused"]
    assert refused["approval_id"] == request["approval_id"]
    assert receiver.effects == []
    [row] = gates[0].store.approvals()
    assert (row.status, row.version) == ("pending", 1)


def test_mismatched_call_offers_langchain_reviewers_only_a_reject(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The checkpoint's paused call edited after its approval: only a deny can be applied, and the
    HITL view (`review_configs`) must say so too, not offer an approve or edit that is refused.
    A HITL approve sent anyway is refused and nothing runs."""
    h, paused = paused_refund(node_or_agent, say("Not refunded."))
    grant(shop_gate.gate, paused)
    edit_paused_call(h.graph, h.config, {"amount": 1})
    h.invoke(plain_resume({}))
    [request] = h.interrupt.value["requests"]
    [review] = h.interrupt.value["review_configs"]
    assert request["mismatch"]
    assert request["allowed_decisions"] == ["deny"]
    assert review["allowed_decisions"] == ["reject"]
    again = h.invoke(Command(resume={h.interrupt.id: {"decisions": [{"type": "approve"}]}}))
    assert again.paused == (paused,)
    assert shop_gate.shop.receiver.count("refund") == 0
    assert status_of(shop_gate, paused.approval_id) == ("approved", 1)


def _offered(h: LangGraphHarness) -> tuple[list[str], list[str]]:
    """The one request's `allowed_decisions` and its HITL `review_configs` entry's."""
    [request] = h.interrupt.value["requests"]
    [review] = h.interrupt.value["review_configs"]
    return request["allowed_decisions"], review["allowed_decisions"]


def test_an_approved_call_is_not_offered_an_edit(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A refund approved in the inbox (its grant not presented yet) and paused again: the core
    answers an edit with the approval as it stands, so the step refuses every edit; the payload
    must not offer one. An edit sent anyway changes nothing and runs nothing."""
    h, paused = paused_refund(node_or_agent, say("Refunded."))
    grant(shop_gate.gate, paused)
    h.invoke(Command(resume={h.interrupt.id: {}}))  # re-shown: nothing decided
    assert h.interrupt.value["requests"][0]["status"] == "approved"
    assert _offered(h) == (["approve", "deny"], ["approve", "reject"])
    h.decide({paused.approval_id: edit({**REFUND, "amount": 100})})
    [refused] = h.interrupt.value["refused"]
    assert refused["approval_id"] == paused.approval_id
    assert status_of(shop_gate, paused.approval_id) == ("approved", 1)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_call_a_reviewer_edited_is_not_offered_a_second_edit(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """After a reviewer's edit, a second edit is refused (the core answers the same message with
    the current version: test_review_round3's strict xfail), so the payload of the edited
    version offers approve and deny only; the first payload offered the edit it then took."""
    h, paused = paused_refund(node_or_agent, say("Refunded."))
    assert _offered(h) == (["approve", "deny", "edit"], ["approve", "edit", "reject"])
    [v2] = h.decide({paused.approval_id: edit({**REFUND, "amount": 6000})}).paused
    assert v2.version == 2
    assert _offered(h) == (["approve", "deny"], ["approve", "reject"])
    h.decide({paused.approval_id: edit({**REFUND, "amount": 5000})})
    assert status_of(shop_gate, paused.approval_id) == ("pending", 2)
    assert h.decide({paused.approval_id: approve(grant(shop_gate.gate, v2))}).paused == ()
    assert shop_gate.shop.receiver.count("refund", amount=6000) == 1
    assert shop_gate.shop.receiver.count("refund") == 1


# -- a tool's own interrupt() after a settled step, once retention erased the step's records


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_tool_interrupt_after_retention_gets_its_own_answer_not_the_grant(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any], run: str
) -> None:
    """One step: a gated payment and a read that asks the person a question with interrupt().
    The payment is approved and runs; the read's question pauses the node. A retention pass
    then erases the closed payment's records, including the note of where the step paused.
    Re-run with the person's answer, the step is settled from the store and asks nothing; the
    read must still get the person's answer, never the approval's decision (its grant token,
    which the model would be shown)."""
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
    later = max(e.at for e in node.gate.store.events()) + 60
    retain(node.gate.store, node.gate.keyring, {"unclassified": 0}, by="nightly", now=later)
    out = go(Command(resume={question.id: "blue"}))
    assert out.interrupts == ()
    assert asked == ["blue"]
    assert receiver.count("pay") == 1
    shown = [str(m.content) for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert not any(granted.token in text for text in shown)
