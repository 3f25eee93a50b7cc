"""The SDK's own `state.approve(item)` / `state.reject(item)` are bridged to the gate, not bypassed.

A native reject always closes effectgate's approval (subject free, reason recorded); a native
approve runs only as the application's configured `native_approver`, through `gate.approve`.
Each test runs on SQLite and PostgreSQL (`store_url`), effects counted at the receiver.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, Runner, RunResult, RunState, Tool, function_tool
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE

from effectgate import Approver, CallContext, EffectGate, Keyring, Pending, destructive, money, read
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import TamperedState, approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import REFUND as SHOP_REFUND
from tests.conformance.adapters import ShopGate

from ._harness import context, tamper_user, tool_results
from .conftest import MakeOpenAIHarness

FINANCE = Approver("fiona", "finance")
OTHER_FINANCE = Approver("frank", "finance")
SUPPORT = Approver("sam", "support_lead")


def refund_tools(receiver: EffectRecorder) -> list[Tool]:
    @function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        receiver.record("get_order", order_id=order_id)
        return f"order {order_id}: shipped"

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on {order_id}"

    @function_tool
    def delete_account(user: str) -> str:
        """Delete a customer account."""
        receiver.record("delete", user=user)
        return f"deleted {user}"

    return [get_order, refund_order, delete_account]


EFFECTS = {
    "get_order": read(),
    "refund_order": money("finance", subject="order_id"),
    "delete_account": destructive("finance", subject="user"),
}


class Shop:
    """A gated support agent on the store at `store_url`, and the receiver of its effects."""

    def __init__(self, store_url: str, script: list[Any], **options: Any) -> None:
        self.receiver = EffectRecorder()
        self.model = ScriptedModel(Script(script))
        base = Agent(name="support", model=self.model, tools=refund_tools(self.receiver))
        self.agent = gate_agent(base, effects=EFFECTS, db=store_url, keyring=Keyring.generate(), **options)
        self.gate: EffectGate = gate_of(self.agent)

    def pause(self, message_id: str = "m1") -> RunState[Any, Any]:
        result = Runner.run_sync(self.agent, "Please act on my order", context=context(message_id))
        assert result.interruptions, "the run should have paused"
        return asyncio.run(RunState.from_string(self.agent, result.to_state().to_string()))

    def resume(self, state: RunState[Any, Any]) -> RunResult:
        return Runner.run_sync(self.agent, state)

    def row(self, state: RunState[Any, Any] | RunResult) -> Any:
        [paused] = pending_approvals(state)
        row = self.gate.store.get_approval(paused.approval_id or "")
        assert row is not None
        return row

    def decisions(self, approval_id: str) -> list[tuple[str, str, str, str | None]]:
        with self.gate.store.transaction() as conn:
            rows = self.gate.store.decisions(conn, approval_id)
        return [(d.approver_id, d.role, d.decision, d.reason) for d in rows]


@pytest.fixture
def shop(store_url: str) -> Iterator[Any]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


REFUND = call("refund_order", id="c1", order_id="1042", amount=500)


def test_a_native_reject_closes_the_approval_with_the_sdk_message_as_the_reason(shop: Any) -> None:
    """`state.reject(item, rejection_message=...)` then resume: nothing runs, the approval is denied
    (recorded as the system identity sdk-reject with the row's role), and the subject is free."""
    s = shop([REFUND, say("I could not refund it.")])
    state = s.pause()
    row = s.row(state)
    state.reject(state.get_interruptions()[0], rejection_message="Not this order.")
    result = s.resume(state)
    assert [o.content for o in tool_results(result)] == ["Not this order."]
    assert s.receiver.count("refund") == 0
    closed = s.gate.store.get_approval(row.id)
    assert closed is not None
    assert (closed.status, closed.reason) == ("denied", "Not this order.")
    assert s.decisions(row.id) == [("sdk-reject", "finance", "deny", "Not this order.")]
    other = CallContext(session_id="s-bob", origin_message_id="m9", user_id="u2", agent_id="support")
    assert isinstance(s.gate.call("refund_order", {"order_id": "1042", "amount": 100}, other), Pending)
    s.model.assert_complete()


def test_a_native_reject_without_a_message_records_the_sdks_default(shop: Any) -> None:
    """A bare `state.reject(item)` closes the approval with the SDK's own default message."""
    s = shop([REFUND, say("Not refunded.")])
    state = s.pause()
    row = s.row(state)
    state.reject(state.get_interruptions()[0])
    s.resume(state)
    closed = s.gate.store.get_approval(row.id)
    assert closed is not None
    assert (closed.status, closed.reason) == ("denied", DEFAULT_APPROVAL_REJECTION_MESSAGE)
    assert s.receiver.count("refund") == 0


def test_a_native_reject_is_recorded_as_the_configured_approver_when_their_role_decides_the_call(
    shop: Any,
) -> None:
    """With `native_approver` whose role may decide the call, the denial is theirs."""
    s = shop([REFUND, say("Not refunded.")], native_approver=FINANCE)
    state = s.pause()
    row = s.row(state)
    state.reject(state.get_interruptions()[0], rejection_message="No.")
    s.resume(state)
    assert s.decisions(row.id) == [("fiona", "finance", "deny", "No.")]


def test_a_native_approve_without_a_configured_approver_runs_nothing_and_names_the_setting(
    shop: Any,
) -> None:
    """`state.approve(item)` with no `native_approver`: nothing runs, the approval stays pending,
    and the model is told the setting that would make it work."""
    s = shop([REFUND, say("It was not approved.")])
    state = s.pause()
    row = s.row(state)
    state.approve(state.get_interruptions()[0])
    result = s.resume(state)
    [output] = tool_results(result)
    assert "not_approved" in output.content
    assert "native_approver=" in output.content
    assert "approve_as(" in output.content
    assert s.receiver.count("refund") == 0
    pending = s.gate.store.get_approval(row.id)
    assert pending is not None
    assert pending.status == "pending"


def test_a_native_approve_as_the_configured_approver_runs_once_through_the_gate(shop: Any) -> None:
    """With `native_approver=fiona`, `state.approve(item)` grants through the gate and the refund
    runs once; the approved snapshot resumed a second time runs nothing and decides nothing (the
    SDK's approval saved in it is unsigned: the call is shown paused again)."""
    s = shop([REFUND, say("Refunded.")], native_approver=FINANCE)
    state = s.pause()
    row = s.row(state)
    state.approve(state.get_interruptions()[0])
    snapshot = state.to_string()
    result = s.resume(state)
    assert [o.content for o in tool_results(result)] == ["refunded 500 on 1042"]
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    assert [d[:3] for d in s.decisions(row.id)] == [("fiona", "finance", "approve")]
    again = s.resume(asyncio.run(RunState.from_string(s.agent, snapshot)))
    assert [i.call_id for i in again.interruptions] == ["c1"]
    assert s.receiver.count("refund") == 1
    assert [d[:3] for d in s.decisions(row.id)] == [("fiona", "finance", "approve")]
    s.model.assert_complete()


def test_a_native_approver_with_the_wrong_role_is_refused_and_nothing_runs(shop: Any) -> None:
    """The gate's checks hold for a native approve: a support lead cannot approve a refund."""
    s = shop([REFUND, say("Not approved.")], native_approver=SUPPORT)
    state = s.pause()
    row = s.row(state)
    state.approve(state.get_interruptions()[0])
    [output] = tool_results(s.resume(state))
    assert "not_approved" in output.content
    assert "sam (support_lead) was refused" in output.content
    assert s.receiver.count("refund") == 0
    still = s.gate.store.get_approval(row.id)
    assert still is not None
    assert still.status == "pending"


def test_a_native_approve_of_a_destructive_call_needs_two_distinct_approvers(shop: Any) -> None:
    """One native approve of a destructive call is a PartialApproval: the call stays paused and
    nothing runs; a second, distinct approver's native approve runs it once."""
    deciding = [FINANCE]
    s = shop(
        [call("delete_account", id="c1", user="u1"), say("Deleted.")],
        native_approver=lambda run_context: deciding[0],  # the application's current approver
    )
    state = s.pause()
    row = s.row(state)
    state.approve(state.get_interruptions()[0])
    first = s.resume(state)
    assert [p.approval_id for p in pending_approvals(first)] == [row.id]  # still paused
    assert s.receiver.count("delete") == 0
    state = asyncio.run(RunState.from_string(s.agent, first.to_state().to_string()))
    state.approve(state.get_interruptions()[0])
    deciding[0] = OTHER_FINANCE
    second = s.resume(state)
    assert second.interruptions == []
    assert s.receiver.count("delete", user="u1") == 1
    assert [d[:3] for d in s.decisions(row.id)] == [
        ("fiona", "finance", "approve"),
        ("frank", "finance", "approve"),
    ]
    s.model.assert_complete()


def test_a_native_reject_closes_at_once_even_when_the_run_pauses_again(shop: Any) -> None:
    """Two paused calls, one rejected natively: the resumed run pauses again on the other, and the
    rejected approval is already closed (it does not wait for the model's next turn)."""
    s = shop(
        [
            step(
                call("refund_order", id="c1", order_id="1042", amount=500),
                call("delete_account", id="c2", user="u1"),
            ),
            say("Done."),
        ]
    )
    state = s.pause()
    by_tool = {p.tool: p for p in pending_approvals(state)}
    rejected = next(i for i in state.get_interruptions() if i.call_id == "c1")
    state.reject(rejected, rejection_message="No refund.")
    again = s.resume(state)
    assert [p.tool for p in pending_approvals(again)] == ["delete_account"]
    refund = s.gate.store.get_approval(by_tool["refund_order"].approval_id or "")
    delete = s.gate.store.get_approval(by_tool["delete_account"].approval_id or "")
    assert refund is not None
    assert delete is not None
    assert (refund.status, refund.reason, delete.status) == ("denied", "No refund.", "pending")
    assert s.receiver.effects == []


def test_a_native_decision_on_an_edited_snapshot_decides_nothing(shop: Any) -> None:
    """A snapshot whose user_id was edited: a native approve (or reject) ends the run with
    TamperedState before the gate decides anything; nothing runs."""
    s = shop([REFUND], native_approver=FINANCE)
    result = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    row = s.row(result)  # the run's own approval, listed before the edit
    snapshot = tamper_user(result.to_state().to_string(), "u2")
    for decide in ("approve", "reject"):
        state = asyncio.run(RunState.from_string(s.agent, snapshot))
        [listed] = pending_approvals(state)
        assert (listed.verified, listed.approval_id) == (False, None)  # the edited identity
        item = state.get_interruptions()[0]
        state.approve(item) if decide == "approve" else state.reject(item)
        with pytest.raises(TamperedState):
            s.resume(state)
        unchanged = s.gate.store.get_approval(row.id)
        assert unchanged is not None
        assert unchanged.status == "pending"
        assert s.decisions(row.id) == []
    assert s.receiver.effects == []


def test_a_native_approve_of_another_sessions_approval_decides_nothing(shop: Any) -> None:
    """A snapshot edited to map its call to an approval of another session (identity intact):
    the native approve is refused with TamperedState and that approval stays pending."""
    s = shop([REFUND], native_approver=FINANCE)
    other = CallContext(session_id="s-bob", origin_message_id="m9", user_id="u2", agent_id="support")
    foreign = s.gate.call("delete_account", {"user": "u2"}, other)
    assert isinstance(foreign, Pending)
    result = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    state = result.to_state()
    record = state._context.context["effectgate"]["approvals"]["c1"]  # type: ignore[union-attr]
    record.update(approval_id=foreign.approval_id, version=foreign.version)
    state = asyncio.run(RunState.from_string(s.agent, state.to_string()))
    state.approve(state.get_interruptions()[0])
    with pytest.raises(TamperedState):
        s.resume(state)
    row = s.gate.store.get_approval(foreign.approval_id)
    assert row is not None
    assert row.status == "pending"
    assert s.receiver.effects == []


def test_a_native_approve_runs_once_in_a_streamed_run(shop: Any) -> None:
    """`Runner.run_streamed` resumes the same way: the configured approver's native approve runs
    the refund once."""
    s = shop([REFUND, say("Refunded.")], native_approver=FINANCE)
    state = s.pause()
    state.approve(state.get_interruptions()[0])

    async def stream() -> None:
        result = Runner.run_streamed(s.agent, state)
        async for _ in result.stream_events():
            pass

    asyncio.run(stream())
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    s.model.assert_complete()


def test_an_always_approve_decision_approves_each_call_through_the_gate_as_the_configured_approver(
    shop: Any,
) -> None:
    """`state.approve(item, always_approve=True)`: the paused refund and a later refund of the
    same run each run once, each approved in effectgate as fiona."""
    s = shop(
        [REFUND, call("refund_order", id="c2", order_id="1043", amount=700), say("Both refunded.")],
        native_approver=FINANCE,
    )
    state = s.pause()
    state.approve(state.get_interruptions()[0], always_approve=True)
    result = s.resume(state)
    assert result.interruptions == []
    assert s.receiver.count("refund", order_id="1042") == s.receiver.count("refund", order_id="1043") == 1
    for row in s.gate.store.approvals():
        assert [d[:3] for d in s.decisions(row.id)] == [("fiona", "finance", "approve")]
    s.model.assert_complete()


def test_a_native_reject_by_an_approver_without_the_role_is_recorded_as_sdk_reject(shop: Any) -> None:
    """A configured approver whose role cannot decide the call does not block the reject: it is
    recorded as the system identity, and the approval is closed all the same."""
    s = shop([REFUND, say("Not refunded.")], native_approver=SUPPORT)
    state = s.pause()
    row = s.row(state)
    state.reject(state.get_interruptions()[0], rejection_message="No.")
    s.resume(state)
    assert s.decisions(row.id) == [("sdk-reject", "finance", "deny", "No.")]
    assert s.receiver.effects == []


def test_the_full_table_path_settles_native_decisions_too(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """`gate_agent(agent, gate, native_approver=...)` over `table_tools`: a native approve of the
    shop's refund runs it once, through the gate."""
    h = oa_harness(Script([call("refund_order", **SHOP_REFUND), say("Refunded.")]), native_approver=FINANCE)
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    state = h.restore()
    state.approve(state.get_interruptions()[0])
    h.resume(state)
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "executed"
    h.script.assert_complete()


def test_a_spent_grant_leaves_nothing_to_settle(shop: Any, caplog: pytest.LogCaptureFixture) -> None:
    """After `approve_as` and the run that spends the grant, the SDK's approval that remains is
    not mistaken for a native approve: one decision on record, no warning."""
    s = shop([REFUND, call("get_order", id="c2", order_id="1042"), say("Refunded.")])
    state = s.pause()
    [paused] = pending_approvals(state)
    approve_as(s.gate, state, paused, FINANCE)
    with caplog.at_level(logging.INFO, logger="effectgate_openai_agents"):
        s.resume(state)
    assert s.receiver.count("refund") == 1
    assert [d[:3] for d in s.decisions(paused.approval_id or "")] == [("fiona", "finance", "approve")]
    assert [r for r in caplog.records if r.name.startswith("effectgate_openai_agents")] == []
    s.model.assert_complete()
