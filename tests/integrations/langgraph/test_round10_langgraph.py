"""Review round 10 of the LangGraph adapter. Effects are counted at the receiver (the tool), and
records are read back from the gate's store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from markdown_it import MarkdownIt

from effectgate import Approver, CallContext, EffectGate, money, read
from effectgate.errors import TableError
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import gated_middleware
from effectgate_langgraph._shown import SHOWN
from effectgate_langgraph.testing import ScriptedChatModel
from tests.core.test_chain import unguard

from .test_hitl_order import APPROVE, NO_CREDIT, answer, approval_ids, decided, node_of, shown, two_calls
from .test_native import ask, graph_of, invoke

FIONA = Approver("fiona", "finance")
CFG: RunnableConfig = {"configurable": {"thread_id": "t1", "user_id": "u1"}}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


# -- gate=: a given gate's row that lacks a check the effects name


def test_a_given_gate_without_the_rows_scope_check_is_refused(db: str, gates: list[EffectGate]) -> None:
    """`gated_middleware(tools, effects, gate=gate)` promises that the gate holds these rows. A row
    whose `scope=` check (who may read which order) the given gate's row lacks must not be
    accepted: the check would silently never run, and u1 would read u2's order."""
    receiver = EffectRecorder()

    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        receiver.record("get_order", order_id=order_id)
        return f"order {order_id}: delivered"

    def own_orders(args: Mapping[str, Any], ctx: CallContext) -> bool:
        return bool(args.get("order_id") == "1042" and ctx.user_id == "u1")

    first = gated_middleware([get_order], {"get_order": read()}, agent_id="a", db=db)
    gates.append(first.gate)
    scoped = {"get_order": read(scope=own_orders)}
    try:
        mw = gated_middleware([get_order], scoped, agent_id="a", gate=first.gate)
    except TableError:
        mw = None
    if mw is not None:  # accepted: then the scope check must hold
        model = ScriptedChatModel(script=Script([call("get_order", order_id="2001"), say("Done.")]))
        agent = create_agent(model, middleware=[mw], checkpointer=InMemorySaver())
        agent.invoke({"messages": [HumanMessage("order 2001?", id="m1")]}, CFG, version="v2")
    assert receiver.count("get_order") == 0


# -- a positional (HITL) answer and the store's order of the waiting calls


@pytest.mark.parametrize("records", ["kept", "reordered too"])
def test_a_reordered_event_log_does_not_move_a_hitl_decision(
    keyed_db: str, gates: list[EffectGate], records: str
) -> None:
    """Shown refund then credit, the reviewer approves the refund and rejects the credit. Someone
    with write access to the gate's database (not its keyring) swaps the two approvals' "proposed"
    events, the order a positional answer is applied in (and, "reordered too", rewrites the
    record of what the interrupt showed to match). The answer must not approve the credit the
    reviewer rejected: it is applied to the calls as shown, or refused whole."""
    receiver = EffectRecorder()
    node = node_of(receiver, keyed_db, gates)
    graph = graph_of(node, two_calls(say("Done.")), InMemorySaver())
    out = invoke(graph, ask("refund 1042 please"))
    names, ids = shown(out), approval_ids(out)
    assert names == ["refund_order", "issue_credit"]
    refund, credit = ids["refund_order"], ids["issue_credit"]
    unguard(node.gate.store, "eg_events")  # the database owner's rights, not the keyring
    with node.gate.store.transaction() as conn:
        conn.execute(
            sa.text(
                "UPDATE eg_events SET approval_id = CASE approval_id WHEN :a THEN :b ELSE :a END "
                "WHERE kind = 'proposed' AND approval_id IN (:a, :b)"
            ),
            {"a": refund, "b": credit},
        )
        if records == "reordered too":
            for event in node.gate.store.events(kind=SHOWN):
                detail = json.loads(event.detail_json)
                detail["shown"] = list(reversed(detail["shown"]))
                conn.execute(
                    sa.text("UPDATE eg_events SET detail_json = :d WHERE id = :id"),
                    {"d": json.dumps(detail), "id": event.id},
                )

    invoke(graph, answer(names, {"refund_order": APPROVE, "issue_credit": NO_CREDIT}))
    assert receiver.count("credit") == 0
    assert decided(node.gate, credit)[0] in ("pending", "denied")
    assert ("fiona", "approve", None) not in decided(node.gate, credit)[1]


# -- model text in the HITL description, which inboxes render as Markdown


def test_model_text_in_the_hitl_description_is_never_markdown(db: str, gates: list[EffectGate]) -> None:
    """langchain's HITL inboxes (Agent Inbox) render an action request's `description` as
    Markdown. The card in it holds the model's arguments: an image there would be fetched when
    the reviewer opens the request, a link would point the reviewer anywhere. They must read as
    the text the model sent, and nothing may run before a decision."""
    receiver = EffectRecorder()

    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return "refunded"

    sent = "![ok](https://evil.example/p.png) [approve](https://phish.example) ```` <b>x</b>"
    mw = gated_middleware(
        [refund_order], {"refund_order": money("finance", subject="order_id")}, agent_id="a", db=db
    )
    gates.append(mw.gate)
    model = ScriptedChatModel(script=Script([call("refund_order", order_id=sent, amount=5)]))
    agent = create_agent(model, middleware=[mw], checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("refund", id="m1")]}, CFG, version="v2")
    [pause] = out.interrupts
    [action] = pause.value["action_requests"]
    tokens = MarkdownIt("commonmark").parse(action["description"])
    assert [t.type for t in tokens] == ["fence"]
    assert sent in tokens[0].content
    assert receiver.count("refund") == 0
