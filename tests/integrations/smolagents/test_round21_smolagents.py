"""Review round 21 of the smolagents adapter: what a CodeAgent manager's code reaches through a
managed agent's memory, and a ToolCallingAgent's final answer beside a paused or refused call.
Each test reproduced a defect before its fix; effects are counted at the receiver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.memory import ActionStep, AgentMemory
from smolagents.monitoring import LogLevel

from effectgate import Keyring, money, read, write
from effectgate.rows import gate_for
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_smolagents import AwaitingApproval, Finished, GatedAgent, native_tools
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate

from ._harness import support_agent, transfer_funds
from .test_final_answer import EmailingFinalAnswer
from .test_managed import IDENTITY, agent, support_tools

WRITTEN = "written_by_model_code.png"


def _screenshot(memory_step: ActionStep) -> None:
    """A step callback as smolagents' browser example has: the step's screenshot, for the model."""
    memory_step.observations_images = [Image.new("RGB", (2, 2))]


@tool
def order_photo(order_id: str) -> Image.Image:
    """The photo the customer sent of the order.

    Args:
        order_id: the order.
    """
    return Image.new("RGB", (2, 2))


def _manager(member: GatedAgent, code: str) -> GatedAgent:
    model = ScriptedCodeModel([code, 'final_answer("done")'])
    manager = CodeAgent(
        tools=[], model=model, managed_agents=[member.agent], verbosity_level=LogLevel.OFF, max_steps=3
    )
    return GatedAgent(manager, member.gate, agent_id=member.agent_id)


def _screenshot_team(shop_gate: ShopGate, tmp_path: Path, code: str) -> GatedAgent:
    script = Script([call("get_order", order_id="1042"), say("It has shipped.")])
    member = agent(
        "tool_calling",
        support_tools(shop_gate, "get_order"),
        script,
        name="orders",
        step_callbacks=[_screenshot],
    )
    return _manager(GatedAgent(member, shop_gate.gate, agent_id="support"), code)


def _photo_team(shop_gate: ShopGate, tmp_path: Path, code: str) -> GatedAgent:
    """A CodeAgent member answering with its tool's image, on a gate of its own."""
    model = ScriptedCodeModel(['final_answer(order_photo(order_id="1042"))'])  # answers with the image
    member = CodeAgent(
        tools=[order_photo],
        model=model,
        name="orders",
        description="Order photos.",
        verbosity_level=LogLevel.OFF,
    )
    gate = gate_for(
        native_tools(member),
        {"order_photo": read()},
        agent_id="support",
        db=f"sqlite:///{tmp_path / 'team.db'}",
        keyring=Keyring.generate(),
    )
    return _manager(GatedAgent(member, gate, agent_id="support"), code)


#: manager code writing a file through an image in the member's memory, after calling it
THROUGH_MEMORY = {
    "observation_image": (
        _screenshot_team,
        f'orders(task="Where is 1042?")\norders.memory.steps[1].observations_images[0].save("{WRITTEN}")',
    ),
    "final_answer_image": (
        _photo_team,
        f'orders(task="Show 1042")\norders.memory.steps[-1].action_output.save("{WRITTEN}")',
    ),
}


@pytest.mark.parametrize("how", list(THROUGH_MEMORY))
def test_manager_code_cannot_write_files_through_a_members_memory(
    shop_gate: ShopGate, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CodeAgent manager's code was handed each member's real memory: its steps hold live
    objects (a screenshot's PIL image, an image the member's tool returned as its answer), and
    PIL's `save` writes any file. Code wrote one with no tool call, no approval and no record.
    The code is now handed a copy of plain data: nothing is written, the run goes on."""
    monkeypatch.chdir(tmp_path)
    team, code = THROUGH_MEMORY[how]
    manager = team(shop_gate, tmp_path, code)
    try:
        out = manager.run("Look at order 1042", **IDENTITY)
        assert isinstance(out, Finished)
        assert not (tmp_path / WRITTEN).exists()
    finally:
        if manager.gate is not shop_gate.gate:
            manager.gate.close()


_PLAIN = (str, int, float, bool, type(None))


def _live(value: Any, path: str, seen: set[int]) -> list[str]:
    """Every object reachable from `value` through what model code can read (attributes that are
    not dunders, items) that is not plain data or smolagents' memory records of it."""
    if isinstance(value, _PLAIN) or id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, list | tuple):
        return [x for i, v in enumerate(value) for x in _live(v, f"{path}[{i}]", seen)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _live(v, f"{path}[{k!r}]", seen)]
    module = type(value).__module__
    if module.startswith("smolagents.") and hasattr(value, "__dict__"):
        return [x for k, v in vars(value).items() for x in _live(v, f"{path}.{k}", seen)]
    return [f"{path}: {type(value).__name__}"]


def test_the_members_memory_handed_to_code_is_plain_data_and_follows_its_runs(shop_gate: ShopGate) -> None:
    """What the manager's code reads of a member's memory is a copy: steps of text and numbers,
    nothing live (no image, no raw model response, no tool object), and the live memory cannot
    be changed through it. It follows the member's runs: read after a call, it holds that call."""
    code = 'orders(task="Where is 1042?")\nseen = orders.memory\nsteps = list(seen.steps)\nseen.steps.clear()'
    manager = _screenshot_team(shop_gate, Path(), code)
    out = manager.run("Look at order 1042", **IDENTITY)
    assert isinstance(out, Finished)
    member = manager.agent.managed_agents["orders"]
    assert [type(s).__name__ for s in member.memory.steps] == ["TaskStep", "ActionStep", "ActionStep"]
    state = manager.agent.python_executor.state
    assert isinstance(state["seen"], AgentMemory)
    assert state["seen"] is not member.memory
    steps = state["steps"]
    assert [type(s).__name__ for s in steps] == ["TaskStep", "ActionStep", "ActionStep"]
    assert _live(steps, "steps", set()) == []
    assert "1042" in str(steps[1].observations)
    assert shop_gate.shop.reads["get_order"] == 1


def test_manager_code_calling_a_members_tool_is_told_so_and_the_run_goes_on(shop_gate: ShopGate) -> None:
    """The manager's code was handed each member's tools as functions calling the gated tool,
    which outside the member's run raised `MissingIdentity` through smolagents' handlers: model
    code crashed the application's run with an error telling it to pass identity it had passed.
    Such a call is now an error the model reads (nothing runs), and the run goes on."""
    manager = _screenshot_team(shop_gate, Path(), 'orders.tools["get_order"](order_id="1042")')
    out = manager.run("Look at order 1042", **IDENTITY)
    assert isinstance(out, Finished)
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.store.events(kind="read") == []
    [first] = [s for s in manager.agent.memory.steps if isinstance(s, ActionStep)][:1]
    assert "orders(task=" in str(first.error)  # the model is told how to have it done


# -- a ToolCallingAgent's final answer in a step with other calls


def _refund(receiver: EffectRecorder) -> Tool:
    @tool
    def refund_order(order_id: str, amount: int, currency: str) -> str:
        """Refund an order.

        Args:
            order_id: the order.
            amount: how much, in minor units.
            currency: its currency.
        """
        receiver.record("refund", order_id=order_id, amount=amount)
        return "refunded"

    return refund_order


def _refusals(events: list[Any]) -> list[tuple[str, str]]:
    """(tool, code) of each recorded refusal (a tool with no row is named in its detail only)."""
    out = []
    for e in events:
        detail = json.loads(e.detail_json)
        out.append((e.tool or detail.get("tool_name"), detail.get("code")))
    return out


@pytest.mark.parametrize("order", ["call_first", "answer_first"])
@pytest.mark.parametrize("beside", ["paused", "refused"])
def test_a_final_answer_beside_a_paused_or_refused_call_is_not_delivered(
    tmp_path: Path, order: str, beside: str
) -> None:
    """One ToolCallingAgent step: a refund (it waits for approval) or a transfer (no row: refused),
    and the user's own `final_answer` (gated as a write: it emails the customer) saying it is
    done. smolagents refuses a final answer beside other calls only after running them all, so
    the email went out ("Refund sent.") while the refund waited, or after the transfer was
    refused. The final answer now runs only as its step's one call: nothing is emailed, no
    approval is made for it, its refusal is recorded, and the refund waits."""
    receiver = EffectRecorder()
    other = call("refund_order", **REFUND) if beside == "paused" else call("transfer_funds", to="x", amount=3)
    calls = [other, call("final_answer", answer="Refund sent.")]
    model = ScriptedModel(Script([step(*(calls if order == "call_first" else calls[::-1])), say("Not yet.")]))
    gated_tools: list[Tool] = [_refund(receiver), EmailingFinalAnswer(receiver)]
    support = ToolCallingAgent(
        tools=[*gated_tools, transfer_funds], model=model, verbosity_level=LogLevel.OFF, max_steps=4
    )
    rows = {"refund_order": money("finance"), "final_answer": write()}
    shown = [t for t in native_tools(support) if t.name in rows]
    gate = gate_for(
        shown, rows, agent_id="support", db=f"sqlite:///{tmp_path}/e.db", keyring=Keyring.generate()
    )
    with gate:
        gated = GatedAgent(support, gate, agent_id="support", unknown="refuse")
        out = gated.run("Refund order 1042", **IDENTITY)
        assert receiver.count("email", answer="Refund sent.") == 0
        assert receiver.count("refund") == 0
        answered = [] if beside == "paused" else [("final_answer", "succeeded")]  # "Not yet.", alone
        assert [(e.tool, e.status) for e in gate.store.executions()] == answered
        pending = [("refund_order", "pending")] if beside == "paused" else []
        assert [(a.tool, a.status) for a in gate.store.approvals()] == pending
        assert ("final_answer", "parallel_calls") in _refusals(gate.store.events(kind="refused"))
        assert isinstance(out, AwaitingApproval if beside == "paused" else Finished)


def test_the_step_keeps_what_its_calls_did_beside_a_final_answer(shop_gate: ShopGate) -> None:
    """smolagents refuses a step with a final answer beside other calls by raising, and dropped
    the step's observations: the model never read that its transfer was refused (only that it
    may not answer beside other calls), and could answer "Sent." next. The step now keeps every
    call's observation beside smolagents' error, and the model reads the refusal."""
    script = Script(
        [
            step(call("final_answer", answer="Refunded."), call("transfer_funds", to="x", amount=3)),
            say("The transfer was refused."),
        ]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Send 3 to x", origin_message_id="m1", session_id="s-ada", user_id="u1")
    assert isinstance(out, Finished)
    [first] = [s for s in gated.agent.memory.steps if isinstance(s, ActionStep)][:1]
    assert first.error is not None  # smolagents' own refusal of the step
    assert "transfer_funds" in str(first.observations)
    assert "Refused" in str(first.observations)
    shown = "\n".join(str(m) for m in script.seen[1])
    assert "Refused" in shown  # what the model read before its next answer
    assert _refusals(shop_gate.store.events(kind="refused")) == [("transfer_funds", "unknown_tool")]
