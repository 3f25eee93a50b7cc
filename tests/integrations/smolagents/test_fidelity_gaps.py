"""smolagents fidelity, the gaps its own suite measured: `return_full_result` gives smolagents'
`RunResult`, a bad argument raises `AgentToolCallError` where smolagents raises it (and never runs
the tool), and a bare value for a one-input tool is that input, validated and hashed as such."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.agents import MultiStepAgent, RunResult
from smolagents.memory import ActionStep
from smolagents.monitoring import LogLevel

from effectgate import Approver, Grant, money
from effectgate.canonical import args_hash
from effectgate.rows import Row
from effectgate.testing import EffectRecorder, Script, ScriptError, call, say, step
from effectgate_smolagents import Approve, AwaitingApproval, Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel

from . import _fidelity_tools as ft

KINDS = [pytest.param(ToolCallingAgent, id="tool_calling"), pytest.param(CodeAgent, id="code")]
IDENTITY = {"session_id": "s-ada", "origin_message_id": "m1", "user_id": "u1"}
FINANCE = Approver("fiona", "finance")


@tool
def cancel_order(order_id: str) -> str:
    """Cancel an order and refund it in full.

    Args:
        order_id: the order's id.
    """
    from tests.integrations.smolagents import _fidelity_tools

    _fidelity_tools.RECEIVER.record("cancel", order_id=order_id)
    return f"order {order_id} cancelled"


EFFECTS: dict[str, Row] = {**ft.EFFECTS, "cancel_order": money("finance", subject="order_id")}


@pytest.fixture(autouse=True)
def receiver(monkeypatch: pytest.MonkeyPatch) -> EffectRecorder:
    """A fresh receiver per test; the tools look it up at call time."""
    fresh = EffectRecorder()
    monkeypatch.setattr(ft, "RECEIVER", fresh)
    return fresh


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


class RawArguments(ScriptedModel):
    """The scripted model, except that the calls named in `raw` (by scripted id) carry those
    arguments as the model sent them: a bare string, a list, keys that are not strings."""

    def __init__(self, script: Script, raw: Mapping[str, Any]) -> None:
        super().__init__(script)
        self.raw = dict(raw)

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        message = super().generate(messages, *args, **kwargs)
        for tool_call in message.tool_calls or []:
            if tool_call.id in self.raw:
                tool_call.function.arguments = self.raw.pop(tool_call.id)
        return message

    def assert_complete(self) -> None:
        super().assert_complete()
        if self.raw:
            raise ScriptError(f"raw arguments never sent: {self.raw}")


def agent_of(kind: type[MultiStepAgent], model: Any, **options: Any) -> MultiStepAgent:
    tools: list[Tool] = [*ft.tools(), cancel_order]
    return kind(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=4, **options)


@pytest.fixture
def gated(db: str) -> Iterator[list[GatedAgent]]:
    made: list[GatedAgent] = []
    yield made
    for g in made:
        g.close()


def wrap(made: list[GatedAgent], agent: MultiStepAgent, db: str) -> GatedAgent:
    made.append(GatedAgent(agent, effects=EFFECTS, db=db))
    return made[-1]


def effects(receiver: EffectRecorder, kind: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in receiver.effects if e.kind == kind]


def errors(agent: MultiStepAgent) -> list[tuple[str, str] | None]:
    return [
        None if s.error is None else (type(s.error).__name__, str(s.error))
        for s in agent.memory.steps
        if isinstance(s, ActionStep)
    ]


# -- 1. return_full_result


@pytest.mark.parametrize("kind", KINDS)
def test_an_agent_built_for_full_results_gets_smolagents_run_result(
    kind: type[MultiStepAgent], gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """An agent built with return_full_result=True finishes with smolagents' RunResult on
    Finished.run_result (output, state, steps, timing), as its own run would return it."""
    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("Delivered.")]))
    g = wrap(gated, agent_of(kind, model, return_full_result=True), db)
    out = g.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished)
    result = out.run_result
    assert isinstance(result, RunResult)
    assert (result.output, out.output, result.state) == ("Delivered.", "Delivered.", "success")
    assert result.token_usage is None  # the scripted model reports none, so smolagents' is None
    assert result.steps == g.agent.memory.get_full_steps()
    assert result.timing.duration is not None
    assert result.timing.duration >= 0
    assert receiver.count("order_read") == 1
    model.assert_complete()


def test_the_runs_own_setting_wins_over_the_agents(gated: list[GatedAgent], db: str) -> None:
    """run(return_full_result=...) decides, and None leaves it to the agent (smolagents' rule)."""
    model = ScriptedModel(Script([say("One."), say("Two."), say("Three.")]))
    g = wrap(gated, agent_of(ToolCallingAgent, model, return_full_result=False), db)
    out = g.run("a", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.run_result is None
    out = g.run("b", return_full_result=True, **{**IDENTITY, "origin_message_id": "m2"})
    assert isinstance(out, Finished)
    assert isinstance(out.run_result, RunResult)
    g.agent.return_full_result = True
    out = g.run("c", return_full_result=False, **{**IDENTITY, "origin_message_id": "m3"})
    assert isinstance(out, Finished)
    assert out.run_result is None
    model.assert_complete()


def test_a_paused_run_has_no_run_result_and_its_resume_has_one(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """A run stopped at a gated call has not finished; the resumed run that finishes has the
    RunResult, over the whole memory, and the refund ran once."""
    model = ScriptedModel(Script([call("refund_order", order_id="1042", amount=500), say("Refunded.")]))
    g = wrap(gated, agent_of(ToolCallingAgent, model, return_full_result=True), db)
    out = g.run("Refund 500 on 1042", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    [waiting] = out.pending
    grant = g.gate.approve(waiting.approval_id, version=waiting.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = g.resume(out, {waiting.approval_id: Approve(grant)})
    assert isinstance(done, Finished)
    assert isinstance(done.run_result, RunResult)
    assert done.run_result.output == "Refunded."
    assert len(done.run_result.steps) == len(g.agent.memory.steps)
    assert receiver.count("refund") == 1
    model.assert_complete()


# -- 2. a bad argument


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"order_idd": "1042"}, id="unknown"),
        pytest.param({}, id="missing"),
        pytest.param({"order_id": 1042}, id="wrong_type"),
        pytest.param({None: None}, id="key_not_a_string"),
        pytest.param([1, 2, 3], id="list"),
    ],
)
def test_a_bad_argument_of_a_single_call_raises_agent_tool_call_error_and_runs_nothing(
    bad: Any, gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """The step's only call has a bad argument: smolagents' AgentToolCallError is the step's error
    (the gate's text, which the model reads), the gate records it as invalid, nothing runs, and
    the model's corrected call runs once."""
    model = RawArguments(
        Script([call("get_order", id="bad", order_id="x"), call("get_order", order_id="1042"), say("Done.")]),
        {"bad": bad},
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.output == "Done."
    [first, second, _] = errors(g.agent)
    assert first is not None
    assert first[0] == "AgentToolCallError"
    assert first[1].startswith("Invalid arguments for get_order")
    assert second is None
    assert out.observations[0] == ("get_order", first[1])  # what the model was given
    assert [e.tool for e in g.gate.store.events(kind="invalid")] == ["get_order"]
    assert effects(receiver, "order_read") == [{"order_id": "1042"}]
    model.assert_complete()


def test_a_bad_argument_for_a_gated_tool_creates_no_approval(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """A refund with an argument the tool lacks: AgentToolCallError, no approval, no pause."""
    model = ScriptedModel(
        Script([call("refund_order", order_id="1042", amount=500, note="x"), say("Sorry.")])
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Refund 1042", **IDENTITY)
    assert isinstance(out, Finished)
    assert [e and e[0] for e in errors(g.agent)] == ["AgentToolCallError", None]
    assert g.gate.store.approvals() == []
    assert receiver.effects == []
    model.assert_complete()


def test_a_bad_argument_in_a_parallel_step_is_its_observation(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """In a step with two calls the bad one's text is its observation and the good one runs: the
    step keeps both observations, as for a tool's own failure there."""
    model = ScriptedModel(
        Script(
            [
                step(
                    call("get_order", id="c1", order_idd="1042"),
                    call("tag_ticket", id="c2", ticket_id="t-17", tag="urgent"),
                ),
                say("Done."),
            ]
        )
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Tag it", **IDENTITY)
    assert isinstance(out, Finished)
    assert errors(g.agent) == [None, None]
    seen = dict(out.observations)
    assert seen["get_order"].startswith("Invalid arguments for get_order")
    assert seen["tag_ticket"] == "ticket t-17 tagged urgent"
    assert (receiver.count("order_read"), receiver.count("ticket_tag")) == (0, 1)
    model.assert_complete()


def test_a_code_agent_reads_a_bad_argument_as_its_steps_error(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """In a CodeAgent's code a bad argument is raised, as the plain tool's forward raises a
    TypeError for it: the step records the gate's text as its error (the block cannot go on to a
    final_answer that claims the call done), and nothing runs."""
    model = ScriptedCodeModel(["print(get_order(order_idd='1042'))", "final_answer('Sorry.')"])
    g = wrap(gated, agent_of(CodeAgent, model), db)
    out = g.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished)
    [first, second] = errors(g.agent)
    assert first is not None
    assert first[0] == "AgentExecutionError"
    assert "Invalid arguments for get_order" in first[1]
    assert second is None
    assert receiver.effects == []
    model.assert_complete()


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("get_order('1042', 'extra')", id="too_many"),
        pytest.param("get_order('1042', order_id='9')", id="twice"),
    ],
)
def test_positional_arguments_bind_as_python_binds_them(
    code: str, gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """A CodeAgent's positional call binds as the plain tool's forward would: a surplus value or
    a value given twice is a TypeError the model reads, never dropped, and nothing runs."""
    model = ScriptedCodeModel([code, "final_answer('Sorry.')"])
    g = wrap(gated, agent_of(CodeAgent, model), db)
    out = g.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished)
    [first, _] = errors(g.agent)
    assert first is not None
    assert "TypeError" in first[1]
    assert receiver.effects == []
    model.assert_complete()


# -- 3. a bare value for a one-input tool


def test_a_bare_string_for_a_one_input_tool_is_that_input(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """smolagents passes a bare string to a one-input tool as that input: the read runs with it."""
    model = RawArguments(
        Script([call("get_order", id="bare", order_id="x"), say("Delivered.")]), {"bare": "A-1042"}
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Where is A-1042?", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.observations == (("get_order", "order A-1042: delivered"),)
    assert effects(receiver, "order_read") == [{"order_id": "A-1042"}]
    model.assert_complete()


def test_a_bare_string_is_approved_and_hashed_as_the_object_the_tool_receives(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """A gated one-input tool called with a bare string pauses on {input: value}: the card, its
    hash and its subject are of that object, and the approved call runs it once."""
    model = RawArguments(
        Script([call("cancel_order", id="bare", order_id="x"), say("Cancelled.")]), {"bare": "A-1042"}
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Cancel A-1042", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    [waiting] = out.pending
    assert dict(waiting.card.args) == {"order_id": "A-1042"}
    assert waiting.card.args_hash == args_hash("cancel_order", {"order_id": "A-1042"})
    assert receiver.effects == []
    grant = g.gate.approve(waiting.approval_id, version=waiting.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = g.resume(out, {waiting.approval_id: Approve(grant)})
    assert isinstance(done, Finished)
    assert effects(receiver, "cancel") == [{"order_id": "A-1042"}]
    model.assert_complete()


def test_a_bare_string_for_a_two_input_tool_is_refused(
    gated: list[GatedAgent], db: str, receiver: EffectRecorder
) -> None:
    """A bare string is only the first input: a refund missing its amount is invalid, no
    approval, nothing runs."""
    model = RawArguments(
        Script([call("refund_order", id="bare", order_id="x"), say("Sorry.")]), {"bare": "A-1042"}
    )
    g = wrap(gated, agent_of(ToolCallingAgent, model), db)
    out = g.run("Refund A-1042", **IDENTITY)
    assert isinstance(out, Finished)
    [first, _] = errors(g.agent)
    assert first is not None
    assert first[0] == "AgentToolCallError"
    assert g.gate.store.approvals() == []
    assert receiver.effects == []
    model.assert_complete()
