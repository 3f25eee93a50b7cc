"""A tool's own SDK policies under the gate: `needs_approval` only escalates, `failure_error_function`
formats failures as the SDK does for a plain tool, and a run without identity says what to pass."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, Runner, function_tool
from agents.exceptions import ModelBehaviorError, UserError

from effectgate import Approver, Grant, money, read, write
from effectgate.errors import TableError
from effectgate.testing import Call, EffectRecorder, Say, Script, call, say
from effectgate_openai_agents import MissingIdentity, approve_as, gate_agent, gate_of, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")
HOW = "Runner.run(agent, input, context={'session_id': ..., 'origin_message_id': ..., 'user_id': ...})"


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


async def never(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
    return False


def refund_tool(receiver: EffectRecorder, needs: bool | Callable[..., Awaitable[bool]]) -> FunctionTool:
    @function_tool(needs_approval=needs)
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    return refund_order


@pytest.mark.parametrize("needs", [False, never], ids=["false", "predicate-false"])
def test_a_tools_own_needs_approval_never_removes_a_gated_rows_pause(
    db: str, needs: bool | Callable[..., Awaitable[bool]]
) -> None:
    """A money row pauses even when the tool says it needs no approval; it runs once approved."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([call("refund_order", id="c1", order_id="1042", amount=500), say("Done.")]))
    agent = gate_agent(
        Agent(name="support", model=model, tools=[refund_tool(receiver, needs)]),
        effects={"refund_order": money("finance")},
        db=db,
    )
    with gate_of(agent) as gate:
        result = Runner.run_sync(agent, "Refund order 1042", context=context("m1"))
        assert receiver.count("refund") == 0
        state = result.to_state()
        [paused] = pending_approvals(state)
        assert isinstance(approve_as(gate, state, paused, FINANCE), Grant)
        Runner.run_sync(agent, state)
        assert receiver.count("refund") == 1
        model.assert_complete()


@pytest.mark.parametrize("needs", [True, never], ids=["true", "predicate"])
@pytest.mark.parametrize("row", [read(), write()], ids=["read", "write"])
def test_a_tool_asking_for_approval_on_a_row_that_never_pauses_is_refused_when_wrapped(
    db: str, needs: bool | Callable[..., Awaitable[bool]], row: Any
) -> None:
    """A read or write row cannot pause, so a tool whose own needs_approval could ask for a pause
    is a TableError naming the setting and the fix, not a pause effectgate cannot bind."""
    tool = refund_tool(EffectRecorder(), needs)
    with pytest.raises(TableError, match=r"needs_approval.*gated row"):
        gate_agent(Agent(name="support", tools=[tool]), effects={"refund_order": row}, db=db)


def failing_tool(receiver: EffectRecorder, error: Exception, **options: Any) -> FunctionTool:
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        receiver.record("cancel_attempt", order_id=order_id)
        raise error

    return function_tool(cancel_order, **options)


def run_failing(db: str, tool: FunctionTool, row: Any, *, turns: int = 2) -> tuple[Any, Any]:
    turns_: list[Call | Say] = [call("cancel_order", id="c1", order_id="1042"), say("Sorry.")]
    script = turns_[:turns]
    agent = gate_agent(
        Agent(name="support", model=ScriptedModel(Script(script)), tools=[tool]),
        effects={"cancel_order": row},
        db=db,
    )
    return agent, gate_of(agent)


def formatter(ctx: RunContextWrapper[Any], error: Exception) -> str:
    return f"Could not cancel ({type(error).__name__}): {error}"


def test_a_tools_failure_error_function_formats_its_failure_for_the_model(db: str) -> None:
    """As for a plain tool, the tool's own failure_error_function is what the model is told; the
    tool ran once."""
    receiver = EffectRecorder()
    tool = failing_tool(receiver, RuntimeError("warehouse offline"), failure_error_function=formatter)
    agent, gate = run_failing(db, tool, write())
    with gate:
        result = Runner.run_sync(agent, "Cancel order 1042", context=context("m1"))
        assert [o.content for o in tool_results(result)] == [
            "Could not cancel (RuntimeError): warehouse offline"
        ]
        assert receiver.count("cancel_attempt") == 1


@pytest.mark.parametrize(
    ("error", "raised", "message"),
    [
        (RuntimeError("warehouse offline"), UserError, "Error running tool cancel_order: warehouse offline"),
        (UserError("misconfigured"), UserError, "misconfigured"),
        (ModelBehaviorError("bad call"), ModelBehaviorError, "bad call"),
    ],
    ids=["other", "user-error", "model-behavior-error"],
)
def test_failure_error_function_none_re_raises_as_the_sdk_does(
    db: str, error: Exception, raised: type[Exception], message: str
) -> None:
    """`failure_error_function=None` ends the run with the error, as the SDK raises it for a plain
    tool: its own errors as they are, any other as UserError("Error running tool ...")."""
    receiver = EffectRecorder()
    tool = failing_tool(receiver, error, failure_error_function=None)
    agent, gate = run_failing(db, tool, write(), turns=1)
    with gate, pytest.raises(raised) as caught:
        Runner.run_sync(agent, "Cancel order 1042", context=context("m1"))
    assert str(caught.value) == message
    assert receiver.count("cancel_attempt") == 1


def test_a_gated_call_that_raised_tells_the_model_it_needs_reconciliation_whatever_the_formatter(
    db: str,
) -> None:
    """A money call that raised may have happened: the model is told it needs reconciliation, not
    the tool's formatted error, and it is not retried."""
    receiver = EffectRecorder()
    tool = failing_tool(receiver, RuntimeError("timeout"), failure_error_function=formatter)
    agent, gate = run_failing(db, tool, money("finance"))
    with gate:
        result = Runner.run_sync(agent, "Cancel order 1042", context=context("m1"))
        state = result.to_state()
        [paused] = pending_approvals(state)
        approve_as(gate, state, paused, FINANCE)
        result = Runner.run_sync(agent, state)
        [output] = tool_results(result)
        assert "needs reconciliation" in output.content
        assert receiver.count("cancel_attempt") == 1


def test_a_run_without_a_context_names_every_missing_value_and_the_line_that_fixes_it(db: str) -> None:
    """A plain `Runner.run(agent, input)`: MissingIdentity names the three values and the exact
    call to make; nothing runs."""
    receiver = EffectRecorder()
    agent = gate_agent(
        Agent(
            name="support",
            model=ScriptedModel(Script([call("refund_order", order_id="1042", amount=5)])),
            tools=[refund_tool(receiver, False)],
        ),
        effects={"refund_order": money("finance")},
        db=db,
    )
    with gate_of(agent) as gate:
        with pytest.raises(MissingIdentity) as caught:
            Runner.run_sync(agent, "Refund order 1042")
        text = str(caught.value)
        assert "missing 'session_id', 'origin_message_id' and 'user_id'" in text
        assert HOW in text
        assert gate.store.approvals() == []
        assert receiver.effects == []


def test_a_context_missing_one_value_names_exactly_that_value(db: str) -> None:
    """Only the value that is missing is named, with where to put it."""
    receiver = EffectRecorder()
    agent = gate_agent(
        Agent(
            name="support",
            model=ScriptedModel(Script([call("refund_order", order_id="1042", amount=5)])),
            tools=[refund_tool(receiver, False)],
        ),
        effects={"refund_order": money("finance")},
        db=db,
    )
    with gate_of(agent), pytest.raises(MissingIdentity) as caught:
        Runner.run_sync(agent, "Refund order 1042", context={"session_id": "s-ada", "user_id": "u1"})
    assert str(caught.value).startswith(
        f"missing 'origin_message_id' in the run context (each a non-empty string): {HOW}"
    )
    assert receiver.effects == []


def test_a_tools_own_is_enabled_still_decides_whether_the_model_sees_it(db: str) -> None:
    """Gating keeps the tool's own `is_enabled` (a bool or a function of the run context)."""

    @function_tool(is_enabled=False)
    def hidden(order_id: str) -> str:
        """Never shown."""
        return order_id

    @function_tool(is_enabled=lambda ctx, agent: ctx.context["user_id"] == "u1")
    def for_u1(order_id: str) -> str:
        """Shown to u1 only."""
        return order_id

    model = ScriptedModel(Script([say("Hello."), say("Hello again.")]))
    agent = gate_agent(
        Agent(name="support", model=model, tools=[hidden, for_u1]),
        effects={"hidden": read(), "for_u1": read()},
        db=db,
    )
    with gate_of(agent):
        Runner.run_sync(agent, "Hi", context=context("m1"))
        Runner.run_sync(agent, "Hi", context=context("m2", user_id="u2"))
    assert [sorted(t.name for t in seen.tools) for seen in model.calls] == [["for_u1"], []]
