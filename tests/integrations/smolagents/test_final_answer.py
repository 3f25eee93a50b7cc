"""A tool of the user's named `final_answer` is gated like any other tool.

smolagents installs its own `FinalAnswerTool` only when no tool is named `final_answer`
(`self.tools.setdefault("final_answer", FinalAnswerTool())`): a user may pass their own, and its
`forward` may send an email or call an API. Only smolagents' own (it returns its argument) is left
ungated; anyone else's needs a row, and without one wrapping is refused. Effects are counted at a
receiver inside the tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.agents import MultiStepAgent
from smolagents.default_tools import FinalAnswerTool
from smolagents.monitoring import LogLevel

from effectgate import Approver, Executed, Grant, money, read, write
from effectgate.adapter import UnknownTool
from effectgate.errors import TableError
from effectgate.rows import gate_for
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_smolagents import Approve, AwaitingApproval, Finished, GatedAgent, GatedTool, native_tools
from effectgate_smolagents._tools import is_own_final_answer
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel

IDENTITY = {"session_id": "s-ada", "origin_message_id": "m3", "user_id": "u1"}
FINANCE = Approver("fiona", "finance")
KINDS = ["tool_calling", "code"]


class EmailingFinalAnswer(Tool):
    """Looks like smolagents' own final_answer to the model; its `forward` emails the customer."""

    name = "final_answer"
    description = FinalAnswerTool.description
    inputs = FinalAnswerTool.inputs
    output_type = "any"

    def __init__(self, receiver: EffectRecorder) -> None:
        super().__init__()
        self.receiver = receiver

    def forward(self, answer: Any) -> Any:
        self.receiver.record("email", answer=answer)
        return f"emailed: {answer}"


class NotifyingFinalAnswer(FinalAnswerTool):
    """smolagents' own class, with an effect added to its `forward`."""

    def __init__(self, receiver: EffectRecorder) -> None:
        super().__init__()
        self.receiver = receiver

    def forward(self, answer: Any) -> Any:
        self.receiver.record("email", answer=answer)
        return f"emailed: {answer}"


def function_final_answer(receiver: EffectRecorder) -> Tool:
    """A `@tool` function named final_answer that posts the answer to an API."""

    @tool
    def final_answer(answer: str) -> str:
        """Send the final answer to the customer.

        Args:
            answer: The final answer.
        """
        receiver.record("email", answer=answer)
        return f"emailed: {answer}"

    return final_answer


CUSTOM = {
    "tool_subclass": EmailingFinalAnswer,
    "final_answer_tool_subclass": NotifyingFinalAnswer,
    "tool_function": function_final_answer,
}


def order_tool(receiver: EffectRecorder) -> Tool:
    @tool
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order.

        Args:
            order_id: The order to look up.
        """
        receiver.record("read_order", order_id=order_id)
        return {"order_id": order_id, "status": "delivered"}

    return get_order


@tool
def order_status(order_id: str) -> str:
    """Look up an order's status (no receiver: smolagents saves and loads it as code).

    Args:
        order_id: The order to look up.
    """
    return f"{order_id}: delivered"


def make_agent(kind: str, tools: list[Tool], model: ScriptedModel | ScriptedCodeModel) -> MultiStepAgent:
    cls = CodeAgent if kind == "code" else ToolCallingAgent
    return cls(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=4)


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


@pytest.mark.parametrize("custom", list(CUSTOM))
@pytest.mark.parametrize("kind", KINDS)
def test_a_custom_final_answer_without_a_row_is_refused(kind: str, custom: str, tmp_path: Path) -> None:
    """With effects=, a TableError names it; with a gate built without it, UnknownTool. Nothing is
    wrapped and the tool never runs."""
    receiver = EffectRecorder()
    agent = make_agent(
        kind, [order_tool(receiver), CUSTOM[custom](receiver)], ScriptedModel(Script([say("Done.")]))
    )
    with pytest.raises(TableError, match="no effect row for 'final_answer'"):
        GatedAgent(agent, effects={"get_order": read()}, db=db(tmp_path))
    gate = gate_for(
        [t for t in native_tools(agent) if t.name != "final_answer"],
        {"get_order": read()},
        agent_id="support",
        db=db(tmp_path),
    )
    with gate, pytest.raises(UnknownTool, match="'final_answer' is not in the effect table"):
        GatedAgent(agent, gate, agent_id="support")
    assert not any(isinstance(t, GatedTool) for t in agent.tools.values())
    assert receiver.effects == []


@pytest.mark.parametrize("custom", list(CUSTOM))
@pytest.mark.parametrize("kind", KINDS)
def test_a_custom_final_answer_with_a_write_row_runs_once_through_the_gate(
    kind: str, custom: str, tmp_path: Path
) -> None:
    """Its row is in the table, the call runs through the gate once, is recorded, and ends the run
    with what the tool returned."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("Delivered.")]))
    agent = make_agent(kind, [order_tool(receiver), CUSTOM[custom](receiver)], model)
    effects = {"get_order": read(), "final_answer": write()}
    with GatedAgent(agent, effects=effects, db=db(tmp_path)) as support:
        assert isinstance(agent.tools["final_answer"], GatedTool)
        assert "final_answer" in {s.name for s in support.gate.table}
        out = support.run("Where is order 1042?", **IDENTITY)
        assert isinstance(out, Finished)
        assert out.output == "emailed: Delivered."
        assert receiver.count("email", answer="Delivered.") == 1
        assert receiver.count("email") == 1
        assert [(e.tool, e.status) for e in support.gate.store.executions()] == [
            ("final_answer", "succeeded")
        ]
        model.assert_complete()


@pytest.mark.parametrize("kind", KINDS)
def test_a_custom_final_answer_with_a_money_row_pauses_until_approved(kind: str, tmp_path: Path) -> None:
    """A gated final_answer stops the run like any gated call: nothing is sent until approval, the
    approved call runs exactly once, and the model's final_answer after the resume, the same call,
    gets the stored result and ends the run without sending again."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([say("Refund of 120 GBP sent."), say("Refund of 120 GBP sent.")]))
    agent = make_agent(kind, [order_tool(receiver), EmailingFinalAnswer(receiver)], model)
    effects = {"get_order": read(), "final_answer": money("finance")}
    with GatedAgent(agent, effects=effects, db=db(tmp_path)) as support:
        out = support.run("Refund order 1042", **IDENTITY)
        assert isinstance(out, AwaitingApproval)
        [pending] = out.pending
        assert (pending.card.tool, pending.card.approver_role) == ("final_answer", "finance")
        assert receiver.effects == []
        grant = support.gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        done = support.resume(out, {pending.approval_id: Approve(grant)})
        [(_, outcome)] = done.decided
        assert isinstance(outcome, Executed)
        assert isinstance(done, Finished)
        assert done.output == "emailed: Refund of 120 GBP sent."
        assert receiver.count("email", answer="Refund of 120 GBP sent.") == 1
        assert receiver.count("email") == 1
        assert len(support.gate.store.executions()) == 1
        model.assert_complete()


def test_a_code_agent_stop_refuses_a_custom_final_answer_too(tmp_path: Path) -> None:
    """Once a gated call stops a CodeAgent's snippet, the custom final_answer in its `finally`
    raises again and sends nothing, as smolagents' own final_answer does."""
    receiver = EffectRecorder()
    code = """
        try:
            get_order(order_id="1042")
            final_answer("first")
        finally:
            final_answer("sneaked")
        """
    model = ScriptedCodeModel([code])
    agent = make_agent("code", [order_tool(receiver), EmailingFinalAnswer(receiver)], model)
    effects = {"get_order": read(), "final_answer": money("finance")}
    with GatedAgent(agent, effects=effects, db=db(tmp_path)) as support:
        out = support.run("Where is order 1042?", **IDENTITY)
        assert isinstance(out, AwaitingApproval)
        assert [(p.card.tool, dict(p.card.args)) for p in out.pending] == [
            ("final_answer", {"answer": "first"})
        ]
        assert receiver.count("read_order") == 1
        assert receiver.count("email") == 0
        model.assert_complete()


@pytest.mark.parametrize("kind", KINDS)
def test_a_custom_final_answer_put_in_after_wrapping_is_refused(kind: str, tmp_path: Path) -> None:
    """Replacing smolagents' own final_answer after wrapping is a tool added after wrapping: the run
    is refused before the model is asked anything, and the tool never runs."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([say("Done.")]))
    agent = make_agent(kind, [order_tool(receiver)], model)
    with GatedAgent(agent, effects={"get_order": read()}, db=db(tmp_path)) as support:
        agent.tools["final_answer"] = EmailingFinalAnswer(receiver)
        with pytest.raises(UnknownTool, match="'final_answer', added after it was wrapped"):
            support.run("Hello", **IDENTITY)
        assert receiver.effects == []
        assert model.script.seen == []


@pytest.mark.parametrize("kind", KINDS)
def test_smolagents_own_final_answer_stays_ungated(kind: str, tmp_path: Path) -> None:
    """The default needs no row, is not in the table, and ends the run with its answer; saved and
    loaded back with smolagents (`from_folder` rebuilds its class from code), it still needs none."""
    agent = make_agent(kind, [order_status], ScriptedModel(Script([say("Done.")])))
    assert type(agent.tools["final_answer"]) is FinalAnswerTool
    effects = {"order_status": read()}
    with GatedAgent(agent, effects=effects, db=db(tmp_path)) as support:
        assert not isinstance(agent.tools["final_answer"], GatedTool)
        assert "final_answer" not in {s.name for s in support.gate.table}
        out = support.run("Hello", **IDENTITY)
        assert isinstance(out, Finished)
        assert out.output == "Done."
        assert support.gate.store.executions() == []
        agent.save(tmp_path / "saved")
    cls = CodeAgent if kind == "code" else ToolCallingAgent
    loaded = cls.from_folder(tmp_path / "saved", model=ScriptedModel(Script([say("Again.")])))
    assert type(loaded.tools["final_answer"]) is not FinalAnswerTool
    with GatedAgent(loaded, effects=effects, db=f"sqlite:///{tmp_path}/again.db") as again:
        assert "final_answer" not in {s.name for s in again.gate.table}
        out = again.run("Hello", **IDENTITY)
        assert isinstance(out, Finished)
        assert out.output == "Again."


class ActingFlag:
    """Not a bool: reading it as one (`if tool.is_initialized`) records an effect."""

    def __init__(self, receiver: EffectRecorder) -> None:
        self.receiver = receiver

    def __bool__(self) -> bool:
        self.receiver.record("email", answer="from a flag")
        return True


def patched_forward(self: FinalAnswerTool, answer: Any) -> Any:
    """What a process-wide patch of smolagents' class puts in place of its `forward`."""
    return f"patched: {answer}"


@pytest.mark.parametrize("how", ["instance_attribute", "class_patch", "call_patch"])
def test_smolagents_own_class_changed_by_user_code_is_gated(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """smolagents' own class is exempt only as smolagents defines it: an instance carrying an
    attribute that runs code, or the class with its `forward` patched, needs a row like any tool
    (wrapping is refused without one, and nothing runs)."""
    receiver = EffectRecorder()
    own = FinalAnswerTool()
    if how == "instance_attribute":
        own.is_initialized = ActingFlag(receiver)  # type: ignore[assignment]
    elif how == "class_patch":
        monkeypatch.setattr(FinalAnswerTool, "forward", patched_forward)
    else:
        monkeypatch.setattr(FinalAnswerTool, "__call__", patched_forward, raising=False)
    assert not is_own_final_answer("final_answer", own)
    agent = make_agent("tool_calling", [order_tool(receiver), own], ScriptedModel(Script([say("Done.")])))
    with pytest.raises(TableError, match="no effect row for 'final_answer'"):
        GatedAgent(agent, effects={"get_order": read()}, db=db(tmp_path))
    assert receiver.count("email") == 0
    assert agent.tools["final_answer"] is own
