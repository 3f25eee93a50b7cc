"""Review round 17: the OpenAI Agents adapter. A copy of a paused run state rejected after another
copy's approved call ended with an unknown outcome (`needs_reconciliation`); an agent tool reached
through a table row's function; a model's call id that is not text. Each test reproduced a
defect before its fix; scripted models drive the SDK's real Runner, effects are counted at the
receiver, and every test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunResult, RunState, Tool, function_tool
from agents.exceptions import ModelBehaviorError
from agents.items import ToolCallOutputItem

from effectgate import Approver, EffectGate, Keyring, money, read
from effectgate.rows import gate_for
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import approve_as, gate_agent, gate_of, native_tool, pending_approvals, reject
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context

FINANCE = Approver("fiona", "finance")
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)
UNKNOWN = "Outcome unknown (needs_reconciliation): "


class FlakyShop:
    """A gated refund tool whose provider resets the connection after taking the refund: the
    effect happened (counted at the receiver), its outcome is unknown to the gate."""

    def __init__(self, store_url: str, script: list[Any], **options: Any) -> None:
        self.receiver = EffectRecorder()
        base = Agent(name="support", model=_model(script), tools=self._tools())
        self.agent = gate_agent(
            base,
            effects={"refund_order": money("finance", subject="order_id")},
            db=store_url,
            keyring=Keyring.generate(),
            **options,
        )
        self.gate: EffectGate = gate_of(self.agent)

    def _tools(self) -> list[Tool]:
        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            raise ConnectionResetError("the provider hung up after taking the refund")

        return [refund_order]

    def restore(self, snapshot: str) -> RunState[Any, Any]:
        return asyncio.run(RunState.from_string(self.agent, snapshot))

    def paused_twice(self) -> tuple[RunState[Any, Any], RunState[Any, Any]]:
        """Two copies of one paused refund's snapshot; the first is approved and resumed, and its
        refund raises (needs_reconciliation)."""
        paused = Runner.run_sync(self.agent, "Refund 1042", context=context("m1"))
        snapshot = paused.to_state().to_string()
        first, second = self.restore(snapshot), self.restore(snapshot)
        [listed] = pending_approvals(first)
        approve_as(self.gate, first, listed, FINANCE)
        Runner.run_sync(self.agent, first)
        assert self.receiver.count("refund") == 1
        return first, second


def _model(script: list[Any]) -> ScriptedModel:
    return ScriptedModel(Script(script))


def _output(result: RunResult, call_id: str) -> str:
    [out] = [
        str(i.output)
        for i in result.new_items
        if isinstance(i, ToolCallOutputItem)
        and getattr(i.raw_item, "get", lambda _: None)("call_id") == call_id
    ]
    return out


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., FlakyShop]]:
    made: list[FlakyShop] = []

    def make(script: list[Any], **options: Any) -> FlakyShop:
        made.append(FlakyShop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def test_reject_of_a_copy_whose_call_ran_with_an_unknown_outcome_tells_the_model_so(
    shop: Callable[..., FlakyShop],
) -> None:
    """The first copy's refund ran and raised (outcome unknown). The reviewer then rejects the
    refund in the second copy with `reject(...)`. Before the fix `reject` raised `AlreadyDecided`
    ("executing") and left the SDK item paused, although it promises that a call another copy
    already ran is not denied and the model is told what happened. Now nothing is denied (the
    approval's record is unchanged, no deny decision), the SDK item is rejected with the
    "Outcome unknown" answer, and the refund ran once."""
    s = shop([REFUND, say("Checking."), say("It may have gone through.")])
    _, second = s.paused_twice()
    [listed] = pending_approvals(second)

    refused = reject(s.gate, second, listed, approver=FINANCE, reason="not this one")
    resumed = Runner.run_sync(s.agent, second)

    assert refused is None
    assert resumed.interruptions == []
    assert _output(resumed, "c1").startswith(UNKNOWN)
    [row] = s.gate.store.approvals()
    assert row.status == "approved"
    assert [e.kind for e in s.gate.store.events(approval_id=row.id) if e.kind == "denied"] == []
    assert s.receiver.count("refund") == 1


def test_a_native_reject_of_a_copy_whose_call_ran_with_an_unknown_outcome_says_outcome_unknown(
    shop: Callable[..., FlakyShop],
) -> None:
    """As above, rejected with the SDK's own `state.reject(item)`. Before the fix the model was told
    the refund "is being run for this request elsewhere ... its result is not known yet", as if
    another resume were still running it: the run had ended, needing reconciliation. The model
    is told the outcome is unknown (as a replay of the message is), nothing is denied, and the
    refund ran once."""
    s = shop([REFUND, say("Checking."), say("It may have gone through.")], native_approver=FINANCE)
    _, second = s.paused_twice()
    [listed] = pending_approvals(second)

    second.reject(listed.item)
    resumed = Runner.run_sync(s.agent, second)

    assert _output(resumed, "c1").startswith(UNKNOWN)
    [row] = s.gate.store.approvals()
    assert row.status == "approved"
    assert s.receiver.count("refund") == 1


def test_an_agent_tools_row_function_reaching_an_ungated_agent_is_refused_at_gate_agent(
    store_url: str,
) -> None:
    """The full-table path (`gate_agent(agent, gate)`): the gate runs each row's function, not the
    tool object the agent holds. A table built the natural way for an agent tool
    (`native_tool(billing_base.as_tool(...))`, made before the billing agent could be gated on
    the gate that table builds) has a `billing` row whose function runs the UNGATED billing
    agent, while the support agent holds `gate_agent(billing_base, gate).as_tool(...)`. Before
    the fix `gate_agent` checked only the tool it was given and accepted it; the run then ran
    the billing agent's refund with no approval at all (1 refund, no approval recorded). The
    row's function reaches an agent effectgate has not gated: `TypeError` at `gate_agent`,
    nothing runs."""
    receiver = EffectRecorder()

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on {order_id}"

    billing_model = _model([REFUND, say("Refunded 500 on 1042.")])
    billing_base = Agent(name="billing", model=billing_model, tools=[refund_order])
    row_tool = billing_base.as_tool(tool_name="billing", tool_description="Billing desk.")
    effects = {"refund_order": money("finance", subject="order_id"), "billing": read()}
    gate = gate_for(
        [native_tool(refund_order), native_tool(row_tool)],
        effects,
        agent_id="support",
        db=store_url,
        keyring=Keyring.generate(),
    )
    try:
        billing = gate_agent(billing_base, gate, agent_id="support")
        held = billing.as_tool(tool_name="billing", tool_description="Billing desk.")
        ask = call("billing", id="o1", input="refund 500 on order 1042")
        base = Agent(name="support", model=_model([ask, say("Done.")]), tools=[held])

        def wrap_and_run() -> None:
            support = gate_agent(base, gate, agent_id="support")
            Runner.run_sync(support, "Refund order 1042", context=context("m1"))

        with pytest.raises(
            TypeError, match=r"tool 'billing' reaches agent 'billing', which effectgate has not"
        ):
            wrap_and_run()
        assert receiver.count("refund") == 0
    finally:
        gate.close()


@pytest.mark.parametrize("gated_sibling", [False, True], ids=["alone", "with_a_gated_sibling"])
def test_a_call_id_that_is_not_text_registers_nothing(
    shop: Callable[..., FlakyShop], gated_sibling: bool
) -> None:
    """A model (a Chat Completions provider, say) answers with a refund whose call id holds a lone
    surrogate, which no database or snapshot keeps. Before the fix the gate registered the refund
    (a pending approval, holding order 1042's subject, in the reviewers' inbox) and the run then
    crashed sealing the paused call's record: no run could ever resume it. The answer is refused
    before anything of it registers (`ModelBehaviorError`, as the SDK refuses a reused call id):
    no approval, no refund; with a well-formed gated sibling in the same answer, neither
    registers."""
    calls = [call("refund_order", id="c\ud800", order_id="1042", amount=500)]
    if gated_sibling:
        calls.insert(0, call("refund_order", id="c0", order_id="1043", amount=700))
    s = shop([step(*calls), say("Done.")])

    with pytest.raises(ModelBehaviorError, match="call id"):
        Runner.run_sync(s.agent, "Refund 1042", context=context("m1"))

    assert s.gate.store.approvals() == []
    assert s.receiver.count("refund") == 0
