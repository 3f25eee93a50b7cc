"""Review round 10: the OpenAI Agents adapter. Each test reproduced a defect before its fix;
scripted models drive the SDK's real Runner and effects are counted at the receiver."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    Runner,
    RunState,
    Tool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    function_tool,
    tool_input_guardrail,
)

from effectgate import Approver, EffectGate, Keyring, money, read, send
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import STATE_KEY, TamperedState, deferred_operations, gate_agent, gate_of
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context

FINANCE = Approver("fiona", "finance")
EFFECTS = {
    "get_order": read(),
    "refund_order": money("finance", subject="order_id"),
    "send_email": send("support_lead"),
}
REFUND = call("refund_order", id="c1", order_id="1042", amount=500)
EMAIL = call("send_email", id="c2", to="ada@example.com", body="Your refund is on its way.")


class Shop:
    """A gated support agent (read, money and send tools) on `store_url`; `hold` keeps the gate's
    step registration waiting (a slow database) until it is set."""

    def __init__(
        self,
        store_url: str,
        script: list[Any],
        *,
        email_timeout: float | None = None,
        timed_out: threading.Event | None = None,
        refund_guardrails: Any = None,
        **options: Any,
    ) -> None:
        self.receiver = EffectRecorder()
        self.refund_guardrails = refund_guardrails  # the refund's own tool input guardrails
        self.email_timeout = email_timeout
        self.timed_out = timed_out or threading.Event()
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

        @function_tool(tool_input_guardrails=self.refund_guardrails)
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            self.receiver.record("refund", order_id=order_id, amount=amount)
            return f"refunded {amount} on {order_id}"

        def on_timeout(ctx: Any, error: Exception) -> str:
            self.timed_out.set()
            return "send_email timed out"

        @function_tool(timeout=self.email_timeout, timeout_error_function=on_timeout)
        async def send_email(to: str, body: str) -> str:
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


def test_a_sibling_call_timing_out_does_not_lose_the_deferred_refund(shop: Callable[..., Shop]) -> None:
    """Deferred mode, one model turn with a refund and an email (the email has an SDK timeout).
    The gate registers the turn's gated calls together; the database is slow, and the email's
    timeout fires while that registration is in flight. Only the email's call is cancelled: the
    refund's registration completes (its approval is pending in the store), so the run must end
    on the refund's deferred answer and `deferred_operations` list it. Before the fix the email's
    cancellation cancelled the shared registration: the refund was told "An error occurred", the
    run went on, nothing was listed and the pending refund approval was orphaned."""
    registered = threading.Event()  # the email timed out: the slow database answers now
    s = shop([step(REFUND, EMAIL), say("Queued.")], mode="deferred", email_timeout=0.05, timed_out=registered)
    original = s.gate.call_step
    stored = threading.Event()

    def slow_step(*args: Any, **kwargs: Any) -> Any:
        assert registered.wait(30), "the email never timed out"
        try:
            return original(*args, **kwargs)
        finally:
            stored.set()

    s.gate.call_step = slow_step  # type: ignore[method-assign]

    out = Runner.run_sync(s.agent, "Refund 1042 and email Ada", context=context("m1"))
    assert stored.wait(30)  # the registration's worker thread ended (whoever awaited it)

    [refund] = [a for a in s.gate.store.approvals() if a.tool == "refund_order"]
    assert refund.status == "pending"
    ops = deferred_operations(out)
    assert [(op["tool"], op["operation_id"]) for op in ops] == [("refund_order", refund.id)]
    assert json.loads(str(out.final_output))["operation_id"] == refund.id
    assert s.receiver.count("refund") == 0


def _edit_deferred(snapshot: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """A finished deferred run's snapshot with its recorded deferred payload (and the tool output
    that answered it, so the two still match) edited by `edit`."""
    data = json.loads(snapshot)
    record = data["context"]["context"][STATE_KEY]["deferred"]["c1"]
    edit(record)
    for key in ("generated_items", "session_items"):
        for item in data[key]:
            if item["type"] == "tool_call_output_item":
                item["output"] = dict(record)
    return json.dumps(data)


@pytest.mark.parametrize(
    "edit",
    [lambda r: r.pop("operation_id"), lambda r: r.update(operation_id="")],
    ids=["no-operation-id", "empty-operation-id"],
)
def test_deferred_operations_of_an_edited_snapshot_is_tampered_state(
    shop: Callable[..., Shop], edit: Callable[[dict[str, Any]], None]
) -> None:
    """A stored deferred run, edited so that its deferred payload carries no operation id, then
    continued: `deferred_operations` of the new result refuses it with the adapter's typed error
    (`TamperedState`), as `execute_deferred` does for the same payload, not a raw `KeyError`; the
    refund's approval is unchanged and nothing ran."""
    s = shop([REFUND, say("Queued."), say("Anything else?")], mode="deferred")
    out = Runner.run_sync(s.agent, "Refund 1042", context=context("m1"))
    [op] = deferred_operations(out)
    again = Runner.run_sync(s.agent, s.restore(_edit_deferred(out.to_state().to_string(), edit)))

    with pytest.raises(TamperedState):
        deferred_operations(again)

    row = s.gate.store.get_approval(op["operation_id"])
    assert row is not None
    assert (row.status, row.version) == ("pending", 1)
    assert s.receiver.count("refund") == 0


@tool_input_guardrail
def refunds_up_to_1000(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    """The application's own policy: no refund over 1000 pence, whoever approves it."""
    if json.loads(data.context.tool_arguments)["amount"] > 1000:
        return ToolGuardrailFunctionOutput.reject_content("Refunds over 1000 are not allowed.")
    return ToolGuardrailFunctionOutput.allow()


def test_a_deferred_call_its_guardrail_refuses_leaves_no_approval_to_decide(
    shop: Callable[..., Shop],
) -> None:
    """Deferred mode, one model turn with a refund of 99999 (its tool input guardrail, the
    application's policy, refuses it) and an email. The gate registers the turn's gated calls
    together (the email's call registers the refund too), but the refund never runs and no
    deferred answer names it: its approval must not be left waiting in the approvers' queue
    (where a reviewer could approve what the application's policy refused, and it would hold
    the order for every other session). Closed as the guardrail's refusal, as in approval mode;
    only the email is deferred, and nothing ran."""
    big_refund = call("refund_order", id="c1", order_id="1042", amount=99999)
    s = shop(
        [step(big_refund, EMAIL), say("Queued.")], mode="deferred", refund_guardrails=[refunds_up_to_1000]
    )

    out = Runner.run_sync(s.agent, "Refund 1042 and email Ada", context=context("m1"))

    [email] = deferred_operations(out)
    assert email["tool"] == "send_email"
    rows = {a.tool: a for a in s.gate.store.approvals()}
    assert rows["send_email"].status == "pending"
    refund = rows.get("refund_order")
    assert refund is None or (refund.status, refund.reason) == (
        "denied",
        "Refunds over 1000 are not allowed.",
    )
    assert s.receiver.count("refund") == 0
    assert s.receiver.count("email") == 0
