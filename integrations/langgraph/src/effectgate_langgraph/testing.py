"""A LangChain chat model that replays an effectgate `Script`: the deterministic planner.

    from effectgate.testing import Script, call, say
    from effectgate_langgraph.testing import ScriptedChatModel

    model = ScriptedChatModel(script=Script([call("get_order", order_id="1042"), say("Shipped.")]))

Each model call takes the script's next turn: a step becomes `AIMessage(tool_calls=[...])` with
the scripted call ids, a `say` a plain `AIMessage`. It is strict like the script: one call too
many raises `ScriptError`, and `assert_complete()` fails while turns are left. It never cycles
and never looks at the messages it is given (they are kept in `script.seen` for assertions).
`bind_tools` returns the model itself, so it stands in for a real model in `create_agent` and in
hand-built graphs alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolCall
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from effectgate.testing import Say, Script, Step

__all__ = ["ScriptedChatModel", "turn_message"]


def turn_message(turn: Step | Say) -> AIMessage:
    """The AIMessage a scripted turn stands for."""
    if isinstance(turn, Say):
        return AIMessage(content=turn.text)
    calls = [ToolCall(name=c.name, args=dict(c.args), id=c.id, type="tool_call") for c in turn.calls]
    return AIMessage(content="", tool_calls=calls)


class ScriptedChatModel(BaseChatModel):
    """A `BaseChatModel` whose every answer is the next turn of `script`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: Script

    @property
    def _llm_type(self) -> str:
        return "effectgate-scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = self.script.next_turn(list(messages))
        return ChatResult(generations=[ChatGeneration(message=turn_message(turn))])

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model itself: the script already says which tools it calls."""
        return self

    def assert_complete(self) -> None:
        """Fail while scripted turns are left unused."""
        self.script.assert_complete()
