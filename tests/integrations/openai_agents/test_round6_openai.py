"""Review round 6: the OpenAI Agents adapter on approved snapshots denied or lapsed before resume,
agents used as tools whose own run pauses or defers, streamed deferred runs, and `max_turns`.
Scripted models drive the SDK's real Runner; each test runs on SQLite and PostgreSQL
(`store_url`) and counts effects at the receiver (a counter in a tool)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, FunctionTool, Runner, RunResult, RunResultStreaming, RunState, Tool, function_tool

from effectgate import Approver, EffectGate, Grant, Keyring, money, read, write
from effectgate.rows import Row, gate_for
from effectgate.testing import EffectRecorder, FakeClock, Script, call, say
from effectgate_openai_agents import (
    approve_as,
    deferred_operations,
    execute_deferred,
    gate_agent,
    gate_of,
    native_tool,
    outcome_message,
    pending_approvals,
    with_outcome,
)
from effectgate_openai_agents._tools import Mode
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")
EFFECTS = {"get_order": read(), "refund_order": money("finance", subject="order_id")}
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)


class Shop:
    """A gated support agent (a read and a money tool) on `store_url`, on a fake clock."""

    def __init__(self, store_url: str, script: list[Any], **options: Any) -> None:
        self.receiver = EffectRecorder()
        self.clock = FakeClock()
        base = Agent(name="support", model=ScriptedModel(Script(script)), tools=self._tools())
        options.setdefault("keyring", Keyring.generate())
        self.agent = gate_agent(base, effects=EFFECTS, db=store_url, clock=self.clock, **options)
        self.gate: EffectGate = gate_of(self.agent)

    def _tools(self) -> list[Tool]:
        @function_tool
        def get_order(order_id: str) -> str:
            """Look up an order."""
            self.receiver.record("get_order", order_id=order_id)
            return f"order {order_id}: shipped"

        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        return [get_order, refund_order]

    def restore(self, snapshot: str) -> RunState[Any, Any]:
        return asyncio.run(RunState.from_string(self.agent, snapshot))

    def approved_snapshot(self, message_id: str = "m1") -> tuple[str, str]:
        paused = Runner.run_sync(self.agent, "Refund order 1042", context=context(message_id))
        state = self.restore(paused.to_state().to_string())
        [item] = pending_approvals(state)
        approve_as(self.gate, state, item, FINANCE)
        return state.to_string(), str(item.approval_id)


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def _outputs(result: RunResult, call_id: str) -> list[str]:
    return [o.content for o in tool_results(result) if o.call_id == call_id]


def test_an_approved_snapshot_denied_in_the_inbox_before_resume_refunds_nothing(
    shop: Callable[..., Shop],
) -> None:
    """The grant is attached to the stored state, then a second reviewer denies the approval in
    the inbox: resuming the state refunds nothing and the model is told the denial."""
    s = shop([REFUND, say("Not refunded.")])
    stored, approval_id = s.approved_snapshot()
    s.gate.deny(approval_id, approver=Approver("fred", "finance"), reason="duplicate request")
    done = Runner.run_sync(s.agent, s.restore(stored))
    assert s.receiver.count("refund") == 0
    row = s.gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "denied"
    assert _outputs(done, "c1") == ["Refused (denied): refund_order was denied: duplicate request"]


def test_an_approved_snapshot_resumed_after_its_grant_lapsed_refunds_nothing(
    shop: Callable[..., Shop],
) -> None:
    s = shop([REFUND, say("Not refunded.")])
    stored, _ = s.approved_snapshot()
    s.clock.advance(10 * 24 * 3600)
    done = Runner.run_sync(s.agent, s.restore(stored))
    assert s.receiver.count("refund") == 0
    [output] = _outputs(done, "c1")
    assert output.startswith("Refused (expired)")


# -- an agent used as a tool, whose own run pauses for approval


class Desk:
    """A support agent whose `billing` tool is a gated billing agent (`agent.as_tool`), on one
    gate: the billing agent's refund is a money row; the `billing` tool has the row `row`."""

    def __init__(self, store_url: str, row: Row, mode: Mode = "approval") -> None:
        self.receiver = EffectRecorder()

        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        refund = call("refund_order", id="c9", order_id="1042", amount=500)
        billing_model = ScriptedModel(Script([refund, say("Refunded 500 on 1042.")]))
        self.billing_base = Agent(name="billing", model=billing_model, tools=[refund_order])
        self.holder: dict[str, FunctionTool] = {}
        shape = self.billing_base.as_tool(tool_name="billing", tool_description="Billing desk.")

        async def billing(ctx: Any, arguments: str) -> Any:  # the gated billing agent's tool
            self.receiver.record("billing")
            return await self.holder["billing"].on_invoke_tool(ctx, arguments)

        row_tool = FunctionTool(
            name="billing",
            description="Billing desk.",
            params_json_schema=shape.params_json_schema,
            on_invoke_tool=billing,
        )
        effects = {"refund_order": money("finance", subject="order_id"), "billing": row}
        self.gate = gate_for(
            [native_tool(refund_order), native_tool(row_tool)],
            effects,
            agent_id="support",
            db=store_url,
            keyring=Keyring.generate(),
        )
        self.billing = gate_agent(self.billing_base, self.gate, agent_id="support", mode=mode)
        self.holder["billing"] = self.billing.as_tool(tool_name="billing", tool_description="Billing desk.")
        ask = call("billing", id="o1", input="refund 500 on order 1042")
        self.model = ScriptedModel(Script([ask, say("Billing refunded it.")]))

    def support(self) -> Agent[Any]:
        base = Agent(name="support", model=self.model, tools=[self.holder["billing"]])
        return gate_agent(base, self.gate, agent_id="support")


@pytest.fixture
def desk(store_url: str) -> Iterator[Callable[..., Desk]]:
    made: list[Desk] = []

    def make(row: Row, mode: Mode = "approval") -> Desk:
        made.append(Desk(store_url, row, mode))
        return made[-1]

    yield make
    for d in made:
        d.gate.close()


def test_an_agent_tool_on_a_read_row_runs_its_approved_refund_once(desk: Callable[[Row], Desk]) -> None:
    """The billing agent's refund pauses inside the support run; approved on the restored
    snapshot, the SDK calls the `billing` tool again to resume the billing run: the refund runs
    once, and a second resume of the same snapshot runs nothing more."""
    d = desk(read())
    support = d.support()
    paused = Runner.run_sync(support, "Refund order 1042", context=context("m1"))
    assert [i.name for i in paused.interruptions] == ["refund_order"]
    state = asyncio.run(RunState.from_string(support, paused.to_state().to_string()))
    [item] = pending_approvals(state)
    approve_as(d.gate, state, item, FINANCE)
    stored = state.to_string()
    done = Runner.run_sync(support, state)
    assert done.final_output == "Billing refunded it."
    assert d.receiver.count("refund", order_id="1042", amount=500) == 1
    Runner.run_sync(support, asyncio.run(RunState.from_string(support, stored)))
    assert d.receiver.count("refund") == 1


@pytest.mark.parametrize("row", [write(), money("finance")], ids=["write", "money"])
def test_an_agent_tool_whose_agent_can_pause_needs_a_read_row(desk: Callable[[Row], Desk], row: Row) -> None:
    """The SDK resumes a paused agent-as-tool by calling its tool again. On a write or gated row
    the gate had recorded that first call (which returned while the billing agent waited for
    approval) as done, and answers the second from its record: the billing run never resumes, the
    approved refund never runs (0 refunds) and the run pauses on it again, for ever. So
    `gate_agent` refuses an agent tool whose agent can pause unless its row is a read (the
    agent's own tools are each gated by their rows)."""
    d = desk(row)
    with pytest.raises(TypeError, match=r"tool 'billing' runs agent 'billing', which can pause"):
        d.support()


def test_a_native_reject_of_the_agent_tools_paused_refund_closes_its_approval(
    desk: Callable[[Row], Desk],
) -> None:
    """The billing agent's paused refund rejected with the SDK's own `state.reject(item)`: the
    refund never runs and its approval is closed (denied), not left waiting in the inbox."""
    d = desk(read())
    support = d.support()
    paused = Runner.run_sync(support, "Refund order 1042", context=context("m1"))
    state = asyncio.run(RunState.from_string(support, paused.to_state().to_string()))
    [item] = pending_approvals(state)
    state.reject(item.item, rejection_message="not eligible")
    Runner.run_sync(support, state)
    assert d.receiver.count("refund") == 0
    row = d.gate.store.get_approval(str(item.approval_id))
    assert row is not None
    assert row.status == "denied"


def test_a_streamed_deferred_run_carries_its_outcome_into_the_next_run(shop: Callable[..., Shop]) -> None:
    """Deferred mode on `Runner.run_streamed`: the refund is deferred, approved and executed once
    after the run; `with_outcome(result, done)` of the streamed result is the next run's input (the
    streamed run's history and the outcome), as for `Runner.run`."""
    s = shop([REFUND, say("Refunded.")], mode="deferred")

    async def streamed() -> RunResultStreaming:
        run = Runner.run_streamed(s.agent, "Refund order 1042", context=context("m1"))
        async for _ in run.stream_events():
            pass
        return run

    result = asyncio.run(streamed())
    [op] = deferred_operations(result)
    grant = s.gate.approve(op["operation_id"], version=op["version"], approver=FINANCE)
    assert isinstance(grant, Grant)
    done = execute_deferred(s.gate, op, grant)
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    items = with_outcome(result, done)
    assert items[: len(result.to_input_list())] == result.to_input_list()
    assert items[len(result.to_input_list()) :] == outcome_message(done)
    after = Runner.run_sync(s.agent, items, context=context("m2"))
    assert after.final_output == "Refunded."
    assert s.receiver.count("refund") == 1


def test_an_approved_refund_resumed_past_max_turns_runs_once_across_retries(
    shop: Callable[..., Shop],
) -> None:
    """The approved snapshot resumed with `max_turns=1`, then (the application retrying the same
    stored snapshot) with more turns: the refund runs once, the retry is told its stored result."""
    s = shop([REFUND, say("Refunded."), say("Refunded.")])
    stored, _ = s.approved_snapshot()
    Runner.run_sync(s.agent, s.restore(stored), max_turns=1)
    again = Runner.run_sync(s.agent, s.restore(stored), max_turns=5)
    assert _outputs(again, "c1") == ["refunded 500 on 1042"]
    assert s.receiver.count("refund") == 1


def test_an_agent_that_defers_its_refund_cannot_be_a_tool(desk: Callable[..., Desk]) -> None:
    """A billing agent gated in deferred mode, used as a tool: its refund's deferred answer ends
    only the billing run, inside the tool; the support run goes on, and `deferred_operations` of
    it lists nothing, so the application never learns the operation (it waits in the inbox, and
    nothing would execute it once approved). `gate_agent` refuses the set-up instead."""
    d = desk(read(), "deferred")
    with pytest.raises(TypeError, match=r"tool 'billing' runs agent 'billing', which defers gated calls"):
        d.support()
