"""Review round 4: the OpenAI Agents adapter under cancellation, pre-approval guardrails, stale
copies approved natively, edited snapshots and a restart.

Scripted fake models drive the SDK's real Runner; each test runs on SQLite and PostgreSQL
(`store_url`) and counts effects at the receiver (a counter in each tool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
    RunState,
    Tool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolInputGuardrailTripwireTriggered,
    function_tool,
    tool_input_guardrail,
)
from agents.run_config import ToolExecutionConfig

from effectgate import Approver, EffectGate, Keyring, money, read
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import (
    approve_as,
    deferred_operations,
    execute_deferred,
    gate_agent,
    gate_of,
    pending_approvals,
)
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")
EFFECTS = {"get_order": read(), "refund_order": money("finance", subject="order_id")}
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)


class Shop:
    """A gated support agent (a read and a money tool, both plain sync functions) on `store_url`;
    the refund waits at `gate_refund` when it is set (a bank call in flight)."""

    def __init__(self, store_url: str, script: list[Any], *, guardrails: Any = (), **options: Any) -> None:
        self.guardrails = list(guardrails)  # the refund's own tool input guardrails
        self.receiver = EffectRecorder()
        self.refund_started = threading.Event()
        self.gate_refund: threading.Event | None = None
        self.during_refund: list[Callable[[], None]] = []  # what happens elsewhere meanwhile
        self.model = ScriptedModel(Script(script))
        base = Agent(name="support", model=self.model, tools=self._tools())
        options.setdefault("keyring", Keyring.generate())
        self.agent = gate_agent(base, effects=EFFECTS, db=store_url, **options)
        self.gate: EffectGate = gate_of(self.agent)

    def _tools(self) -> list[Tool]:
        @function_tool
        def get_order(order_id: str) -> str:
            """Look up an order."""
            self.receiver.record("get_order", order_id=order_id)
            return f"order {order_id}: shipped"

        @function_tool(tool_input_guardrails=self.guardrails)
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.refund_started.set()
            while self.during_refund:
                self.during_refund.pop(0)()
            if self.gate_refund is not None:
                assert self.gate_refund.wait(30), "the test never let the bank call end"
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        return [get_order, refund_order]

    def restore(self, snapshot: str) -> RunState[Any, Any]:
        return asyncio.run(RunState.from_string(self.agent, snapshot))

    def approved_snapshot(self, message_id: str = "m1") -> tuple[str, str]:
        """The refund paused, approved through the gate (grant attached), stored; its approval id."""
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


async def _drain(run: RunResultStreaming) -> None:
    async for _ in run.stream_events():
        pass


def _outputs(result: RunResult, call_id: str) -> list[str]:
    return [o.content for o in tool_results(result) if o.call_id == call_id]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_run_cancelled_while_an_approved_sync_refund_runs_settles_its_record(
    shop: Callable[..., Shop], streamed: bool
) -> None:
    """The approved snapshot is resumed and the run is cancelled while the refund (a plain sync
    function tool, which the SDK runs in a worker thread that cannot be stopped) is calling the
    bank (a web request cancelled on a client disconnect; `RunResultStreaming.cancel()`). The
    refund goes on and ends: its outcome must be stored as the core stores a sync tool's (the
    approval executed, its result on record), not left in flight; a second resume of the
    snapshot is told that result and the refund ran once."""
    s = shop([REFUND, say("Refunded.")])
    stored, approval_id = s.approved_snapshot()
    s.gate_refund = threading.Event()

    async def cancelled_mid_refund() -> None:
        state = await RunState.from_string(s.agent, stored)
        run = Runner.run_streamed(s.agent, state) if streamed else None
        task = asyncio.ensure_future(_drain(run) if run is not None else Runner.run(s.agent, state))
        await asyncio.to_thread(s.refund_started.wait, 30)
        if run is not None:
            run.cancel()
        else:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert s.gate_refund is not None
        s.gate_refund.set()  # the bank answers after the request was cancelled
        await asyncio.get_running_loop().shutdown_default_executor()  # every worker thread ended

    asyncio.run(cancelled_mid_refund())
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    done = s.gate.result(approval_id)
    assert done is not None
    assert done.result == "refunded 500 on 1042"
    row = s.gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "executed"
    again = Runner.run_sync(s.agent, s.restore(stored))
    assert _outputs(again, "c1") == ["refunded 500 on 1042"]
    assert s.receiver.count("refund") == 1


@tool_input_guardrail
def refunds_up_to_1000(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    """The application's own policy: no refund over 1000 pence, whoever approves it."""
    if json.loads(data.context.tool_arguments)["amount"] > 1000:
        return ToolGuardrailFunctionOutput.reject_content("Refunds over 1000 are not allowed.")
    return ToolGuardrailFunctionOutput.allow()


@tool_input_guardrail
def no_refunds_today(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    return ToolGuardrailFunctionOutput.raise_exception(output_info="refunds are frozen")


PRE_APPROVAL = RunConfig(tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True))


@pytest.mark.parametrize("guardrail", [refunds_up_to_1000, no_refunds_today])
def test_a_call_its_guardrail_refuses_before_approval_leaves_no_approval_to_decide(
    shop: Callable[..., Shop], guardrail: Any
) -> None:
    """With the SDK's pre-approval tool input guardrails, a call its guardrail rejects (or trips
    on) is never paused for approval: the model is told the guardrail's message (or the run
    ends). effectgate must not leave that call waiting in the approvers' queue (the inbox, the
    CLI, a notification): no reviewer is to be asked to approve a refund of 99999 the
    application's own policy refused, and nothing runs."""
    big_refund = call("refund_order", id="c1", order_id="1042", amount=99999)
    s = shop([big_refund, say("Not allowed.")], guardrails=[guardrail])

    def run() -> RunResult:
        return Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"), run_config=PRE_APPROVAL)

    if guardrail is no_refunds_today:
        with pytest.raises(ToolInputGuardrailTripwireTriggered):
            run()
    else:
        result = run()
        assert result.interruptions == []
        assert _outputs(result, "c1") == ["Refunds over 1000 are not allowed."]
    assert s.gate.pending() == []
    assert s.receiver.count("refund") == 0


def test_a_copy_approved_natively_while_the_refund_runs_is_not_told_it_was_refused(
    shop: Callable[..., Shop],
) -> None:
    """The paused snapshot is restored twice (two reviewers' requests), and each copy is approved
    with the SDK's own `state.approve(item)` (native_approver=fiona). While the first copy's
    resume is calling the bank, the second copy is resumed. The refund runs once; the second
    run's model must not be told the refund was refused (it would tell the customer so while the
    money moves): it is told it runs elsewhere, and the approval is fiona's one decision."""
    s = shop([REFUND, say("Refunded."), say("Refunded too.")], native_approver=FINANCE)
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    stored = paused.to_state().to_string()
    first, second = s.restore(stored), s.restore(stored)
    [listed] = pending_approvals(first)
    for state in (first, second):
        state.approve(state.get_interruptions()[0])
    later: list[RunResult] = []
    s.during_refund.append(lambda: later.append(Runner.run_sync(s.agent, second)))
    assert _outputs(Runner.run_sync(s.agent, first), "c1") == ["refunded 500 on 1042"]
    [told] = _outputs(later[0], "c1")
    assert not told.startswith("Refused"), told
    assert "is being run for this request elsewhere" in told
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    row = s.gate.store.get_approval(str(listed.approval_id))
    assert row is not None
    assert row.status == "executed"


def _mark_settled(snapshot: str) -> str:
    """The snapshot with effectgate's (unsealed) "already settled" marker written on every paused
    call's record, as a holder of the stored JSON can."""
    data = json.loads(snapshot)
    for record in data["context"]["context"]["effectgate"]["approvals"].values():
        record["native"] = "granted"
    return json.dumps(data)


def test_a_native_reject_of_a_snapshot_marked_settled_still_closes_the_approval(
    shop: Callable[..., Shop],
) -> None:
    """The stored snapshot is edited so that the paused refund's record says it was settled
    already. The application rejects the call with the SDK's own `state.reject(item)` and resumes:
    the rejection must close effectgate's approval (denied, the reason on record), as a native
    reject always does, not leave it waiting in the approvers' queue for someone to approve."""
    s = shop([call("refund_order", id="c1", order_id="1042", amount=99999), say("Not refunded.")])
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    [listed] = pending_approvals(paused)
    state = s.restore(_mark_settled(paused.to_state().to_string()))
    state.reject(state.get_interruptions()[0], rejection_message="Not this order.")
    Runner.run_sync(s.agent, state)
    row = s.gate.store.get_approval(str(listed.approval_id))
    assert row is not None
    assert (row.status, row.reason) == ("denied", "Not this order.")
    assert s.gate.pending() == []
    assert s.receiver.count("refund") == 0


def test_a_deferred_refund_executed_after_a_restart_runs_once_and_its_replay_says_so(
    shop: Callable[..., Shop],
) -> None:
    """Deferred mode: the refund is deferred in one process; the process restarts (a new gate on
    the same database and keyring), the operation is approved and executed there from its stored
    id, twice (a retried request), and the original message is replayed: the refund ran once, the
    replay answers deferred with the same operation, executed, and nothing runs again."""
    keyring = Keyring.generate()
    before = shop([REFUND], mode="deferred", keyring=keyring)
    [op] = deferred_operations(Runner.run_sync(before.agent, "Refund order 1042", context=context("m1")))
    stored = json.loads(json.dumps(op))  # what the application kept of it
    before.gate.close()
    after = shop([REFUND], mode="deferred", keyring=keyring)
    grant = after.gate.approve(stored["operation_id"], version=stored["version"], approver=FINANCE)
    for _ in range(2):
        done = execute_deferred(after.gate, stored, grant, context=context("m1"))
        assert done.result == "refunded 500 on 1042"
    assert (before.receiver.count("refund"), after.receiver.count("refund")) == (0, 1)
    replayed = Runner.run_sync(after.agent, "Refund order 1042", context=context("m1"))
    [again] = deferred_operations(replayed)
    assert (again["operation_id"], again["approval_status"]) == (stored["operation_id"], "executed")
    assert after.receiver.count("refund") == 1


def test_an_approved_snapshot_resumed_twice_at_once_on_one_loop_refunds_once(
    shop: Callable[..., Shop],
) -> None:
    """The approved snapshot is resumed twice concurrently on one event loop (two requests of one
    async server) while the bank call is in flight: one refund; the other run is told it runs
    elsewhere (or its result), never "Refused"."""
    s = shop([REFUND, say("Refunded."), say("Refunded too.")])
    stored, approval_id = s.approved_snapshot()
    s.gate_refund = threading.Event()

    async def both() -> list[RunResult]:
        first = asyncio.ensure_future(Runner.run(s.agent, await RunState.from_string(s.agent, stored)))
        await asyncio.to_thread(s.refund_started.wait, 30)
        second = await Runner.run(s.agent, await RunState.from_string(s.agent, stored))
        assert s.gate_refund is not None
        s.gate_refund.set()
        return [await first, second]

    first, second = asyncio.run(both())
    assert _outputs(first, "c1") == ["refunded 500 on 1042"]
    [told] = _outputs(second, "c1")
    assert "is being run for this request elsewhere" in told
    assert s.receiver.count("refund") == 1
    row = s.gate.store.get_approval(approval_id)
    assert row is not None
    assert row.status == "executed"
