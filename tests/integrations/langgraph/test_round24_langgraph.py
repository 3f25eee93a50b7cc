"""Round 24: the LangGraph adapter reviewed with the real runtime and scripted models, reproduced first.

1. A GatedToolNode `wrap_tool_call` that asks its own question (`interrupt()`, "confirm this
   refund?") before it calls `execute`, around a call approved with HumanInTheLoopMiddleware's
   `{"type": "approve"}`: the grant that approve minted lived only in the run that raised the
   wrapper's interrupt (no checkpoint keeps a HITL grant), and was neither spent nor given back.
   The next run found the approval approved with an unspent grant nobody held, listed it as
   waiting again and took the wrapper's "yes" as its own answer (refused: not a mapping); every
   later answer went the same way and the refund never ran (a new HITL approve is refused while
   the lost grant lives). Fixed (`_regrant.given_back`, around the node's dispatch): a HITL grant
   the dispatch leaves unspent as it raises is given back and noted, as at a pause of the step,
   so the next run grants it again as the same approver without asking, and the wrapper gets
   its own answer. The refund runs once.
2. The same wrapper around a call approved with a plain `Command(resume={approval_id:
   approve(token)})` (the resume map, which no checkpoint keeps): the next run cannot find the
   token, asks again and takes the wrapper's answer. Left as a strict xfail (see its reason).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant

from ._graph import paused_of, shop_graph

CONFIG: Any = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}
HITL_APPROVE = Command(resume={"decisions": [{"type": "approve"}]})


def _confirmed(request: Any) -> ToolMessage | None:
    """The application's own question before a refund runs; None: confirmed, run it."""
    if request.tool_call["name"] != "refund_order" or interrupt({"confirm": "refund_order"}) == "yes":
        return None
    return ToolMessage(
        "not confirmed", tool_call_id=request.tool_call["id"], name="refund_order", status="error"
    )


def confirm(request: Any, execute: Any) -> Any:
    return _confirmed(request) or execute(request)


async def aconfirm(request: Any, execute: Any) -> Any:
    return _confirmed(request) or await execute(request)


def _graph(shop_gate: ShopGate, mode: str, *later: Any) -> Any:
    wrapper = {"wrap_tool_call": confirm} if mode == "sync" else {"awrap_tool_call": aconfirm}
    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=FINANCE, **wrapper)
    model = ScriptedChatModel(script=Script([call("refund_order", **REFUND), say("done"), *later]))
    return shop_graph(shop_gate.gate, model, checkpointer=InMemorySaver(), node=node)


def _invoke(graph: Any, value: Any, mode: str) -> Any:
    if mode == "sync":
        return graph.invoke(value, CONFIG, context=CONTEXT, version="v2")
    return asyncio.run(graph.ainvoke(value, CONFIG, context=CONTEXT, version="v2"))


def _confirm_and_finish(graph: Any, out: Any, mode: str, answer: str = "yes") -> Any:
    """Answer the wrapper's question; the run must then finish (no interrupt of the gate again)."""
    [asked] = out.interrupts
    assert asked.value == {"confirm": "refund_order"}
    out = _invoke(graph, Command(resume={asked.id: answer}), mode)
    assert out.interrupts == ()
    return out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hitl_approved_call_behind_a_confirming_wrapper_runs_once(shop_gate: ShopGate, mode: str) -> None:
    """The reviewer approves (HITL), the wrapper's question is answered yes: the refund runs
    once, and the gate never asks again for the approval it had."""
    graph = _graph(shop_gate, mode)
    out = _invoke(graph, {"messages": [HumanMessage("refund 1042", id="m1")]}, mode)
    assert len(paused_of(out)) == 1
    out = _confirm_and_finish(graph, _invoke(graph, HITL_APPROVE, mode), mode)
    assert shop_gate.shop.receiver.count("refund") == 1
    [approval] = shop_gate.store.approvals()
    assert approval.status == "executed"
    told = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in told] == ["success"]
    assert shop_gate.gate.audit().clean


def test_the_confirmed_run_replayed_from_the_wrappers_pause_does_not_refund_again(
    shop_gate: ShopGate,
) -> None:
    """Time travel: the wrapper's pause resumed again from its checkpoint after the refund ran
    answers from the store; the refund ran once."""
    graph = _graph(shop_gate, "sync", say("done again"))
    _invoke(graph, {"messages": [HumanMessage("refund 1042", id="m1")]}, "sync")
    out = _invoke(graph, HITL_APPROVE, "sync")
    [asked] = out.interrupts
    paused_config = graph.get_state(CONFIG).config
    _confirm_and_finish(graph, out, "sync")
    again = graph.invoke(Command(resume={asked.id: "yes"}), paused_config, context=CONTEXT, version="v2")
    assert again.interrupts == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    [told] = [m for m in again.value["messages"] if isinstance(m, ToolMessage)]
    assert "re_1" in str(told.content)


def test_a_hitl_approved_call_the_wrapper_declines_does_not_run(shop_gate: ShopGate) -> None:
    """The same, the wrapper's question answered no: nothing runs, and the gate asks nothing."""
    graph = _graph(shop_gate, "sync")
    _invoke(graph, {"messages": [HumanMessage("refund 1042", id="m1")]}, "sync")
    out = _confirm_and_finish(graph, _invoke(graph, HITL_APPROVE, "sync"), "sync", answer="no")
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [m.content for m in out.value["messages"] if isinstance(m, ToolMessage)] == ["not confirmed"]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a grant token answered from the resume map (Command(resume={approval_id: approve(token)})) "
        "is in no checkpoint; when a node's wrap_tool_call asks its own interrupt() before execute, "
        "the next run cannot find the token, asks for the approval again and takes the wrapper's "
        "answer slot. A fix needs the step to skip (in `_shown.asker`) the slot `note_mapped` left "
        "to the wrapper and still be answered, or a documented rule: answer with "
        "resume(decisions, out.interrupts), whose answer the checkpoint keeps (that case works)"
    ),
)
def test_a_resume_map_grant_behind_a_confirming_wrapper_runs_once(shop_gate: ShopGate) -> None:
    """Approved with a plain resume map answer, confirmed yes: the refund runs once."""
    graph = _graph(shop_gate, "sync")
    out = _invoke(graph, {"messages": [HumanMessage("refund 1042", id="m1")]}, "sync")
    [paused] = paused_of(out)
    answer = Command(resume={paused.approval_id: approve(grant(shop_gate.gate, paused))})
    _confirm_and_finish(graph, _invoke(graph, answer, "sync"), "sync")
    assert shop_gate.shop.receiver.count("refund") == 1


def test_an_addressed_grant_behind_a_confirming_wrapper_runs_once(shop_gate: ShopGate) -> None:
    """Approved with `resume(decisions, interrupts)` (kept in the checkpoint): runs once."""
    graph = _graph(shop_gate, "sync")
    out = _invoke(graph, {"messages": [HumanMessage("refund 1042", id="m1")]}, "sync")
    [paused] = paused_of(out)
    answer = resume({paused.approval_id: approve(grant(shop_gate.gate, paused))}, out.interrupts)
    _confirm_and_finish(graph, _invoke(graph, answer, "sync"), "sync")
    assert shop_gate.shop.receiver.count("refund") == 1
