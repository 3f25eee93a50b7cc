"""Review round 3: read-back boundaries of the OpenAI Agents adapter, in the SDK's real Runner.

Stored `RunState` snapshots resumed twice (one after the other, or one while the other is still
running the approved call), a stale copy rejected after (or while) the other copy ran the call,
parallel calls of mixed effect classes across a resume (streamed too), what the model is told of
an approved call whose outcome is unknown and of an approved deferred operation replayed, and
the SDK's own approval of a snapshot whose arguments were edited. Each test runs on SQLite and
PostgreSQL (`store_url`); effects are counted at the receiver (a counter in each tool).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunResult, RunState, Tool, function_tool

from effectgate import Approver, EffectGate, Keyring, destructive, money, read, write
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import (
    approve_as,
    deferred_operations,
    gate_agent,
    gate_of,
    pending_approvals,
    reject,
)
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")
OTHER_FINANCE = Approver("frank", "finance")
Hook = Callable[[], None]


def _tools(receiver: EffectRecorder, during_refund: list[Hook]) -> list[Tool]:
    @function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        receiver.record("get_order", order_id=order_id)
        return f"order {order_id}: shipped"

    @function_tool
    def add_note(order_id: str, text: str) -> str:
        """Add a note to an order."""
        receiver.record("note", order_id=order_id, text=text)
        return f"noted on {order_id}"

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        for hook in list(during_refund):  # what happens elsewhere while the bank is called
            during_refund.remove(hook)
            hook()
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on {order_id}"

    @function_tool
    def delete_account(user: str) -> str:
        """Delete a customer account."""
        receiver.record("delete", user=user)
        return f"deleted {user}"

    return [get_order, add_note, refund_order, delete_account]


EFFECTS = {
    "get_order": read(),
    "add_note": write(subject="order_id"),
    "refund_order": money("finance", subject="order_id"),
    "delete_account": destructive("finance", subject="user"),
}


class Shop:
    """A gated support agent (read, write, money, destructive) on the store at `store_url`."""

    def __init__(self, store_url: str, script: list[Any], **options: Any) -> None:
        self.receiver = EffectRecorder()
        self.during_refund: list[Hook] = []
        self.model = ScriptedModel(Script(script))
        base = Agent(name="support", model=self.model, tools=_tools(self.receiver, self.during_refund))
        self.agent = gate_agent(base, effects=EFFECTS, db=store_url, keyring=Keyring.generate(), **options)
        self.gate: EffectGate = gate_of(self.agent)

    def restore(self, snapshot: str) -> RunState[Any, Any]:
        return asyncio.run(RunState.from_string(self.agent, snapshot))

    def resume(self, state: RunState[Any, Any]) -> RunResult:
        return Runner.run_sync(self.agent, state)

    def approved_snapshot(self, message_id: str = "m1") -> str:
        """The refund paused, approved through the gate (grant attached), and stored."""
        paused = Runner.run_sync(self.agent, "Refund order 1042", context=context(message_id))
        state = self.restore(paused.to_state().to_string())
        [item] = pending_approvals(state)
        approve_as(self.gate, state, item, FINANCE)
        return state.to_string()

    def decisions(self, approval_id: str) -> list[tuple[str, str]]:
        with self.gate.store.transaction() as conn:
            rows = self.gate.store.decisions(conn, approval_id)
        return [(d.approver_id, d.decision) for d in rows]


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


REFUND = call("refund_order", id="c1", order_id="1042", amount=500)
NOTE = call("add_note", id="c2", order_id="1042", text="customer called")
LOOKUP = call("get_order", id="c3", order_id="1042")
DELETE = call("delete_account", id="c5", user="u1")


def _outputs(result: RunResult, call_id: str) -> list[str]:
    return [o.content for o in tool_results(result) if o.call_id == call_id]


def test_a_turn_of_read_write_and_money_runs_each_once_across_a_snapshot_resumed_twice(
    shop: Callable[..., Shop],
) -> None:
    """One model turn reads, writes and refunds: the read and the write run at once, the refund
    pauses. The approved snapshot resumed twice runs the refund once, and never the write again."""
    s = shop([step(NOTE, LOOKUP, REFUND), say("Done."), say("Done again.")])
    paused = Runner.run_sync(s.agent, "Note it and refund", context=context("m1"))
    assert [i.call_id for i in paused.interruptions] == ["c1"]
    state = s.restore(paused.to_state().to_string())
    [item] = pending_approvals(state)
    approve_as(s.gate, state, item, FINANCE)
    stored = state.to_string()
    for _ in range(2):
        result = s.resume(s.restore(stored))
        assert _outputs(result, "c1") == ["refunded 500 on 1042"]
    assert s.receiver.count("note", order_id="1042", text="customer called") == 1
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    s.model.assert_complete()


def test_a_streamed_turn_of_write_and_money_runs_each_once(shop: Callable[..., Shop]) -> None:
    """The same with `Runner.run_streamed`, paused and resumed from the stored snapshot."""
    s = shop([step(NOTE, REFUND), say("Done.")])

    async def run() -> RunResult:
        streamed = Runner.run_streamed(s.agent, "Note it and refund", context=context("m1"))
        async for _ in streamed.stream_events():
            pass
        state = await RunState.from_string(s.agent, streamed.to_state().to_string())
        [item] = pending_approvals(state)
        await asyncio.to_thread(approve_as, s.gate, state, item, FINANCE)
        again = Runner.run_streamed(s.agent, state)
        async for _ in again.stream_events():
            pass
        return again  # type: ignore[return-value]

    result = asyncio.run(run())
    assert _outputs(result, "c1") == ["refunded 500 on 1042"]
    assert s.receiver.count("note") == 1
    assert s.receiver.count("refund") == 1


def test_native_approvals_of_a_money_and_a_destructive_call_in_one_turn(shop: Callable[..., Shop]) -> None:
    """A refund and an account deletion pause in one turn (beside a write). fiona's native approve
    of both runs the refund; the deletion waits for a second approver, and frank's native approve
    (on the restored snapshot of the next pause) runs it. Each effect happens once."""
    deciding = [FINANCE]
    s = shop(
        [step(REFUND, DELETE, NOTE), say("Done.")],
        native_approver=lambda run_context: deciding[0],
    )
    paused = Runner.run_sync(s.agent, "Refund and delete", context=context("m1"))
    state = s.restore(paused.to_state().to_string())
    for item in state.get_interruptions():
        state.approve(item)
    first = s.resume(state)
    assert [i.call_id for i in first.interruptions] == ["c5"]
    assert s.receiver.count("refund") == 1
    assert s.receiver.count("delete") == 0
    deciding[0] = OTHER_FINANCE
    state = s.restore(first.to_state().to_string())
    for item in state.get_interruptions():
        state.approve(item)
    second = s.resume(state)
    assert second.interruptions == []
    assert (s.receiver.count("refund"), s.receiver.count("delete"), s.receiver.count("note")) == (1, 1, 1)
    s.model.assert_complete()


def test_a_copy_resumed_while_the_refund_runs_is_not_told_it_was_refused(shop: Callable[..., Shop]) -> None:
    """The approved snapshot is resumed twice at once: while the first resume is calling the bank,
    a second copy is resumed (another request, another worker). The refund runs once; the second
    run must not tell the model "Refused" for a refund that is happening (the model would tell
    the customer it was refused): it is told the refund is running elsewhere, or its result."""
    s = shop([REFUND, say("Refunded."), say("Refunded too.")])
    stored = s.approved_snapshot()
    second: list[RunResult] = []
    s.during_refund.append(lambda: second.append(s.resume(s.restore(stored))))
    first = s.resume(s.restore(stored))
    assert _outputs(first, "c1") == ["refunded 500 on 1042"]
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    [told] = _outputs(second[0], "c1")
    assert not told.startswith("Refused")
    assert "not started again" in told


def test_an_approved_refund_that_raised_is_not_reported_as_refused(shop: Callable[..., Shop]) -> None:
    """The approved refund raises (a bank timeout: it may have happened). The model is told its
    outcome is unknown and that a person reconciles it, not "Refused" (nothing refused it), on
    the first resume and on a second resume of the same snapshot; it never runs again."""
    s = shop([REFUND, say("Checking."), say("Checking again.")])
    stored = s.approved_snapshot()

    def timeout() -> None:
        raise RuntimeError("bank timeout")

    s.during_refund.append(timeout)
    for _ in range(2):
        [told] = _outputs(s.resume(s.restore(stored)), "c1")
        assert not told.startswith("Refused")
        assert "outcome is unknown (RuntimeError: bank timeout)" in told
        assert "needs reconciliation" in told
    assert s.receiver.count("refund") == 0  # the hook raised before the receiver; no second attempt


@pytest.mark.parametrize("how", ["native", "effectgate"])
def test_a_stale_copy_rejected_after_the_refund_ran_tells_the_model_it_ran(
    shop: Callable[..., Shop], how: str
) -> None:
    """The stored snapshot is restored twice (two reviewers' requests). One copy is approved and
    resumed: the refund runs. The other copy is then rejected (`state.reject(item)`, or
    effectgate's `reject`) and resumed: nothing runs again, nothing is denied, and that run's
    model is told the refund's stored result, not that it was rejected (it would tell the
    customer the refund was refused while the money moved)."""
    s = shop([REFUND, say("Refunded."), say("Not refunded.")], native_approver=FINANCE)
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    stored = paused.to_state().to_string()
    first, second = s.restore(stored), s.restore(stored)
    [listed] = pending_approvals(first)
    first.approve(first.get_interruptions()[0])
    assert _outputs(s.resume(first), "c1") == ["refunded 500 on 1042"]
    if how == "native":
        second.reject(second.get_interruptions()[0], rejection_message="Not this order.")
    else:
        [item] = pending_approvals(second)
        reject(s.gate, second, item, approver=FINANCE, reason="Not this order.")
    [told] = _outputs(s.resume(second), "c1")
    assert told.endswith("Its result: refunded 500 on 1042")
    assert "Not this order" not in told
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    assert s.decisions(listed.approval_id or "") == [("fiona", "approve")]
    row = s.gate.store.get_approval(listed.approval_id or "")
    assert row is not None
    assert row.status == "executed"


def test_a_deferred_replay_after_approval_does_not_say_it_waits_for_review(shop: Callable[..., Shop]) -> None:
    """Deferred mode: the refund is deferred, then approved (not yet executed). The same message
    replayed answers deferred with the same operation, approved: the model must not be told it
    is still waiting for the finance team's review (it would tell the customer so)."""
    s = shop([REFUND, REFUND], mode="deferred")
    [op] = deferred_operations(Runner.run_sync(s.agent, "Refund order 1042", context=context("m1")))
    s.gate.approve(op["operation_id"], version=op["version"], approver=FINANCE)
    [again] = deferred_operations(Runner.run_sync(s.agent, "Refund order 1042", context=context("m1")))
    assert (again["operation_id"], again["approval_status"]) == (op["operation_id"], "approved")
    assert "waiting for approval" not in again["message"]
    assert "pending review" not in again["message"]
    assert s.receiver.count("refund") == 0


def _edit_arguments(snapshot: str, old: str, new: str) -> str:
    """Every copy of the call's arguments in the snapshot edited (and the SDK's fingerprints of
    its calls dropped, as a holder of the snapshot can)."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node.replace(old, new) if isinstance(node, str) else node

    data = walk(json.loads(snapshot))
    data["context"].pop("tool_invocations", None)
    return json.dumps(data)


def test_a_native_approve_of_an_edited_snapshot_records_no_approval(shop: Callable[..., Shop]) -> None:
    """The model asked to refund 99999; the stored snapshot is edited so that its paused item
    shows 500. The reviewer, shown 500, approves natively (`state.approve(item)`, with
    native_approver=fiona). Nothing runs, but the gate must not record fiona as approving the
    99999 refund she was never shown, nor hold a live grant for it."""
    s = shop(
        [call("refund_order", id="c1", order_id="1042", amount=99999), say("Done.")],
        native_approver=FINANCE,
    )
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    [listed] = pending_approvals(paused)
    state = s.restore(_edit_arguments(paused.to_state().to_string(), '"amount":99999', '"amount":500'))
    [item] = state.get_interruptions()
    assert json.loads(str(item.arguments))["amount"] == 500  # what the reviewer is shown
    state.approve(item)
    s.resume(state)
    assert s.receiver.effects == []
    assert s.decisions(listed.approval_id or "") == []
    row = s.gate.store.get_approval(listed.approval_id or "")
    assert row is not None
    assert row.status == "pending"


def test_a_stale_copy_rejected_while_the_refund_runs_is_told_it_runs(shop: Callable[..., Shop]) -> None:
    """As above, but the second copy is rejected (`state.reject(item)`) and resumed while the
    first resume is still calling the bank. The refund runs once and is not denied; the second
    run's model is told the refund is running, not that it was rejected."""
    s = shop([REFUND, say("Refunded."), say("Not refunded.")], native_approver=FINANCE)
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    stored = paused.to_state().to_string()
    first, second = s.restore(stored), s.restore(stored)
    [listed] = pending_approvals(first)
    first.approve(first.get_interruptions()[0])
    later: list[RunResult] = []

    def reject_the_other_copy() -> None:
        second.reject(second.get_interruptions()[0], rejection_message="Not this order.")
        later.append(s.resume(second))

    s.during_refund.append(reject_the_other_copy)
    assert _outputs(s.resume(first), "c1") == ["refunded 500 on 1042"]
    [told] = _outputs(later[0], "c1")
    assert "is being run for this request elsewhere" in told
    assert "Not this order" not in told
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    assert s.decisions(listed.approval_id or "") == [("fiona", "approve")]
