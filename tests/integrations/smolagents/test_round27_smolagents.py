"""Round 27: a write's result is its JSON form (core `_settle.storable`); what the agent gets.

A smolagents tool whose output has no JSON form (an image: `output_type="image"`) still ran: the
gate records `{"unserializable": "Image"}`, but the run that made it must get the tool's own
output, as smolagents gives a plain tool's (a ToolCallingAgent keeps an image in its state and
tells the model where; a CodeAgent's code gets the object), not a dict that names its type.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.agent_types import AgentImage
from smolagents.monitoring import LogLevel

from effectgate import write
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_smolagents import Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel


def chart_tool(receiver: EffectRecorder) -> Tool:
    @tool
    def draw_chart(title: str) -> Image.Image:
        """Draw a chart and file it.

        Args:
            title: the chart's title.
        """
        receiver.record("draw", title=title)
        return Image.new("RGB", (len(title), 4))

    return draw_chart


def test_a_write_returning_an_image_gives_the_tool_calling_agent_its_image(tmp_path: Path) -> None:
    receiver = EffectRecorder()
    model = ScriptedModel(Script([call("draw_chart", title="sales"), say("Drawn.")]))
    agent = ToolCallingAgent(
        tools=[chart_tool(receiver)], model=model, verbosity_level=LogLevel.OFF, max_steps=4
    )
    with GatedAgent(agent, effects={"draw_chart": write()}, db=f"sqlite:///{tmp_path}/e.db") as gated:
        out = gated.run("draw", session_id="s", origin_message_id="m1", user_id="u")
        assert isinstance(out, Finished)
        assert receiver.count("draw", title="sales") == 1
        kept = [v for v in agent.state.values() if isinstance(v, AgentImage)]
        assert len(kept) == 1  # as smolagents keeps a plain tool's image
        [(_, observation)] = out.observations
        assert "unserializable" not in observation


def test_parallel_writes_returning_images_each_give_their_own(tmp_path: Path) -> None:
    """Two calls of one step run in smolagents' threads: each gets its own image (smolagents files
    both as "image.png", so the state keeps one of them)."""
    receiver = EffectRecorder()
    both = step(call("draw_chart", id="a", title="ab"), call("draw_chart", id="b", title="abc"))
    model = ScriptedModel(Script([both, say("Drawn.")]))
    agent = ToolCallingAgent(
        tools=[chart_tool(receiver)], model=model, verbosity_level=LogLevel.OFF, max_steps=4
    )
    with GatedAgent(agent, effects={"draw_chart": write()}, db=f"sqlite:///{tmp_path}/e.db") as gated:
        out = gated.run("draw", session_id="s", origin_message_id="m1", user_id="u")
        assert isinstance(out, Finished)
        assert receiver.count("draw") == 2
        assert [text for _, text in out.observations] == ["Stored 'image.png' in memory."] * 2
        [kept] = [v.to_raw().size for v in agent.state.values() if isinstance(v, AgentImage)]
        assert kept in ((2, 4), (3, 4))


def test_a_write_returning_an_image_gives_code_the_image(tmp_path: Path) -> None:
    receiver = EffectRecorder()
    model = ScriptedCodeModel(['img = draw_chart(title="sales")\nfinal_answer(str(img.size))'])
    agent = CodeAgent(tools=[chart_tool(receiver)], model=model, verbosity_level=LogLevel.OFF, max_steps=4)
    with GatedAgent(agent, effects={"draw_chart": write()}, db=f"sqlite:///{tmp_path}/e.db") as gated:
        out = gated.run("draw", session_id="s", origin_message_id="m1", user_id="u")
        assert isinstance(out, Finished)
        assert receiver.count("draw", title="sales") == 1
        assert out.output == "(5, 4)"  # the image itself, not a dict naming its type
