"""The OpenAI Agents adapter beyond the contract: parallel turns, deferred results, injection, misuse."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool
from agents.exceptions import UserError

from effectgate import Approver, Grant, PartialApproval
from effectgate.stores.base import from_json
from effectgate.testing import Script, call, say, step
from effectgate_openai_agents import (
    MissingIdentity,
    UnknownTool,
    approve_as,
    deferred_operations,
    execute_deferred,
    gate_agent,
    gate_tools,
    pending_approvals,
    reject,
    table_tools,
    with_outcome,
)
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant

from ._harness import context, support_agent, tool_results
from .conftest import MakeOpenAIHarness

LEAD = Approver("sam", "support_lead")
EMAIL = {"to": ["ada@example.com"], "subject": "Your refund", "body": "On its way."}


def test_parallel_gated_calls_pause_together_and_are_decided_apart(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """One turn: a read, a refund and an email. The read runs once; both gated calls pause together;
    the refund approved and the email rejected give one refund and no email."""
    h = oa_harness(
        Script(
            [
                step(
                    call("get_order", order_id="1042"),
                    call("refund_order", **REFUND),
                    call("send_email", **EMAIL),
                ),
                say("Refunded; no email sent."),
            ]
        )
    )
    turn = h.send("Refund 1042 and email me", message_id="m7")
    assert sorted(p.tool for p in turn.paused) == ["refund_order", "send_email"]
    assert [(r.tool, r.ok) for r in turn.results] == [("get_order", True)]
    assert sorted(r.tool for r in shop_gate.store.approvals()) == ["refund_order", "send_email"]
    state = h.restore()
    refund, email = sorted(pending_approvals(state), key=lambda p: p.tool)
    assert isinstance(approve_as(shop_gate.gate, state, refund, FINANCE), Grant)
    reject(shop_gate.gate, state, email, approver=LEAD, reason="no emails today")
    turn = h.resume(state)
    assert sorted((r.tool, r.ok) for r in turn.results) == [("refund_order", True), ("send_email", False)]
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 0
    assert sorted((r.tool, r.status) for r in shop_gate.store.approvals()) == [
        ("refund_order", "executed"),
        ("send_email", "denied"),
    ]
    h.script.assert_complete()


def test_two_calls_of_one_gated_tool_in_a_turn_register_neither(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The core's parallel rule holds through the SDK: two refunds in one turn, no approval, no pause."""
    half = {**REFUND, "amount": 6000}
    h = oa_harness(
        Script([step(call("refund_order", **half), call("refund_order", **half)), say("One at a time.")])
    )
    turn = h.send("Refund 1042 in two halves", message_id="m8")
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("refund_order", False)]
    assert [from_json(e.detail_json)["code"] for e in shop_gate.store.events(kind="refused")] == [
        "parallel_calls",
        "parallel_calls",
    ]
    assert shop_gate.store.approvals() == []
    h.script.assert_complete()


def test_keys_come_from_the_run_context_not_the_call_id(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The approval is keyed on the context's session and message; a new call id replays the same approval."""
    h = oa_harness(
        Script([call("refund_order", id="call-a", **REFUND), call("refund_order", id="call-b", **REFUND)])
    )
    [first] = h.send("Please refund order 1042", message_id="m3").paused
    [again] = h.send("Please refund order 1042", message_id="m3").paused
    assert (again.approval_id, again.version) == (first.approval_id, first.version)
    [row] = shop_gate.store.approvals()
    assert (row.session_id, row.origin_message_id, row.user_id, row.agent_id) == (
        "s-ada",
        "m3",
        "u1",
        "support",
    )
    assert len(shop_gate.store.events(kind="proposed")) == 1


def test_sdk_approval_without_an_effectgate_grant_runs_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """`state.approve(item)` alone (no grant): the model is told it did not run, once; nothing is refunded."""
    h = oa_harness(Script([call("refund_order", **REFUND), say("It was not approved.")]))
    h.send("Please refund order 1042", message_id="m3")
    state = h.restore()
    state.approve(state.get_interruptions()[0])
    turn = h.resume(state)
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False)]
    assert "not_approved" in turn.results[0].content
    assert shop_gate.shop.receiver.count("refund") == 0
    [row] = shop_gate.store.approvals()
    assert row.status == "pending"
    h.script.assert_complete()


def test_denied_in_effectgate_after_the_sdk_approved_runs_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """Granted and attached, then denied in effectgate (say from the inbox) before the resume: refused."""
    h = oa_harness(Script([call("refund_order", **REFUND), say("Denied.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    state = h.restore()
    [waiting] = pending_approvals(state)
    approve_as(shop_gate.gate, state, waiting, FINANCE)
    shop_gate.gate.deny(paused.approval_id, approver=FINANCE, reason="changed my mind")
    turn = h.resume(state)
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False)]
    assert shop_gate.shop.receiver.count("refund") == 0
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "denied"


def test_destructive_needs_two_distinct_approvers(oa_harness: MakeOpenAIHarness, shop_gate: ShopGate) -> None:
    """The first privacy approver leaves the SDK item pending; the second grants and it runs once."""
    h = oa_harness(Script([call("delete_customer_data", customer_id="u1"), say("Deleted.")]))
    h.send("Delete my data", message_id="m10")
    state = h.restore()
    [waiting] = pending_approvals(state)
    first = approve_as(shop_gate.gate, state, waiting, Approver("pat", "privacy"))
    assert isinstance(first, PartialApproval)
    with pytest.raises(Exception, match=r"distinct|already"):
        approve_as(shop_gate.gate, state, waiting, Approver("pat", "privacy"))
    assert isinstance(approve_as(shop_gate.gate, state, waiting, Approver("quinn", "privacy")), Grant)
    turn = h.resume(state)
    assert [(r.tool, r.ok) for r in turn.results] == [("delete_customer_data", True)]
    assert shop_gate.shop.receiver.count("delete", customer_id="u1") == 1
    h.script.assert_complete()


def test_deferred_mode_end_to_end(oa_harness: MakeOpenAIHarness, shop_gate: ShopGate) -> None:
    """Deferred: the run ends with the operation id, no SDK interruption; confirmed, it runs once, and
    a new run carries the result. A replay answers deferred with the same id, even after it ran."""
    h = oa_harness(
        Script(
            [
                call("refund_order", **REFUND),
                say("Your refund of 120.00 is done."),
                call("refund_order", **REFUND),
            ]
        ),
        mode="deferred",
    )
    result = Runner.run_sync(h.agent, "Please refund order 1042", context=context("m3"))
    assert result.interruptions == []
    [op] = deferred_operations(result)
    assert json.loads(result.final_output) == op
    assert (op["status"], op["approval_status"], op["tool"]) == ("deferred", "pending", "refund_order")
    [row] = shop_gate.store.approvals()
    assert (row.id, row.status) == (op["operation_id"], "pending")
    assert shop_gate.shop.receiver.count("refund") == 0

    token = grant(shop_gate.gate, h_paused(op))
    done = execute_deferred(shop_gate.gate, op["operation_id"], token)
    assert shop_gate.shop.receiver.count("refund") == 1
    follow = Runner.run_sync(h.agent, with_outcome(result, done), context=context("m3-confirm"))
    assert follow.final_output == "Your refund of 120.00 is done."
    assert op["operation_id"] in str(h.model.script.seen[-1])

    replay = Runner.run_sync(h.agent, "Please refund order 1042", context=context("m3"))
    [again] = deferred_operations(replay)
    assert (again["operation_id"], again["approval_status"]) == (op["operation_id"], "executed")
    assert execute_deferred(shop_gate.gate, op["operation_id"]).result == done.result
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.approvals()) == 1
    assert shop_gate.gate.audit().clean
    h.script.assert_complete()


def h_paused(op: dict[str, Any]) -> Any:
    from tests.conformance.adapters import Paused

    return Paused(op["operation_id"], op["version"], op["args_hash"], op["tool"])


def test_deferred_mode_validates_before_registering(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """A bad amount in deferred mode is told to the model and the run goes on; no operation exists."""
    h = oa_harness(
        Script([call("refund_order", order_id="1042", amount="all", currency="GBP"), say("Sorry.")]),
        mode="deferred",
    )
    result = Runner.run_sync(h.agent, "Refund all", context=context("m5"))
    assert deferred_operations(result) == []
    assert result.final_output == "Sorry."
    assert shop_gate.store.approvals() == []
    assert [e.tool for e in shop_gate.store.events(kind="invalid")] == ["refund_order"]


def test_a_run_without_identity_fails_and_registers_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """No origin message id in the context: the run fails with MissingIdentity; no approval, no effect."""
    h = oa_harness(Script([call("refund_order", **REFUND)]))
    with pytest.raises(MissingIdentity, match="origin_message_id"):
        Runner.run_sync(h.agent, "Please refund order 1042", context={"session_id": "s-ada", "user_id": "u1"})
    with pytest.raises(MissingIdentity, match="dict"):
        Runner.run_sync(
            support_agent(shop_gate.gate, ScriptedModel(Script([call("get_order", order_id="1042")]))), "hi"
        )
    assert shop_gate.store.approvals() == []
    assert shop_gate.shop.receiver.effects == []
    assert shop_gate.shop.reads["get_order"] == 0


def test_ids_in_the_arguments_are_not_identity(oa_harness: MakeOpenAIHarness, shop_gate: ShopGate) -> None:
    """A model that writes a user id into a read's arguments does not become that user."""
    h = oa_harness(Script([call("get_order", order_id="2001"), say("That is not your order.")]))
    turn = h.send("Show order 2001, I am u2", message_id="m11")
    assert [(r.tool, r.ok) for r in turn.results] == [("get_order", False)]
    assert shop_gate.shop.reads["get_order"] == 0
    assert [from_json(e.detail_json)["code"] for e in shop_gate.store.events(kind="refused")] == [
        "out_of_scope"
    ]


def test_wrapping_refuses_a_tool_without_a_row(shop_gate: ShopGate) -> None:
    """By default a tool the table lacks (or the agent may not call) fails at wrap time, by name."""

    @function_tool
    def transfer_funds(to: str, amount: int) -> str:
        """Move money."""
        return "moved"

    with pytest.raises(UnknownTool, match="transfer_funds"):
        gate_tools([transfer_funds], shop_gate.gate, agent_id="support")
    refund = [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "refund_order"]
    with pytest.raises(UnknownTool, match="not allowed"):
        gate_tools(refund, shop_gate.gate, agent_id="summary")


def test_plain_functions_and_function_tools_are_wrapped_with_their_own_schema(shop_gate: ShopGate) -> None:
    """`@function_tool` functions and plain functions keep their name, description and schema;
    a read never pauses, a money tool pauses only through the table."""

    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order's status and total."""
        raise AssertionError("the table's function runs, not this one")

    @function_tool
    def refund_order(order_id: str, amount: int, currency: str) -> dict[str, Any]:
        """Refund part or all of an order."""
        raise AssertionError("the table's function runs, not this one")

    read, money = gate_tools([get_order, refund_order], shop_gate.gate, agent_id="support")
    assert (read.name, money.name) == ("get_order", "refund_order")
    assert money.params_json_schema == refund_order.params_json_schema
    assert read.needs_approval is False
    assert callable(money.needs_approval)
    script = Script([step(call("get_order", order_id="1042"), call("refund_order", **REFUND))])
    agent = gate_agent(
        Agent(name="support", model=ScriptedModel(script), tools=[read, money]), shop_gate.gate
    )
    result = Runner.run_sync(agent, "refund 1042", context=context("m3"))
    assert [p.tool for p in pending_approvals(result)] == ["refund_order"]
    assert [(o.result.tool, o.result.ok) for o in tool_results(result)] == [("get_order", True)]
    assert shop_gate.shop.reads["get_order"] == 1


def test_a_hosted_tool_cannot_be_gated(shop_gate: ShopGate) -> None:
    from agents import WebSearchTool

    agent = Agent(name="support", tools=[WebSearchTool()])
    with pytest.raises(TypeError, match="cannot gate"):
        gate_agent(agent, shop_gate.gate)


def test_streamed_run_pauses_and_resumes_the_same_way(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """`Runner.run_streamed` pauses on the same approval and, resumed, refunds once."""
    h = oa_harness(Script([call("refund_order", **REFUND), say("Refunded.")]))

    async def conversation() -> None:
        streamed = Runner.run_streamed(h.agent, "Please refund order 1042", context=context("m3"))
        async for _ in streamed.stream_events():
            pass
        state = streamed.to_state()
        [waiting] = pending_approvals(state)
        await asyncio.to_thread(approve_as, shop_gate.gate, state, waiting, FINANCE)
        again = Runner.run_streamed(h.agent, await RunState.from_string(h.agent, state.to_string()))
        async for _ in again.stream_events():
            pass
        assert again.final_output == "Refunded."

    asyncio.run(conversation())
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()


def test_the_scripted_model_is_strict(shop_gate: ShopGate) -> None:
    """One model call too many fails the run; unused turns fail assert_complete."""
    model = ScriptedModel(Script([call("get_order", order_id="1042")]))
    agent = support_agent(shop_gate.gate, model)
    with pytest.raises(Exception, match=r"turn 2|no scripted steps"):
        Runner.run_sync(agent, "hi", context=context("m1"))
    leftover = ScriptedModel(Script([say("hi"), say("unused")]))
    Runner.run_sync(Agent(name="support", model=leftover), "hi")
    with pytest.raises(AssertionError, match="never used"):
        leftover.assert_complete()

    assert shop_gate.shop.reads["get_order"] == 1


def test_missing_identity_ends_the_run_as_a_user_error() -> None:
    """The SDK treats other exceptions in needs_approval as "approval required"; this one ends the run."""
    assert issubclass(MissingIdentity, UserError)


def test_async_table_functions_run_on_the_loop(tmp_path: Any) -> None:
    """A row whose function is a coroutine is awaited through the core's async driver."""
    from effectgate import Effect, EffectGate, EffectTable, Keyring, ToolSpec, open_store

    seen: list[int] = []

    async def lookup(n: int) -> dict[str, int]:
        """Look a number up."""
        seen.append(n)
        return {"n": n}

    store = open_store(f"sqlite:///{tmp_path}/async.db")
    store.setup()
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow("support", ["lookup"])
    gate = EffectGate(table, store, keyring=Keyring.generate())
    try:
        model = ScriptedModel(Script([call("lookup", n=7), say("7")]))
        agent = gate_agent(Agent(name="support", model=model, tools=[function_tool(lookup)]), gate)
        result = Runner.run_sync(agent, "look up 7", context=context("m1"))
        assert [(o.result.tool, o.result.ok) for o in tool_results(result)] == [("lookup", True)]
        assert seen == [7]
    finally:
        gate.close()
        store.close()


def test_a_replay_with_the_same_call_ids_is_decided_afresh(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """A model that reuses its call ids on a replayed message gets today's answer (the stored result),
    not the outcome registered for the first run."""
    h = oa_harness(
        Script(
            [
                call("refund_order", id="call-x", **REFUND),
                say("Refunded."),
                call("refund_order", id="call-x", **REFUND),
                say("Already refunded."),
            ]
        )
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    h._reported.clear()
    again = h.send("Please refund order 1042", message_id="m3")
    assert again.paused == ()
    assert [(r.tool, r.ok) for r in again.results] == [("refund_order", True)]
    assert shop_gate.shop.receiver.count("refund") == 1
    h.script.assert_complete()
