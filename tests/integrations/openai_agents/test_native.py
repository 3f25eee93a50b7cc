"""Tools you already have: `gate_agent(agent, effects=...)` gates SDK FunctionTools by naming effects."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, Runner, RunState, function_tool
from agents.tool_context import ToolContext

from effectgate import Approver, Executed, Grant, money, read, write
from effectgate.errors import EffectGateError, TableError
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import (
    approve_as,
    deferred_operations,
    execute_deferred,
    gate_agent,
    gate_of,
    native_tool,
    pending_approvals,
)
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context, tool_results

FINANCE = Approver("fiona", "finance")


def shop_tools(receiver: EffectRecorder) -> tuple[FunctionTool, FunctionTool]:
    """The application's own tools, written once with `@function_tool`; effects land at `receiver`."""

    @function_tool
    def get_order(order_id: str) -> dict[str, str]:
        """Look up an order by its id."""
        receiver.record("get_order", order_id=order_id)
        return {"order_id": order_id, "status": "shipped"}

    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount} on {order_id}"

    return get_order, refund_order


def db_in(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def test_three_lines_gate_existing_tools_a_read_runs_and_a_refund_runs_once_after_approval(
    tmp_path: Path,
) -> None:
    """The three-line version end to end: the read runs at once, the refund pauses, and once
    approved it runs exactly once, even when the approved snapshot is resumed a second time."""
    receiver = EffectRecorder()
    get_order, refund_order = shop_tools(receiver)
    model = ScriptedModel(
        Script(
            [
                call("get_order", id="c1", order_id="1042"),
                call("refund_order", id="c2", order_id="1042", amount=500),
                say("Your refund is done."),
                say("It was already refunded."),
            ]
        )
    )
    agent = gate_agent(
        Agent(name="support", model=model, tools=[get_order, refund_order]),
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
        db=db_in(tmp_path),
    )
    with gate_of(agent) as gate:
        result = Runner.run_sync(agent, "Please refund 500 on order 1042", context=context("m1"))
        assert receiver.count("get_order") == 1
        assert receiver.count("refund") == 0
        [read_output] = tool_results(result)
        assert read_output.ok
        # the SDK's own rendering of the dict the tool returned, as for a plain tool
        assert read_output.content == str({"order_id": "1042", "status": "shipped"})

        state = result.to_state()
        [paused] = pending_approvals(state)
        assert (paused.tool, gate.card(paused.approval_id or "").approver_role) == ("refund_order", "finance")
        assert isinstance(approve_as(gate, state, paused, FINANCE), Grant)
        snapshot = state.to_string()

        result = Runner.run_sync(agent, state)
        assert receiver.count("refund") == receiver.count("refund", order_id="1042", amount=500) == 1
        assert result.final_output == "Your refund is done."
        executed = gate.result(paused.approval_id or "")
        assert isinstance(executed, Executed)
        assert executed.result == "refunded 500 on 1042"

        replayed = asyncio.run(RunState.from_string(agent, snapshot))
        pending_approvals(replayed)
        Runner.run_sync(agent, replayed)
        assert receiver.count("refund") == 1
        model.assert_complete()


def test_the_default_store_is_the_embedded_sqlite_file_with_its_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `db=`, the gate opens `effectgate.db` in the working directory, its key file beside it."""
    monkeypatch.chdir(tmp_path)
    get_order, _ = shop_tools(EffectRecorder())
    agent = gate_agent(Agent(name="support", tools=[get_order]), effects={"get_order": read()})
    with gate_of(agent):
        assert (tmp_path / "effectgate.db").exists()
        assert (tmp_path / "effectgate.db.keys").exists()


def test_a_tool_without_a_row_or_a_row_without_a_tool_is_refused_before_any_store_opens(
    tmp_path: Path,
) -> None:
    """The table is deny-by-default: a forgotten row, or a row naming no tool, raises TableError
    and no database is created."""
    get_order, refund_order = shop_tools(EffectRecorder())
    base = Agent(name="support", tools=[get_order, refund_order])
    with pytest.raises(TableError, match="no effect row for 'refund_order'"):
        gate_agent(base, effects={"get_order": read()}, db=db_in(tmp_path))
    with pytest.raises(TableError, match="names no tool"):
        gate_agent(
            base,
            effects={"get_order": read(), "refund_order": money("finance"), "refund_ordr": read()},
            db=db_in(tmp_path),
        )
    assert not (tmp_path / "effectgate.db").exists()


def test_the_model_is_shown_each_tools_own_name_description_and_schema(tmp_path: Path) -> None:
    """What the model is shown, and what the gate validates against, is the tool's own schema."""
    get_order, refund_order = shop_tools(EffectRecorder())
    model = ScriptedModel(Script([say("Hello.")]))
    agent = gate_agent(
        Agent(name="support", model=model, tools=[get_order, refund_order]),
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
        db=db_in(tmp_path),
    )
    with gate_of(agent) as gate:
        Runner.run_sync(agent, "Hi", context=context("m1"))
        [seen] = model.calls
        shown = {t.name: t for t in seen.tools if isinstance(t, FunctionTool)}
        for own in (get_order, refund_order):
            assert shown[own.name].params_json_schema == own.params_json_schema
            assert shown[own.name].description == own.description
            assert dict(gate.table[own.name].schema or {}) == own.params_json_schema


def test_a_tool_taking_the_run_context_first_still_gets_it_also_when_approved_later(tmp_path: Path) -> None:
    """A function whose first parameter is `RunContextWrapper` receives the SDK's ToolContext of
    the call that runs it: at once for a write, and in the resumed run for an approved refund."""
    seen: list[tuple[str, str, Any]] = []

    @function_tool
    def note_order(ctx: RunContextWrapper[Any], order_id: str) -> str:
        """Add a note to an order."""
        assert isinstance(ctx, ToolContext)
        seen.append(("note", ctx.tool_call_id, ctx.context["user_id"]))
        return f"noted {order_id} for {ctx.context['user_id']}"

    @function_tool
    async def refund_order(ctx: RunContextWrapper[Any], order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        assert isinstance(ctx, ToolContext)
        seen.append(("refund", ctx.tool_call_id, ctx.context["user_id"]))
        return f"refunded {amount}"

    model = ScriptedModel(
        Script(
            [
                call("note_order", id="c1", order_id="1042"),
                call("refund_order", id="c2", order_id="1042", amount=500),
                say("Done."),
            ]
        )
    )
    agent = gate_agent(
        Agent(name="support", model=model, tools=[note_order, refund_order]),
        effects={"note_order": write(), "refund_order": money("finance")},
        db=db_in(tmp_path),
    )
    with gate_of(agent) as gate:
        assert "ctx" not in note_order.params_json_schema["properties"]
        result = Runner.run_sync(agent, "Refund order 1042", context=context("m1"))
        assert [o.content for o in tool_results(result)] == ["noted 1042 for u1"]
        state = result.to_state()
        [paused] = pending_approvals(state)
        approve_as(gate, state, paused, FINANCE)
        Runner.run_sync(agent, state)
        assert seen == [("note", "c1", "u1"), ("refund", "c2", "u1")]
        model.assert_complete()


def test_parallel_calls_each_run_with_their_own_call_context(tmp_path: Path) -> None:
    """Two calls of one turn run concurrently, and each tool sees its own call's ToolContext."""
    seen: dict[str, str] = {}
    second_started = asyncio.Event()

    @function_tool
    async def get_order(ctx: RunContextWrapper[Any], order_id: str) -> str:
        """Look up an order by its id."""
        assert isinstance(ctx, ToolContext)
        if order_id == "1":  # interleave: the first call finishes only once the second has begun
            await asyncio.wait_for(second_started.wait(), timeout=30)
        else:
            second_started.set()
        seen[order_id] = ctx.tool_call_id
        return order_id

    model = ScriptedModel(
        Script(
            [
                step(call("get_order", id="c1", order_id="1"), call("get_order", id="c2", order_id="2")),
                say("Both found."),
            ]
        )
    )
    agent = gate_agent(
        Agent(name="support", model=model, tools=[get_order]),
        effects={"get_order": read()},
        db=db_in(tmp_path),
    )
    with gate_of(agent):
        Runner.run_sync(agent, "Orders 1 and 2?", context=context("m1"))
    assert seen == {"1": "c1", "2": "c2"}


def test_a_deferred_refund_of_an_existing_tool_runs_once_when_the_application_executes_it(
    tmp_path: Path,
) -> None:
    """In deferred mode the run ends with the operation; executed later, outside any run, the
    tool runs once, and its context parameter sees the context the application passes."""
    seen: list[tuple[str, Any]] = []

    @function_tool
    def refund_order(ctx: RunContextWrapper[Any], order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        assert isinstance(ctx, ToolContext)
        seen.append((ctx.tool_call_id, ctx.context))
        return f"refunded {amount}"

    model = ScriptedModel(Script([call("refund_order", id="c1", order_id="1042", amount=500)]))
    agent = gate_agent(
        Agent(name="support", model=model, tools=[refund_order]),
        effects={"refund_order": money("finance")},
        mode="deferred",
        db=db_in(tmp_path),
    )
    with gate_of(agent) as gate:
        result = Runner.run_sync(agent, "Refund order 1042", context=context("m1"))
        [op] = deferred_operations(result)
        assert seen == []
        grant = gate.approve(op["operation_id"], version=op["version"], approver=FINANCE)
        assert isinstance(grant, Grant)
        done = execute_deferred(gate, op, grant, context={"user_id": "u1"})
        assert done.result == "refunded 500"
        assert execute_deferred(gate, op, grant).result == "refunded 500"  # stored, not run again
        assert seen == [(op["operation_id"], {"user_id": "u1"})]
        model.assert_complete()


def test_a_failing_tool_is_a_failure_to_the_gate_not_an_error_text(tmp_path: Path) -> None:
    """The tool's exception reaches the gate (recorded as a failure, never as the write's result)
    and the model is told what the SDK tells it for the plain tool: its default formatter's text,
    which does not expose the exception."""

    @function_tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        raise RuntimeError("the warehouse is offline")

    model = ScriptedModel(Script([call("cancel_order", id="c1", order_id="1042"), say("Sorry.")]))
    agent = gate_agent(
        Agent(name="support", model=model, tools=[cancel_order]),
        effects={"cancel_order": write()},
        db=db_in(tmp_path),
    )
    with gate_of(agent) as gate:
        result = Runner.run_sync(agent, "Cancel order 1042", context=context("m1"))
        [output] = tool_results(result)
        assert output.content == "An error occurred while running the tool. Please try again."
        [execution] = gate.store.executions()
        assert (execution.status, execution.result_json) == ("failed", None)
        assert execution.error is not None
        assert "the warehouse is offline" in execution.error


def test_a_native_tools_function_runs_only_inside_its_gated_call() -> None:
    """Called outside a gated call (no SDK ToolContext), the native function refuses and runs nothing."""
    receiver = EffectRecorder()
    _, refund_order = shop_tools(receiver)
    native = native_tool(refund_order)
    assert (native.name, native.description) == ("refund_order", "Refund part of an order, in pence.")
    with pytest.raises(EffectGateError, match="only inside its own gated call"):
        asyncio.run(native.fn(order_id="1042", amount=500))
    assert receiver.count("refund") == 0


def test_gate_agent_needs_exactly_one_of_a_gate_or_effects(tmp_path: Path) -> None:
    """Neither a gate nor effects, or both, is a TypeError; `gate_of` refuses an ungated agent."""
    get_order, _ = shop_tools(EffectRecorder())
    base = Agent(name="support", tools=[get_order])
    with pytest.raises(TypeError, match="effects="):
        gate_agent(base)  # type: ignore[call-overload]
    agent = gate_agent(base, effects={"get_order": read()}, db=db_in(tmp_path))
    with gate_of(agent) as gate:
        with pytest.raises(TypeError, match="not both"):
            gate_agent(base, gate, effects={"get_order": read()})  # type: ignore[call-overload]
        assert gate_of(agent.clone(instructions="Be brief.")) is gate
    with pytest.raises(ValueError, match="not made by gate_agent"):
        gate_of(base)
