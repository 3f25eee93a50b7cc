"""Review round 14: the OpenAI Agents adapter. Each test reproduced a defect before its fix;
scripted models drive the SDK's real Runner and effects are counted at the receiver."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunState, Tool, function_tool
from agents._tool_invocation import tool_invocation_identity_and_scope

from effectgate import Approver, EffectGate, Keyring, money, read, send
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import STATE_KEY, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context

EFFECTS = {
    "get_order": read(),
    "refund_order": money("finance", subject="order_id"),
    "send_email": send("support_lead"),
}
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)
EMAIL = call("send_email", id="c2", to="ada@example.com", body="Your refund is on its way.")


class Shop:
    """A gated support agent (read, money and send tools) on `store_url`."""

    def __init__(self, store_url: str, script: list[Any], **options: Any) -> None:
        self.receiver = EffectRecorder()
        base = Agent(name="support", model=ScriptedModel(Script(script)), tools=self._tools())
        options.setdefault("keyring", Keyring.generate())
        self.agent = gate_agent(base, effects=EFFECTS, db=store_url, **options)
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

        @function_tool
        def send_email(to: str, body: str) -> str:
            """Email a customer."""
            self.receiver.record("email", to=to)
            return f"sent to {to}"

        return [get_order, refund_order, send_email]

    def restore(self, snapshot: str) -> RunState[Any, Any]:
        return asyncio.run(RunState.from_string(self.agent, snapshot))


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def _drop_interruption(data: dict[str, Any], call_id: str) -> None:
    """Remove the SDK's paused item for `call_id` from a snapshot (its call stays in the step)."""
    for holder in (data["current_step"]["data"], data["last_processed_response"]):
        holder["interruptions"] = [i for i in holder["interruptions"] if i["raw_item"]["call_id"] != call_id]
    owned = data["current_response_generated_item_ownership"]
    owned["interruptions"] = owned["interruptions"][: len(holder["interruptions"])]


def test_an_edited_turn_entry_never_registers_arguments_the_model_did_not_send(
    shop: Callable[..., Shop],
) -> None:
    """A turn with a refund of 500 and an email pauses both. The snapshot is edited: the unsigned
    `turn` entry now says the refund was for 99999, and the email's paused item is removed, so on
    resume the SDK asks the email's `needs_approval` again, which registers the turn's gated calls
    together from that entry. Before the fix the refund's waiting approval was amended (version 2)
    to a refund of 99999 that no model ever proposed, ready for a reviewer to approve in the inbox.
    A turn entry read back from a snapshot names no calls but its own: the refund's approval is
    still the model's 500 at version 1, and nothing ran."""
    s = shop([step(REFUND, EMAIL), say("Both are waiting for review."), say("Still waiting.")])
    paused = Runner.run_sync(s.agent, "Refund 1042 and email Ada", context=context("m1"))
    data = json.loads(paused.to_state().to_string())
    data["context"]["context"][STATE_KEY]["turn"]["c1"][1] = json.dumps({"order_id": "1042", "amount": 99999})
    _drop_interruption(data, "c2")
    state = s.restore(json.dumps(data))
    assert [p.tool for p in pending_approvals(state)] == ["refund_order"]

    Runner.run_sync(s.agent, state)

    [refund] = [a for a in s.gate.store.approvals() if a.tool == "refund_order"]
    assert (refund.status, refund.version, json.loads(refund.args_json)) == (
        "pending",
        1,
        {"order_id": "1042", "amount": 500},
    )
    assert s.receiver.count("refund") == 0
    assert s.receiver.count("email") == 0


def _edited_with_fingerprint(snapshot: str, old: str, new: str) -> str:
    """Every copy of the call's arguments edited, and the SDK's own (unkeyed) fingerprint of the
    call recomputed for the edited item, as anyone holding the snapshot can."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node.replace(old, new) if isinstance(node, str) else node

    data = walk(json.loads(snapshot))
    [item] = data["current_step"]["data"]["interruptions"]
    identity = tool_invocation_identity_and_scope(item["raw_item"], tool_name="refund_order")
    assert identity is not None
    data["context"]["tool_invocations"]["c1"]["fingerprint"] = identity[3]
    return json.dumps(data)


def test_a_native_approve_of_an_item_edited_with_its_fingerprint_approves_nothing(
    shop: Callable[..., Shop],
) -> None:
    """The model asked to refund 99999; the stored snapshot is edited so that its paused item
    shows 500, with the SDK's fingerprint of the call recomputed to match. The reviewer, shown
    500, approves natively (`state.approve(item)`, native_approver=fiona). Before the fix the gate
    recorded fiona approving the 99999 refund and left its live grant in the run context (a later
    call of the model's 99999 would have run on it). effectgate's record carries the SDK's
    fingerprint of the call it registered, sealed: no decision is recorded, no grant is held,
    the approval is still pending, and nothing ran."""
    s = shop(
        [call("refund_order", id="c1", order_id="1042", amount=99999), say("Done.")],
        native_approver=Approver("fiona", "finance"),
    )
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    [listed] = pending_approvals(paused)
    state = s.restore(
        _edited_with_fingerprint(paused.to_state().to_string(), '"amount":99999', '"amount":500')
    )
    [item] = state.get_interruptions()
    assert json.loads(str(item.arguments))["amount"] == 500  # what the reviewer is shown
    state.approve(item)

    result = Runner.run_sync(s.agent, state)

    assert s.receiver.effects == []
    with s.gate.store.transaction() as conn:
        assert s.gate.store.decisions(conn, listed.approval_id or "") == []
    row = s.gate.store.get_approval(listed.approval_id or "")
    assert row is not None
    assert row.status == "pending"
    assert result.context_wrapper.context[STATE_KEY]["grants"] == {}


@pytest.mark.parametrize("wrap", ["gate_agent", "gate_tools"])
def test_a_native_approver_that_is_neither_an_approver_nor_a_function_is_refused_when_wrapped(
    store_url: str, wrap: str
) -> None:
    """`native_approver="fiona"` (a name, not an `Approver`) was accepted when the agent was
    wrapped, and the first native `state.approve` ended the resumed run with a raw
    "'str' object is not callable". It is refused at once, with a `TypeError` naming the setting,
    before any store is used: no approval exists."""
    from effectgate.rows import gate_for
    from effectgate_openai_agents import gate_tools, native_tool

    receiver = EffectRecorder()

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return "refunded"

    effects = {"refund_order": money("finance", subject="order_id")}
    gate = gate_for(
        [native_tool(refund_order)], effects, agent_id="support", db=store_url, keyring=Keyring.generate()
    )
    try:
        base = Agent(name="support", tools=[refund_order])
        wrapping: Callable[[], Any] = (
            (lambda: gate_agent(base, gate, native_approver="fiona"))  # type: ignore[call-overload]
            if wrap == "gate_agent"
            else (lambda: gate_tools([refund_order], gate, agent_id="support", native_approver="fiona"))  # type: ignore[arg-type]
        )
        with pytest.raises(TypeError, match="native_approver"):
            wrapping()
        assert list(gate.store.approvals()) == []
        assert receiver.effects == []
    finally:
        gate.close()
