"""A smolagents `Model` that replays an effectgate `Script`: the deterministic planner.

    from effectgate.testing import Script, call, say
    from effectgate_smolagents.testing import ScriptedModel

    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("It has shipped.")]))

For a `ToolCallingAgent` (the agent passes `tools_to_call_from`) a step becomes one `ChatMessage`
with its tool calls (the scripted ids) and a `say` a `final_answer` call. For a `CodeAgent` a
step becomes one code action calling each tool in order and printing its result, and a `say` a
`final_answer(...)` code action. Strict like the script: a call too many raises `ScriptError`,
`assert_complete()` fails while turns are left. `script.seen` keeps the messages it was shown.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from effectgate.testing import Say, Script, Step

__all__ = ["ScriptedModel", "code_action"]


def code_action(turn: Step | Say) -> str:
    """The CodeAgent action a scripted turn stands for (Python in <code> tags)."""
    if isinstance(turn, Say):
        body = f"final_answer({turn.text!r})"
    else:
        lines = []
        for i, c in enumerate(turn.calls):
            args = ", ".join(f"{k}={v!r}" for k, v in c.args.items())
            lines += [f"r{i} = {c.name}({args})", f"print(r{i})"]
        body = "\n".join(lines)
    return f"Thought: scripted.\n<code>\n{body}\n</code>"


def tool_call_message(turn: Step | Say) -> ChatMessage:
    """The ToolCallingAgent message a scripted turn stands for."""
    if isinstance(turn, Say):
        calls = [("final_answer", {"answer": turn.text}, "call_final")]
    else:
        calls = [(c.name, dict(c.args), c.id) for c in turn.calls]
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[
            ChatMessageToolCall(
                id=cid, type="function", function=ChatMessageToolCallFunction(name=name, arguments=args)
            )
            for name, args, cid in calls
        ],
    )


class ScriptedModel(Model):
    """A smolagents Model whose every answer is the next turn of `script`."""

    def __init__(self, script: Script, **kwargs: Any) -> None:
        super().__init__(model_id="effectgate-scripted", **kwargs)
        self.script = script

    def generate(
        self,
        messages: list[ChatMessage | dict[str, Any]],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        turn = self.script.next_turn(list(messages))
        if tools_to_call_from is not None:
            return tool_call_message(turn)
        return ChatMessage(role=MessageRole.ASSISTANT, content=code_action(turn))

    def assert_complete(self) -> None:
        self.script.assert_complete()
