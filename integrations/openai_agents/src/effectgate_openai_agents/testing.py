"""An SDK `Model` that replays an effectgate `Script`: the deterministic planner.

    from effectgate.testing import Script, call, say
    from effectgate_openai_agents.testing import ScriptedModel

    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("It has shipped.")]))
    agent = Agent(name="support", model=model, tools=...)

Built on `agents.testing.ScriptedModel`: one scripted SDK step per turn of the script, each taking
the script's next turn when the SDK actually calls the model, so the script's own strictness holds
(a call too many raises, `assert_complete()` fails while turns are left) and streamed runs work
too. A step becomes one `function_call` item per call (the scripted call ids), a `say` one
assistant message. The model never reads its input; `script.seen` keeps what it was given.
"""

from __future__ import annotations

import json
from typing import Any

from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, assistant_message, function_call
from agents.testing import ScriptedModel as _SDKScriptedModel

from effectgate.testing import Say, Script, Step

__all__ = ["ScriptedModel", "turn_output"]


def turn_output(turn: Step | Say) -> list[TResponseOutputItem]:
    """The output items a scripted turn stands for."""
    if isinstance(turn, Say):
        return [assistant_message(turn.text, item_id=f"msg-{abs(hash(turn.text)) % 10**8}")]
    return [
        function_call(
            c.name, json.dumps(dict(c.args), separators=(",", ":")), call_id=c.id, item_id=f"fc-{c.id}"
        )
        for c in turn.calls
    ]


class ScriptedModel(_SDKScriptedModel):
    """A scripted SDK model whose every answer is the next turn of `script`."""

    def __init__(self, script: Script, **options: Any) -> None:
        self.script = script
        super().__init__([ModelStep.respond(self._respond) for _ in range(script.remaining)], **options)

    def _respond(self, call: ModelCall) -> ModelStep:
        return ModelStep(output=turn_output(self.script.next_turn(call.input)))

    def assert_complete(self) -> None:
        """Fail while scripted turns are left unused."""
        self.script.assert_complete()
        super().assert_complete()
