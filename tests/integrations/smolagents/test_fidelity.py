"""smolagents fidelity: a gated agent saves and loads with smolagents' own tools, its step logs and
callbacks read as a plain run's, a missing identity says which value and where, and a tool's error
reaches the model as smolagents shows it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, ToolCallingAgent
from smolagents.agents import MultiStepAgent
from smolagents.memory import ActionStep
from smolagents.monitoring import LogLevel

from effectgate import Approver, Grant, Keyring
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Finished,
    GatedAgent,
    GatedTool,
    MissingIdentity,
)
from effectgate_smolagents.testing import ScriptedModel

from . import _fidelity_tools as ft

KINDS = [pytest.param(ToolCallingAgent, id="tool_calling"), pytest.param(CodeAgent, id="code")]
IDENTITY = {"session_id": "s-ada", "origin_message_id": "m1", "user_id": "u1"}
FINANCE = Approver("fiona", "finance")
GATED = ["get_order", "tag_ticket", "refund_order", "order_summary"]


@pytest.fixture(autouse=True)
def receiver(monkeypatch: pytest.MonkeyPatch) -> EffectRecorder:
    """A fresh receiver per test; the tools look it up at call time."""
    fresh = EffectRecorder()
    monkeypatch.setattr(ft, "RECEIVER", fresh)
    return fresh


def agent_of(kind: type[MultiStepAgent], model: ScriptedModel, **options: Any) -> MultiStepAgent:
    return kind(tools=ft.tools(), model=model, verbosity_level=LogLevel.OFF, max_steps=4, **options)


@pytest.fixture
def wrap(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[MultiStepAgent], GatedAgent]]:
    """`GatedAgent(agent, effects=...)` on the test's SQLite or PostgreSQL store (closed after)."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())  # PostgreSQL needs one
    made: list[GatedAgent] = []

    def make(agent: MultiStepAgent) -> GatedAgent:
        made.append(GatedAgent(agent, effects=ft.EFFECTS, db=store_url))
        return made[-1]

    yield make
    for gated in made:
        gated.close()


def approve_and_resume(gated: GatedAgent, out: Any) -> Any:
    assert isinstance(out, AwaitingApproval)
    [waiting] = out.pending
    grant = gated.gate.approve(waiting.approval_id, version=waiting.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return gated.resume(out, {waiting.approval_id: Approve(grant)})


# -- 1. to_dict, save, load, wrap again


@pytest.mark.parametrize("kind", KINDS)
def test_to_dict_gives_the_inner_tools_marked_as_gated(
    kind: type[MultiStepAgent], wrap: Callable[[MultiStepAgent], GatedAgent]
) -> None:
    """A gated agent's to_dict is the plain agent's, with each gated tool's own code (marked in a
    comment and in its dict) and the agent naming its gated tools."""
    plain = agent_of(kind, ScriptedModel(Script([]))).to_dict()
    gated = wrap(agent_of(kind, ScriptedModel(Script([])))).agent.to_dict()
    mark = gated.pop("effectgate")
    assert mark["gated_tools"] == GATED
    assert "wrap the loaded agent again" in mark["note"].lower()
    plain_tools = {t["name"]: t for t in plain.pop("tools")}
    for saved in gated.pop("tools"):
        inner = plain_tools[saved["name"]]
        if saved["name"] == "final_answer":
            assert saved == inner
            continue
        assert saved.pop("effectgate")["gated"] is True
        head, _, code = saved.pop("code").partition("\n")
        assert head.startswith("# effectgate: this tool ran behind an effectgate gate")
        assert code == inner.pop("code")
        assert saved == inner
    assert gated == plain


@pytest.mark.parametrize("kind", KINDS)
def test_a_saved_gated_agent_loads_with_smolagents_and_pauses_once_wrapped_again(
    kind: type[MultiStepAgent],
    wrap: Callable[[MultiStepAgent], GatedAgent],
    tmp_path: Path,
    receiver: EffectRecorder,
) -> None:
    """agent.save writes the inner tools and the marks; smolagents' from_folder loads plain tools;
    wrapped again, the read runs, the refund pauses and runs once after approval."""
    wrap(agent_of(kind, ScriptedModel(Script([])))).agent.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "agent.json").read_text())
    assert saved["effectgate"]["gated_tools"] == GATED
    assert (tmp_path / "saved" / "tools" / "refund_order.py").read_text().startswith("# effectgate:")
    model = ScriptedModel(
        Script(
            [
                call("get_order", order_id="1042"),
                call("refund_order", order_id="1042", amount=500),
                say("Refunded."),
            ]
        )
    )
    loaded = kind.from_folder(tmp_path / "saved", model=model)
    assert not any(isinstance(t, GatedTool) for t in loaded.tools.values())  # the gate is not saved
    gated = wrap(loaded)
    out = gated.run("Refund 500 on order 1042", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    assert [p.card.tool for p in out.pending] == ["refund_order"]
    assert (receiver.count("order_read"), receiver.count("refund")) == (1, 0)
    done = approve_and_resume(gated, out)
    assert isinstance(done, Finished)
    assert done.output == "Refunded."
    assert (receiver.count("order_read"), receiver.count("refund")) == (1, 1)
    assert [(e.tool, e.status) for e in gated.gate.store.executions()] == [("refund_order", "succeeded")]
    model.assert_complete()


def test_a_manager_with_a_gated_managed_agent_serialises(
    wrap: Callable[[MultiStepAgent], GatedAgent],
) -> None:
    """Managed agents rely on to_dict too: the manager's dict holds the gated agent's, marked."""
    worker = wrap(agent_of(ToolCallingAgent, ScriptedModel(Script([])), name="orders", description="Orders."))
    manager = ToolCallingAgent(tools=[], model=ScriptedModel(Script([])), managed_agents=[worker.agent])
    [managed] = manager.to_dict()["managed_agents"]
    assert managed["effectgate"]["gated_tools"] == GATED


# -- 2. step logs and callbacks read as a plain run's


def _steps(agent: MultiStepAgent) -> list[tuple[Any, ...]]:
    return [_step(s) for s in agent.memory.steps if isinstance(s, ActionStep)]


def _step(s: ActionStep) -> tuple[Any, ...]:
    error = (type(s.error).__name__, str(s.error)) if s.error is not None else None
    calls = [(c.name, c.arguments) for c in s.tool_calls or []]
    return (s.step_number, calls, s.observations, error, s.code_action, s.is_final_answer)


def _recorder(seen: list[tuple[Any, ...]]) -> Callable[..., None]:
    """A step callback keeping what each step held when smolagents called it."""

    def record(memory_step: ActionStep, agent: Any = None) -> None:
        seen.append(_step(memory_step))

    return record


def _prompts(model: ScriptedModel) -> list[list[tuple[str, str]]]:
    """What the model was shown on each call (role and text of every message)."""
    return [[(str(m.role), json.dumps(m.content, default=str)) for m in seen] for seen in model.script.seen]


SCENARIOS: dict[str, Callable[[], Script]] = {
    "read_and_write": lambda: Script(
        [
            step(
                call("get_order", id="c1", order_id="1042"),
                call("tag_ticket", id="c2", ticket_id="t-17", tag="urgent"),
            ),
            say("Done."),
        ]
    ),
    "typed_output": lambda: Script([call("order_summary", id="c1", order_id="1042"), say("Done.")]),
    "failing_read": lambda: Script([call("get_order", id="c1", order_id="missing"), say("Not found.")]),
    "read_then_write_after_a_failing_read": lambda: Script(
        [
            call("get_order", id="c1", order_id="missing"),
            call("tag_ticket", id="c2", ticket_id="t-17", tag="urgent"),
            say("Tagged."),
        ]
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("kind", KINDS)
def test_step_logs_callbacks_and_prompts_match_a_plain_run(
    kind: type[MultiStepAgent],
    scenario: str,
    wrap: Callable[[MultiStepAgent], GatedAgent],
    receiver: EffectRecorder,
) -> None:
    """The same script on a plain and a gated agent: the memory's action steps (tool calls with
    names and arguments, observations, errors), what each step callback saw, every prompt the
    model was shown, the run's output and the effects at the receiver are the same (a typed
    object's result and a tool's exception included)."""
    runs = []
    for gated in (False, True):
        receiver.clear()
        seen: list[tuple[Any, ...]] = []
        model = ScriptedModel(SCENARIOS[scenario]())
        agent = agent_of(kind, model, step_callbacks=[_recorder(seen)])
        output = wrap(agent).run("Go", **IDENTITY).output if gated else agent.run("Go")
        model.assert_complete()
        effects = [(e.kind, dict(e.payload)) for e in receiver.effects]
        runs.append((output, _steps(agent), seen, _prompts(model), effects))
    plain, gated_run = runs
    assert gated_run == plain
    assert plain[4]  # the tools ran


@pytest.mark.parametrize("kind", KINDS)
def test_a_paused_step_keeps_what_ran_before_the_gated_call(
    kind: type[MultiStepAgent], wrap: Callable[[MultiStepAgent], GatedAgent], receiver: EffectRecorder
) -> None:
    """One step reads, then calls the refund: the step's memory and its callback hold the calls
    with their arguments, the read's result and what waits; the continued run shows the model
    that result, and the refund runs once after approval."""
    seen: list[tuple[Any, ...]] = []
    script = Script(
        [
            step(
                call("get_order", id="c1", order_id="1042"),
                call("refund_order", id="c2", order_id="1042", amount=5),
            ),
            say("Refunded."),
        ]
    )
    model = ScriptedModel(script)
    gated = wrap(agent_of(kind, model, step_callbacks=[_recorder(seen)]))
    out = gated.run("Refund 5 on 1042", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    [(number, calls, observations, error, _, final)] = seen
    assert (number, error, final) == (1, None, False)
    if kind is ToolCallingAgent:
        assert calls == [
            ("get_order", {"order_id": "1042"}),
            ("refund_order", {"order_id": "1042", "amount": 5}),
        ]
    else:
        [(name, code)] = calls
        assert name == "python_interpreter"
        assert "get_order(order_id='1042')" in code
        assert "refund_order(order_id='1042', amount=5)" in code
    assert "order 1042: delivered" in observations
    assert "refund_order needs approval by finance" in observations
    assert _steps(gated.agent) == seen
    assert (receiver.count("order_read"), receiver.count("refund")) == (1, 0)
    done = approve_and_resume(gated, out)
    assert isinstance(done, Finished)
    assert receiver.count("refund") == 1
    assert any("order 1042: delivered" in text for _, text in _prompts(model)[-1])
    model.assert_complete()


# -- 3. identity


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({}, "session_id, origin_message_id and user_id"),
        ({"session_id": "s-ada"}, "origin_message_id and user_id"),
        ({"session_id": "s-ada", "origin_message_id": "m1", "user_id": " "}, "user_id"),
    ],
)
def test_a_run_without_identity_names_each_missing_value_and_the_fix(
    given: dict[str, str], missing: str, sqlite_url: str, receiver: EffectRecorder
) -> None:
    """MissingIdentity names exactly the values missing, what each is, and the one-line call;
    the model is never asked and nothing runs."""
    model = ScriptedModel(Script([call("get_order", order_id="1042")]))
    with (
        GatedAgent(agent_of(ToolCallingAgent, model), effects=ft.EFFECTS, db=sqlite_url) as gated,
        pytest.raises(MissingIdentity) as raised,
    ):
        gated.run("Where is 1042?", **given)
    message = str(raised.value)
    it = "it" if given.get("session_id") and given.get("origin_message_id") else "them"
    assert message.startswith(f"the run has no {missing}: pass {it} to GatedAgent.run (")
    assert "gated.run(task, session_id=..., origin_message_id=..., user_id=...)" in message
    named = message.split(": ", 1)[0]
    for value in ("session_id", "origin_message_id", "user_id"):
        assert (value in named) == (value in missing)
    assert model.script.seen == []
    assert receiver.effects == []


@pytest.mark.parametrize("kind", KINDS)
def test_smolagents_own_run_of_a_gated_agent_raises_missing_identity(
    kind: type[MultiStepAgent], sqlite_url: str, receiver: EffectRecorder
) -> None:
    """agent.run(task) on the wrapped agent (smolagents' own, no identity): MissingIdentity with
    the one-line fix, before the model is asked; the GatedAgent still runs it with identity."""
    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("Delivered.")]))
    with GatedAgent(agent_of(kind, model), effects=ft.EFFECTS, db=sqlite_url) as gated:
        with pytest.raises(
            MissingIdentity, match=r"run it through its GatedAgent: gated\.run\(task, session_id="
        ):
            gated.agent.run("Where is 1042?")
        assert model.script.seen == []
        assert receiver.effects == []
        out = gated.run("Where is 1042?", **IDENTITY)
    assert isinstance(out, Finished)
    assert receiver.count("order_read") == 1


# -- 4. a tool's own error, as smolagents shows it


def test_a_failing_read_in_a_parallel_step_shows_smolagents_text_and_keeps_its_sibling(
    wrap: Callable[[MultiStepAgent], GatedAgent], receiver: EffectRecorder
) -> None:
    """ToolCallingAgent, two calls in one step, the read raises: its observation is smolagents'
    own error text for that call (as a plain single call's step error reads), and the write's
    observation is kept (smolagents#2457 would drop it); each ran once."""
    plain_model = ScriptedModel(Script([call("get_order", id="c1", order_id="missing"), say("x")]))
    plain = agent_of(ToolCallingAgent, plain_model)
    plain.run("Go")
    [first] = [s for s in plain.memory.steps if isinstance(s, ActionStep)][:1]
    assert first.error is not None
    smolagents_text = str(first.error)
    receiver.clear()
    model = ScriptedModel(
        Script(
            [
                step(
                    call("tag_ticket", id="c1", ticket_id="t-17", tag="urgent"),
                    call("get_order", id="c2", order_id="missing"),
                ),
                say("Tagged; 'missing' was not found."),
            ]
        )
    )
    gated = wrap(agent_of(ToolCallingAgent, model))
    out = gated.run("Go", **IDENTITY)
    assert isinstance(out, Finished)
    assert dict(out.observations) == {"tag_ticket": "ticket t-17 tagged urgent", "get_order": smolagents_text}
    [action] = [s for s in gated.agent.memory.steps if isinstance(s, ActionStep)][:1]
    assert action.error is None
    assert action.observations == f"ticket t-17 tagged urgent\n{smolagents_text}"
    assert (receiver.count("ticket_tag"), receiver.count("order_read")) == (1, 1)
    assert [(e.tool, e.status) for e in gated.gate.store.executions()] == [("tag_ticket", "succeeded")]
    model.assert_complete()
