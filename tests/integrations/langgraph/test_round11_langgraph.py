"""Review round 11 of the LangGraph adapter. Effects are counted at the receiver (the tool), and
records are read back from the gate's store."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command, Interrupt, interrupt

from effectgate import Approver, CallContext, EffectGate, Grant, money, read
from effectgate.redact import marker
from effectgate.stores.records import EventRow
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, gated_node, resume
from effectgate_langgraph._decisions import is_signed_payload
from effectgate_langgraph._shown import ANSWERED_BY_ID, SHOWN
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, ShopGate, grant

from ._graph import shop_graph
from ._paused import paused_refund, status_of
from .conftest import MakeLangGraphHarness
from .test_hitl_decisions import decisions_of, hitl
from .test_review_round3 import CONTEXT


def _shown_amount_changed(value: Any, amount: int) -> dict[str, Any]:
    """The payload as a checkpoint writer leaves it: the reviewer is shown another amount, in the
    card, in the HITL action request and in its description; everything else is untouched."""
    forged = copy.deepcopy(dict(value))
    [request] = forged["requests"]
    [action] = forged["action_requests"]
    real = request["card"]["args"]["amount"]
    request["card"]["args"]["amount"] = amount
    action["args"]["amount"] = amount
    action["description"] = action["description"].replace(f'"amount": {real}', f'"amount": {amount}')
    return forged


def test_a_payload_showing_other_arguments_does_not_verify_and_is_not_answered(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """The payload's signature must cover what the reviewer is shown. A checkpoint writer who
    changes the displayed amount (12000 -> 5) while leaving approval id, version and hashes alone
    must not get a payload that `is_signed_payload` accepts, nor one that `resume(..., gate=,
    user_id=)` answers: the reviewer would approve an amount they never saw."""
    h, paused = paused_refund(node_or_agent)
    stored = h.graph.get_state(h.config).interrupts[0]
    assert is_signed_payload(shop_gate.gate, stored.value, "u1")  # as the checkpoint holds it
    forged = _shown_amount_changed(stored.value, 5)
    assert forged["action_requests"][0]["description"] != stored.value["action_requests"][0]["description"]

    assert not is_signed_payload(shop_gate.gate, forged, "u1")
    token = grant(shop_gate.gate, paused)  # the reviewer approved what the forged card showed
    h.invoke(
        resume(
            {paused.approval_id: approve(token)},
            Interrupt(forged, stored.id),
            gate=shop_gate.gate,
            user_id="u1",
        )
    )
    assert shop_gate.shop.receiver.count("refund") == 0
    assert status_of(shop_gate, paused.approval_id) == ("approved", 1)


NAMED = {"id": "cfo", "role": "finance"}


@pytest.mark.parametrize(
    "decision",
    [{"type": "reject", "message": "no", "approver": NAMED}, {"type": "approve", "approver": NAMED}],
    ids=["reject", "approve"],
)
def test_a_hitl_decision_that_names_its_approver_is_refused_as_a_deny_is(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, decision: dict[str, Any]
) -> None:
    """A deny naming `"approver"` is refused (README: silently recording another name than the one
    sent would hide that from the integrator). HITL's reject and tokenless approve are recorded as
    the application's approver just the same, so one naming another person is refused too: nothing
    is decided, nothing runs; the same decision without it is then applied."""
    h, paused = paused_refund(lambda s: node_or_agent(s, native_approver=FINANCE), say("Done."))
    turn = h.invoke(hitl(decision))
    assert turn.paused == (paused,)
    assert decisions_of(shop_gate, paused.approval_id) == []
    assert status_of(shop_gate, paused.approval_id) == ("pending", 1)
    assert shop_gate.shop.receiver.count("refund") == 0

    h.invoke(hitl({k: v for k, v in decision.items() if k != "approver"}))
    [(approver, role, kind, _)] = decisions_of(shop_gate, paused.approval_id)
    assert (approver, role) == ("fiona", "finance")
    assert shop_gate.shop.receiver.count("refund") == (1 if kind == "approve" else 0)


def test_a_payload_forged_deeper_than_python_recurses_is_not_the_gates(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A card nested deeper than Python recurses, in a field the description does not show, is
    answered False by `is_signed_payload` (what `resume(gate=...)` asks), never a raw RecursionError."""
    h, _ = paused_refund(node_or_agent)
    forged = copy.deepcopy(dict(h.graph.get_state(h.config).interrupts[0].value))
    nested: Any = "x"
    for _ in range(100_000):
        nested = [nested]
    forged["requests"][0]["card"]["owner"] = nested
    assert not is_signed_payload(shop_gate.gate, forged, "u1")


@pytest.mark.parametrize("forged", ["plain", "erased"])
def test_an_unsealed_answered_by_id_record_does_not_hand_the_grant_to_a_tools_question(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any], forged: str
) -> None:
    """One step: a gated payment and a read that asks the person a question with interrupt(). The
    payment is approved and runs; the question pauses the node. Someone with write access to the
    gate's event log adds a `langgraph_interrupt_answered_by_id` record for the step's pause slot
    (the record is not sealed), so the re-run no longer takes that slot's answer (the approve with
    its grant token) as the step's: the read's question would get it as the person's answer. A
    record the keyring did not seal must not move an answer, nor one written as retention leaves
    an erased record (a redaction marker) that no sealed redaction entry vouches for."""
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
        return graph.invoke(value, cfg, context=CONTEXT, version="v2")

    out = go({"messages": [HumanMessage("pay inv-1, ask a colour", id="m3")]})
    [request] = out.interrupts[0].value["requests"]
    granted = node.gate.approve(request["approval_id"], version=1, approver=Approver("fiona", "finance"))
    assert isinstance(granted, Grant)
    out = go(resume({request["approval_id"]: approve(granted.token)}, out.interrupts))
    assert receiver.count("pay") == 1
    [question] = out.interrupts

    [paused] = node.gate.store.events(kind=SHOWN, session_id="s-ada")
    pause = json.loads(paused.detail_json)
    if forged == "plain":
        ctx = CallContext(session_id="s-ada", origin_message_id="m3", user_id="u1", agent_id="x")
        node.gate.note(ANSWERED_BY_ID, ctx=ctx, interrupt_id=pause["interrupt_id"], slot=pause["slot"])
    else:
        facts = {"interrupt_id": pause["interrupt_id"], "slot": pause["slot"]}
        row = {"at": paused.at + 1, "kind": ANSWERED_BY_ID, "session_id": "s-ada"}
        with sa.create_engine(f"sqlite:///{tmp_path}/eg.db").begin() as conn:
            conn.execute(sa.insert(EventRow.__table__).values(**row, detail_json=marker("r-forged", facts)))

    out = go(Command(resume={question.id: "blue"}))
    assert granted.token not in json.dumps(asked, default=str)
    assert asked in (["blue"], [])  # the person's answer, or the question asked again
    assert receiver.count("pay") == 1
