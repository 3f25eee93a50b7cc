"""Review round 2 of the OpenAI Agents and smolagents adapters, inside the real frameworks'
runtimes: each test reproduced a defect before its fix."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Executed, Grant, Refused
from effectgate.testing import Script, call, say, step
from effectgate_smolagents import Approve, AwaitingApproval, Deny, Finished
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, ShopGate
from tests.integrations.smolagents._harness import support_agent


def _status(shop_gate: ShopGate, approval_id: str) -> str:
    row = shop_gate.store.get_approval(approval_id)
    assert row is not None
    return row.status


# -- smolagents


def test_smolagents_deny_of_an_executed_approval_keeps_the_other_decisions(shop_gate: ShopGate) -> None:
    """The run paused on the email and the refund; a first resume ran the refund. A later resume
    of the same record denies both: the refund's denial is answered with its stored result (it
    ran, once), the email's denial is recorded, and the run goes on instead of raising out of
    `resume` with the email half decided."""
    script = Script(
        [step(call("send_email", **EMAIL), call("refund_order", **REFUND)), say("Refunded."), say("Done.")]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund 1042 and email me", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, AwaitingApproval)
    by_tool = {p.card.tool: p for p in out.pending}
    refund, email = by_tool["refund_order"], by_tool["send_email"]
    grant = shop_gate.gate.approve(refund.approval_id, version=refund.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gated.resume(out, {refund.approval_id: Approve(grant)}), Finished)
    assert shop_gate.shop.receiver.count("refund") == 1

    done = gated.resume(
        out,
        {email.approval_id: Deny(SUPPORT_LEAD, "no email"), refund.approval_id: Deny(FINANCE, "too late")},
    )

    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 0
    assert (_status(shop_gate, refund.approval_id), _status(shop_gate, email.approval_id)) == (
        "executed",
        "denied",
    )
    decided = dict(done.decided)
    assert isinstance(decided[refund.approval_id], Executed)
    assert isinstance(decided[email.approval_id], Refused)


def test_smolagents_deny_of_an_expired_approval_is_answered_and_the_run_goes_on(shop_gate: ShopGate) -> None:
    """Both paused calls expired before the reviewer denied them: the resume answers each denial
    with "expired" (nothing runs, the records stay expired) and continues the run, instead of
    raising `ApprovalExpired` out of `resume`."""
    script = Script([step(call("send_email", **EMAIL), call("refund_order", **REFUND)), say("Nothing done.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund 1042 and email me", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, AwaitingApproval)
    by_tool = {p.card.tool: p for p in out.pending}
    shop_gate.clock.advance(3 * 86400)

    done = gated.resume(
        out,
        {
            by_tool["send_email"].approval_id: Deny(SUPPORT_LEAD, "no email"),
            by_tool["refund_order"].approval_id: Deny(FINANCE, "no refund"),
        },
    )

    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.receiver.count("email") == 0
    assert sorted(_status(shop_gate, p.approval_id) for p in out.pending) == ["expired", "expired"]
    assert {getattr(o, "code", None) for _, o in done.decided} == {"expired"}


# -- OpenAI Agents


def test_openai_a_failed_step_registration_is_not_served_again(shop_gate: ShopGate) -> None:
    """The store fails while a turn's two gated calls register (a trigger refuses the insert): the
    run fails. Once the store works again, the same message with the same call ids registers
    afresh and pauses, instead of getting the cached failure back for ever."""
    import sqlalchemy as sa
    from agents import Runner

    from effectgate_openai_agents import pending_approvals
    from effectgate_openai_agents.testing import ScriptedModel as OAScriptedModel
    from tests.integrations.openai_agents._harness import context
    from tests.integrations.openai_agents._harness import support_agent as oa_support_agent

    turn = step(call("refund_order", id="c-refund", **REFUND), call("send_email", id="c-email", **EMAIL))
    agent = oa_support_agent(shop_gate.gate, OAScriptedModel(Script([turn, turn])))
    with shop_gate.store.transaction() as conn:
        conn.execute(
            sa.text(
                "CREATE TRIGGER eg_review_fail BEFORE INSERT ON eg_approvals "
                "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
            )
        )
    with pytest.raises(Exception, match="disk on fire"):
        Runner.run_sync(agent, "Refund 1042 and email me", context=context("m3"))
    assert shop_gate.store.approvals() == []
    with shop_gate.store.transaction() as conn:
        conn.execute(sa.text("DROP TRIGGER eg_review_fail"))

    again = Runner.run_sync(agent, "Refund 1042 and email me", context=context("m3"))

    assert sorted(p.tool for p in pending_approvals(again)) == ["refund_order", "send_email"]
    assert sorted((r.tool, r.status) for r in shop_gate.store.approvals()) == [
        ("refund_order", "pending"),
        ("send_email", "pending"),
    ]


def test_openai_an_outcome_for_a_call_the_sdk_skipped_is_not_given_to_a_later_call(
    shop_gate: ShopGate,
) -> None:
    """A tool input guardrail rejects a gated call after `needs_approval` answered it (the
    refund's stored result, on a replay of message m3): the SDK never invokes the tool. A later
    turn of m3 whose model reuses the call id for another refund pauses, is approved and runs that
    refund, instead of being given the first refund's result with nothing run."""
    import asyncio
    import dataclasses

    from agents import Agent, Runner, RunState, ToolGuardrailFunctionOutput, tool_input_guardrail

    from effectgate_openai_agents import approve_as, gate_agent, pending_approvals, table_tools
    from effectgate_openai_agents.testing import ScriptedModel as OAScriptedModel
    from tests.integrations.openai_agents._harness import context

    @tool_input_guardrail
    def frozen(data: Any) -> ToolGuardrailFunctionOutput:
        if data.context.context.get("frozen"):
            return ToolGuardrailFunctionOutput.reject_content("refunds are frozen")
        return ToolGuardrailFunctionOutput.allow()

    other = {**REFUND, "order_id": "1043", "amount": 3500}
    script = Script(
        [
            call("refund_order", id="c1", **REFUND),
            say("Refunded."),
            call("refund_order", id="c1", **REFUND),
            say("Frozen."),
            call("refund_order", id="c1", **other),
            say("Refunded 1043."),
        ]
    )
    tools = [
        dataclasses.replace(t, tool_input_guardrails=[frozen]) if t.name == "refund_order" else t
        for t in table_tools(shop_gate.gate, agent_id="support")
    ]
    base = Agent(name="support", model=OAScriptedModel(script), tools=tools)
    agent = gate_agent(base, shop_gate.gate, agent_id="support")

    async def approved_run(ctx: dict[str, Any]) -> Any:
        paused = await Runner.run(agent, "Please refund", context=ctx)
        state = paused.to_state()
        [waiting] = pending_approvals(state)
        await asyncio.to_thread(approve_as, shop_gate.gate, state, waiting, FINANCE)
        return await Runner.run(agent, await RunState.from_string(agent, state.to_string()))

    async def conversation() -> None:
        await approved_run(context("m3"))
        await Runner.run(agent, "Please refund", context={**context("m3"), "frozen": True})
        await approved_run(context("m3"))

    asyncio.run(conversation())
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert shop_gate.shop.receiver.count("refund", order_id="1043") == 1
    script.assert_complete()


def test_openai_a_step_a_failed_run_left_half_taken_is_not_served_to_a_later_response(
    shop_gate: ShopGate,
) -> None:
    """One tool at a time: the refund registers the turn's gated calls (refund and email), then a
    read's guardrail trips and the run fails before the email's turn. A reviewer denies the email
    from the inbox. The same message again, same call ids: the email is told it was denied (the
    gate's answer now), not paused again on the outcome the failed run left cached."""
    import asyncio
    import dataclasses

    from agents import (
        Agent,
        RunConfig,
        Runner,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrailTripwireTriggered,
        tool_input_guardrail,
    )
    from agents.run_config import ToolExecutionConfig

    from effectgate_openai_agents import gate_agent, pending_approvals, table_tools
    from effectgate_openai_agents.testing import ScriptedModel as OAScriptedModel
    from tests.integrations.openai_agents._harness import context, tool_results

    @tool_input_guardrail
    def trip(data: Any) -> ToolGuardrailFunctionOutput:
        if data.context.context.get("trip"):
            return ToolGuardrailFunctionOutput.raise_exception()
        return ToolGuardrailFunctionOutput.allow()

    turn = step(
        call("refund_order", id="c1", **REFUND),
        call("get_order", id="c2", order_id="1042"),
        call("send_email", id="c3", **EMAIL),
    )
    tools = [
        dataclasses.replace(t, tool_input_guardrails=[trip]) if t.name == "get_order" else t
        for t in table_tools(shop_gate.gate, agent_id="support")
    ]
    base = Agent(name="support", model=OAScriptedModel(Script([turn, turn])), tools=tools)
    agent = gate_agent(base, shop_gate.gate, agent_id="support")
    one_at_a_time = RunConfig(tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1))

    async def conversation() -> Any:
        with pytest.raises(ToolInputGuardrailTripwireTriggered):
            await Runner.run(agent, "x", context={**context("m3"), "trip": True}, run_config=one_at_a_time)
        [email] = [a for a in shop_gate.store.approvals() if a.tool == "send_email"]
        await asyncio.to_thread(shop_gate.gate.deny, email.id, approver=SUPPORT_LEAD, reason="no mail")
        return await Runner.run(agent, "x", context=context("m3"), run_config=one_at_a_time)

    again = asyncio.run(conversation())

    assert [p.tool for p in pending_approvals(again)] == ["refund_order"]
    assert [(r.tool, r.ok) for r in tool_results(again) if r.tool == "send_email"] == [("send_email", False)]
    assert shop_gate.shop.receiver.count("email") == 0
