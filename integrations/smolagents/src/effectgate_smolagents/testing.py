"""A smolagents `Model` that replays an effectgate `Script`: the deterministic planner.

    from effectgate.testing import Script, call, say
    from effectgate_smolagents.testing import ScriptedModel

    model = ScriptedModel(Script([call("get_order", order_id="1042"), say("It has shipped.")]))

For a `ToolCallingAgent` (the agent passes `tools_to_call_from`) a step becomes one `ChatMessage`
with its tool calls (the scripted ids) and a `say` a `final_answer` call. For a `CodeAgent` a
step becomes one code action calling each tool in order and printing its result, and a `say` a
`final_answer(...)` code action, written in the form the agent parses (its code block tags, or
structured output), each value a literal no text can end early. Asked for a plain-text answer
(smolagents' last answer at `max_steps`), a `say` is its text and a call a `ScriptError`.
Strict like the script: a call too many raises `ScriptError`, `assert_complete()` fails while
turns are left. `script.seen` keeps the messages it was shown.

To test what a CodeAgent does with code a model may really write (a gated call inside
`try/finally`, a loop, a nested function), script the code itself, one snippet per step:

    model = ScriptedCodeModel([
        '''
        try:
            refund_order(order_id="1042", amount=12000, currency="GBP")
        finally:
            update_ticket_tags(ticket_id="t-17", tags=["urgent"])
        ''',
        'final_answer("Refund requested.")',
    ])

Each snippet is dedented and sent verbatim as one code action, in order; it is just as strict.

A saved agent whose model is a `ScriptedModel` loads with smolagents' own loaders (the class is
in smolagents' model registry); pass the model to use: `from_folder(path, model=ScriptedModel(...))`.
"""

from __future__ import annotations

import json
import keyword
import textwrap
import threading
from collections.abc import Iterable
from typing import Any

from smolagents.models import (
    MODEL_REGISTRY,
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from effectgate.testing import Say, Script, ScriptError, Step

__all__ = ["ScriptedCodeModel", "ScriptedModel", "code_action"]


def code_action(
    turn: Step | Say, *, stop_sequences: list[str] | None = None, response_format: Any = None
) -> str:
    """The CodeAgent action a scripted turn stands for, as the agent asked for it (`_code_message`:
    Python in <code> tags by default). Each value is written as a Python literal with no `<` or
    backquote in it (as escapes), so text such as "</code>" cannot end the action early; a key that
    is no Python name is passed as `**{...}`."""
    if isinstance(turn, Say):
        body = f"final_answer({_literal(turn.text)})"
    else:
        lines = []
        for i, c in enumerate(turn.calls):
            named = {k: v for k, v in c.args.items() if k.isidentifier() and not keyword.iskeyword(k)}
            other = {k: v for k, v in c.args.items() if k not in named}
            args = [f"{k}={_literal(v)}" for k, v in named.items()]
            args += [f"**{_literal(other)}"] if other else []
            lines += [f"r{i} = {c.name}({', '.join(args)})", f"print(r{i})"]
        body = "\n".join(lines)
    return _code_message(body, stop_sequences, response_format)


def _literal(value: Any) -> str:
    """`value` (JSON: text, numbers, lists, dicts) as a Python literal; `<` and backquotes, which
    only appear in its text, escaped: no code block tag can appear in it."""
    return repr(value).replace("<", "\\x3c").replace("`", "\\x60")


def _code_message(body: str, stop_sequences: list[str] | None = None, response_format: Any = None) -> str:
    """One code action in the form the CodeAgent reads: the JSON of a thought and the code when it
    asked for structured output (`response_format`); in <code> tags when `</code>` closes its code
    blocks (smolagents' default, and a stop sequence then); else in a markdown block, which
    smolagents reads whatever its `code_block_tags` are. A form the agent cannot parse would turn
    every scripted step into a parsing error the model is asked again about: a silent divergence."""
    if response_format is not None:
        return json.dumps({"thought": "scripted.", "code": body})
    if stop_sequences is None or "</code>" in stop_sequences:
        return f"Thought: scripted.\n<code>\n{body}\n</code>"
    return f"Thought: scripted.\n```python\n{body}\n```"


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
        if stop_sequences is None and response_format is None:  # smolagents' final answer at max_steps
            if not isinstance(turn, Say):
                raise ScriptError(
                    f"the agent asked for a final answer in plain text, but the next turn is {turn!r}"
                )
            return ChatMessage(role=MessageRole.ASSISTANT, content=turn.text)
        action = code_action(turn, stop_sequences=stop_sequences, response_format=response_format)
        return ChatMessage(role=MessageRole.ASSISTANT, content=action)

    def assert_complete(self) -> None:
        self.script.assert_complete()

    @classmethod
    def from_dict(cls, model_dictionary: dict[str, Any]) -> ScriptedModel:
        """What smolagents' loaders (`from_folder`, `from_dict`) build for a saved agent: a model
        with an empty script (its first answer raises `ScriptError`). Give the loader the model
        to use instead: `ToolCallingAgent.from_folder(path, model=ScriptedModel(script))`."""
        return cls(Script([]))


# smolagents' loaders find a saved agent's model class by name in this registry
MODEL_REGISTRY.setdefault("ScriptedModel", ScriptedModel)


class ScriptedCodeModel(Model):
    """A smolagents Model for a CodeAgent whose every answer is the next of `snippets`, verbatim.

    A snippet is the Python of one code action (dedented, then put in `<code>` tags). Strict: a
    call past the last snippet raises `ScriptError`, `assert_complete()` fails while snippets are
    left, and `seen` keeps the messages of each call (`len(seen)` is how often it was asked)."""

    def __init__(self, snippets: Iterable[str], **kwargs: Any) -> None:
        super().__init__(model_id="effectgate-scripted-code", **kwargs)
        self.snippets = tuple(textwrap.dedent(s).strip("\n") for s in snippets)
        self.seen: list[list[ChatMessage | dict[str, Any]]] = []
        self._lock = threading.Lock()

    def generate(
        self,
        messages: list[ChatMessage | dict[str, Any]],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        if tools_to_call_from is not None:
            raise ScriptError(
                "ScriptedCodeModel scripts a CodeAgent; a ToolCallingAgent asked it for tool calls"
            )
        with self._lock:
            if len(self.seen) >= len(self.snippets):
                raise ScriptError(
                    f"the model was asked for snippet {len(self.seen) + 1} but the script has "
                    f"{len(self.snippets)}"
                )
            body = self.snippets[len(self.seen)]
            self.seen.append(list(messages))
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=_code_message(body, stop_sequences, response_format)
        )

    @property
    def remaining(self) -> int:
        return len(self.snippets) - len(self.seen)

    def assert_complete(self) -> None:
        if self.remaining:
            raise ScriptError(
                f"{self.remaining} scripted snippet(s) were never used: {self.snippets[-self.remaining :]}"
            )
