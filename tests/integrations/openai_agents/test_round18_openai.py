"""Review round 18: the OpenAI Agents adapter. A gated agent used as a tool (`agent.as_tool`)
shares its caller's run context, and its own model answers were recorded over the caller's
record of the model response whose calls were still running (its gated calls then registered
apart, or with the agent's arguments). Each test reproduced the defect before its fix; scripted
models drive the SDK's real Runner, effects are counted at the receiver, and every test runs on
SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    AgentHooks,
    FunctionTool,
    RunContextWrapper,
    Runner,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    function_tool,
    tool_input_guardrail,
)

from effectgate import EffectGate, Keyring, money, read
from effectgate.rows import gate_for
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import gate_agent, native_tool
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

PARALLEL = "Refused (parallel_calls): 2 calls of refund_order in one step; none was registered."


class Answered(AgentHooks[Any]):
    """An agent's own hooks: `event` is set once its model has answered."""

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: Any) -> None:
        self.event.set()


class Desk:
    """A support agent in deferred mode holding a refund tool and a gated billing agent as a
    tool (a read row), on one gate; each agent's model answers as scripted. The refund's input
    guardrail (the application's own check) lets the support agent's refunds wait until the
    billing agent's model has answered (its own hooks' `on_llm_end`), as a slow check lets them."""

    def __init__(self, store_url: str, billing_script: list[Any], answer: Any) -> None:
        self.receiver = EffectRecorder()
        self.billing_answered = asyncio.Event()

        @tool_input_guardrail
        async def slow_check(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
            await asyncio.wait_for(self.billing_answered.wait(), 5)
            return ToolGuardrailFunctionOutput.allow()

        @function_tool(tool_input_guardrails=[slow_check])
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        @function_tool
        async def get_order(order_id: str) -> str:
            """Look up an order."""
            self.receiver.record("get_order", order_id=order_id)
            return f"order {order_id}: shipped"

        billing_base = Agent(
            name="billing",
            model=ScriptedModel(Script(billing_script)),
            hooks=Answered(self.billing_answered),
            tools=[get_order, refund_order],
        )
        holder: dict[str, FunctionTool] = {}
        shape = billing_base.as_tool(tool_name="billing", tool_description="Billing desk.")

        async def billing(ctx: Any, arguments: str) -> Any:
            return await holder["billing"].on_invoke_tool(ctx, arguments)

        row_tool = FunctionTool(
            name="billing",
            description="Billing desk.",
            params_json_schema=shape.params_json_schema,
            on_invoke_tool=billing,
        )
        refund = money("finance", subject="order_id")
        effects = {"refund_order": refund, "billing": read(), "get_order": read()}
        self.gate: EffectGate = gate_for(
            [native_tool(refund_order), native_tool(row_tool), native_tool(get_order)],
            effects,
            agent_id="support",
            db=store_url,
            keyring=Keyring.generate(),
        )
        billing_agent = gate_agent(billing_base, self.gate, agent_id="support")
        holder["billing"] = billing_agent.as_tool(tool_name="billing", tool_description="Billing desk.")
        base = Agent(
            name="support",
            model=ScriptedModel(Script([answer, say("Done."), say("-")])),
            tools=[holder["billing"], refund_order],
        )
        self.support = gate_agent(base, self.gate, agent_id="support", mode="deferred")


@pytest.fixture
def desk(store_url: str) -> Iterator[Callable[..., Desk]]:
    made: list[Desk] = []

    def make(billing_script: list[Any], answer: Any) -> Desk:
        made.append(Desk(store_url, billing_script, answer))
        return made[-1]

    yield make
    for d in made:
        d.gate.close()


def test_an_agent_tools_run_does_not_split_its_callers_parallel_gated_calls(
    desk: Callable[..., Desk],
) -> None:
    """One model answer calls the billing agent (a tool) and refund_order twice for one order,
    in deferred mode. Two calls of one gated tool in one answer register neither (the core's
    rule), but the billing agent's run recorded its own answer over the support agent's record
    of the answer (one context, one `turn` entry) before the refunds registered: each then
    registered alone, the second amending the first's approval to 700 (one pending approval,
    both calls told they were deferred under it). Now each refund finds its own answer's
    record: nothing is registered and both are told so."""
    look = call("get_order", id="b1", order_id="1042")
    answer = step(
        call("billing", id="o1", input="check order 1042"),
        call("refund_order", id="c1", order_id="1042", amount=500),
        call("refund_order", id="c2", order_id="1042", amount=700),
    )
    d = desk([look, say("Nothing to refund."), say("-")], answer)
    result = Runner.run_sync(d.support, "Check and refund order 1042", context=context("m1"))

    assert d.receiver.count("get_order") == 1
    assert d.gate.store.approvals() == []
    outputs = {o.call_id: o.content for o in tool_results(result)}
    assert outputs["c1"].startswith(PARALLEL)
    assert outputs["c2"].startswith(PARALLEL)
    assert d.receiver.count("refund") == 0


def test_a_callers_gated_call_is_registered_with_its_own_arguments_not_an_agent_tools(
    desk: Callable[..., Desk],
) -> None:
    """The support agent's answer calls the billing agent (a tool) and refunds order 1042 (500)
    as call "c1"; the billing agent's own answer refunds order 2000 (900) under the same call id
    (call ids are unique per response only: some providers number them). Before the fix the
    support agent's refund, registering after the billing agent's answer was recorded over its
    own, was registered with the billing agent's arguments: its deferred answer named the
    approval of the 2000 refund, and the 1042 refund the model asked for was never registered.
    Now each call registers its own arguments: two approvals, and the support agent's deferred
    operation is the 1042 refund. Nothing runs without approval."""
    theirs = call("refund_order", id="c1", order_id="2000", amount=900)
    answer = step(
        call("billing", id="o1", input="refund order 2000"),
        call("refund_order", id="c1", order_id="1042", amount=500),
    )
    d = desk([theirs, say("Refunded."), say("-")], answer)
    result = Runner.run_sync(d.support, "Refund orders 2000 and 1042", context=context("m1"))

    ops = {a.args_json: a.status for a in d.gate.store.approvals()}
    assert ops == {
        '{"amount":500,"order_id":"1042"}': "pending",
        '{"amount":900,"order_id":"2000"}': "pending",
    }
    operation = result.context_wrapper.context["effectgate"]["deferred"]["c1"]  # what c1 answered
    assert d.gate.card(operation["operation_id"]).args == {"order_id": "1042", "amount": 500}
    assert d.receiver.count("refund") == 0
