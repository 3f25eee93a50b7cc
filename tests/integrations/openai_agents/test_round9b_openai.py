"""Review round 9b: the OpenAI Agents adapter on edited snapshot content (its `turn` entry) and
on stored deferred operations that are not well formed. Each refusal is the adapter's typed
error; nothing runs (a counter in the tool) and the approval's stored state is unchanged. Each
test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunState, Tool, function_tool

from effectgate import Approver, EffectGate, Keyring, money, read
from effectgate.testing import EffectRecorder, FakeClock, Script, call, say
from effectgate_openai_agents import (
    STATE_KEY,
    TamperedState,
    approve_as,
    deferred_operations,
    execute_deferred,
    gate_agent,
    gate_of,
    pending_approvals,
)
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context

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


# what an edited snapshot's `turn` entry may hold for the paused call: not a [tool, arguments] pair
# of strings
BAD_TURNS = {
    "a-string": "refund_order",
    "a-triple": ["refund_order", "{}", "x"],
    "a-number": 7,
    "arguments-not-a-string": ["refund_order", {"order_id": "1042", "amount": 5}],
    "tool-not-a-string": [["refund_order"], "{}"],
    "arguments-a-number": ["refund_order", 5],
}


def test_an_edited_turn_entry_refuses_the_next_gated_call(store_url: str) -> None:
    """`gate_tools` on an agent of the application's (no `gate_agent` hooks, so nothing rewrites
    the `turn` entry before a call reads it): a snapshot edited to carry a malformed entry for
    the model's next call is refused with `TamperedState` naming it; that call never runs."""
    from agents.exceptions import UserError

    from effectgate.rows import gate_for
    from effectgate_openai_agents import gate_tools, native_tool

    receiver = EffectRecorder()

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on {order_id}"

    gate = gate_for(
        [native_tool(refund_order)],
        {"refund_order": money("finance", subject="order_id")},
        agent_id="support",
        db=store_url,
        keyring=Keyring.generate(),
    )
    try:
        tools = gate_tools([refund_order], gate, agent_id="support")
        for n, entry in enumerate(BAD_TURNS.values()):
            second = call("refund_order", id="c2", order_id="1043", amount=5)
            script = Script([REFUND, second, say("Refunded.")])
            agent = Agent(name="support", model=ScriptedModel(script), tools=tools)
            paused = Runner.run_sync(agent, "Refund two orders", context=context(f"m{n}"))
            data = json.loads(paused.to_state().to_string())
            data["context"]["context"][STATE_KEY]["turn"] = {"c2": entry}
            state = asyncio.run(RunState.from_string(agent, json.dumps(data)))
            [item] = pending_approvals(state)
            approve_as(gate, state, item, FINANCE)
            with pytest.raises(UserError) as raised:
                Runner.run_sync(agent, state)
            cause: BaseException | None = raised.value
            while cause is not None and not isinstance(cause, TamperedState):
                cause = cause.__cause__ or cause.__context__
            assert isinstance(cause, TamperedState), repr(raised.value)
            assert "turn" in str(cause)
            assert receiver.count("refund", order_id="1043") == 0
            assert [c for c in gate.pending() if c.args.get("order_id") == "1043"] == []
        assert receiver.count("refund", order_id="1042") == len(BAD_TURNS)  # each approved one, once
    finally:
        gate.close()


# -- execute_deferred on a stored operation that is not well formed


def _deferred(shop: Callable[..., Shop]) -> tuple[Shop, dict[str, Any]]:
    s = shop([REFUND, say("Pending review.")], mode="deferred")
    result = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    [op] = deferred_operations(result)
    return s, dict(op)  # as the application stores it (JSON): a plain dict


BAD_OPERATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "version-not-a-number": lambda op: {**op, "version": "two"},
    "version-a-list": lambda op: {**op, "version": [1]},
    "no-operation_id": lambda op: {k: v for k, v in op.items() if k != "operation_id"},
}


@pytest.mark.parametrize("edit", BAD_OPERATIONS.values(), ids=list(BAD_OPERATIONS))
def test_execute_deferred_refuses_a_malformed_stored_operation(
    shop: Callable[..., Shop], edit: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    s, op = _deferred(shop)
    approval_id = str(op["operation_id"])
    grant = s.gate.approve(approval_id, version=op["version"], approver=FINANCE)
    before = s.gate.store.get_approval(approval_id)
    with pytest.raises(TamperedState, match="operation"):
        execute_deferred(s.gate, edit(op), grant)
    assert s.receiver.count("refund") == 0
    after = s.gate.store.get_approval(approval_id)
    assert after is not None
    assert before is not None
    assert (after.status, after.version) == (before.status, before.version) == ("approved", 1)
    assert s.gate.result(approval_id) is None
    # the grant is not spent: the stored operation as the tool answered it still runs, once
    done = execute_deferred(s.gate, op, grant)
    assert done.approval_id == approval_id
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1


# -- a snapshot whose record of the paused call names its approval with something not a string


@pytest.mark.parametrize("approval_id", [["a1"], {"id": "a1"}], ids=["a-list", "a-dict"])
def test_a_snapshot_with_an_unhashable_approval_id_loads_and_is_refused(
    shop: Callable[..., Shop], approval_id: Any
) -> None:
    """`RunState.from_string` evaluates the gated tools' `is_enabled`, where effectgate first looks
    at the restored state: an edited record must not break loading (the SDK redacts the error to
    "Error details are redacted."); it is shown unverified and refused like any edited record."""
    s = shop([REFUND, say("Refunded.")])
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    [paused_item] = paused.interruptions
    data = json.loads(paused.to_state().to_string())
    record = data["context"]["context"][STATE_KEY]["approvals"]["c1"]
    real_id = record["approval_id"]
    record["approval_id"] = approval_id
    state = s.restore(json.dumps(data))
    [item] = pending_approvals(state)
    assert (item.verified, item.call_id) == (False, paused_item.raw_item.call_id)  # type: ignore[union-attr]
    with pytest.raises(TamperedState):
        approve_as(s.gate, state, item, FINANCE)
    done = Runner.run_sync(s.agent, state)
    assert len(done.interruptions) == 1
    assert s.receiver.count("refund") == 0
    row = s.gate.store.get_approval(real_id)
    assert row is not None
    assert (row.status, row.version) == ("pending", 1)
