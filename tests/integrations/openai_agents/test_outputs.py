"""What the model is given for a gated tool's output is what the SDK gives it for the same plain
tool: typed outputs (`ToolOutputImage`, lists of `ToolOutputText`) as their items, dicts and
non-ASCII text as the SDK renders them. Compared item by item with the same run ungated."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, Runner, ToolOutputImage, ToolOutputText, function_tool
from agents.items import ToolCallOutputItem

from effectgate import read, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_openai_agents import gate_agent, gate_of
from effectgate_openai_agents.testing import ScriptedModel

from ._harness import context

OUTPUTS: dict[str, Callable[[], Any]] = {
    "dict": lambda: {"order_id": "1042", "status": "shipped"},
    "non-ascii": lambda: "Bestellung für Zoë: 12 € erstattet ✓",
    "image": lambda: ToolOutputImage(image_url="https://example.invalid/receipt.png"),
    "text-list": lambda: [ToolOutputText(text="line one"), ToolOutputText(text="zwei – drei")],
}


def lookup_tool(receiver: EffectRecorder, make: Callable[[], Any]) -> FunctionTool:
    @function_tool
    def lookup(order_id: str) -> Any:
        """Look something up about an order."""
        receiver.record("lookup", order_id=order_id)
        return make()

    return lookup


def outputs(result: Any) -> list[Any]:
    """The output items the model is sent next turn, as the SDK built them."""
    return [item.raw_item.get("output") for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def run(agent: Agent[Any], **kwargs: Any) -> list[Any]:
    return outputs(Runner.run_sync(agent, "Look up order 1042", **kwargs))


@pytest.mark.parametrize("row", [read(), write()], ids=["read", "write"])
@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_a_gated_tools_output_reaches_the_model_as_a_plain_tools(tmp_path: Path, kind: str, row: Any) -> None:
    script = [call("lookup", id="c1", order_id="1042"), say("Done.")]
    plain_receiver, gated_receiver = EffectRecorder(), EffectRecorder()
    plain = Agent(
        name="support",
        model=_model(script),
        tools=[lookup_tool(plain_receiver, OUTPUTS[kind])],
    )
    expected = run(plain)
    gated = gate_agent(
        Agent(name="support", model=_model(script), tools=[lookup_tool(gated_receiver, OUTPUTS[kind])]),
        effects={"lookup": row},
        db=f"sqlite:///{tmp_path}/effectgate.db",
    )
    with gate_of(gated):
        got = run(gated, context=context("m1"))
    assert plain_receiver.count("lookup") == gated_receiver.count("lookup") == 1
    assert got == expected
    if kind == "non-ascii":
        assert got == ["Bestellung für Zoë: 12 € erstattet ✓"]


def test_a_replayed_writes_stored_result_keeps_non_ascii_text(tmp_path: Path) -> None:
    """A write replayed from the store (the same origin message again) does not run; the model is
    given its stored result as JSON text, non-ASCII as it is."""
    receiver = EffectRecorder()
    script = [call("lookup", id="c1", order_id="1042"), say("Done.")]

    def agent() -> Agent[Any]:
        return Agent(
            name="support", model=_model(script), tools=[lookup_tool(receiver, lambda: {"note": "für Zoë"})]
        )

    db = f"sqlite:///{tmp_path}/effectgate.db"
    first = gate_agent(agent(), effects={"lookup": write()}, db=db)
    with gate_of(first):
        run(first, context=context("m1"))
    again = gate_agent(agent(), effects={"lookup": write()}, db=db)
    with gate_of(again):
        replayed = run(again, context=context("m1"))
    assert receiver.count("lookup") == 1
    assert replayed == ['{"note": "für Zoë"}']


def _model(script: list[Any]) -> ScriptedModel:
    return ScriptedModel(Script(list(script)))
