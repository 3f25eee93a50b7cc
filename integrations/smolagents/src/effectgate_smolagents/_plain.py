"""A managed agent's memory as a CodeAgent manager's code reads it: a copy of plain data.

smolagents' memory steps hold live objects beside the conversation: images (a step callback's
screenshot, an image a tool returned as the answer: PIL's, whose `save` writes any file), the
model's raw response (a provider's objects; a local model's generation arguments, with its
tokenizer and its `save_pretrained`), whatever a tool returned or a code block ended on (its
methods may act), an exception with its traceback. The interpreter lets code read any attribute
that is not a dunder, so each was a way to act with no tool call, no approval and no record, and
the live step list a way to change the member's memory. The copy keeps smolagents' step and
message records and what the model reads (text, numbers, lists and dicts of them) and puts a
short text in place of anything else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from smolagents.memory import (
    ActionStep,
    AgentMemory,
    FinalAnswerStep,
    PlanningStep,
    SystemPromptStep,
    TaskStep,
    ToolCall,
)
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole
from smolagents.monitoring import Timing, TokenUsage
from smolagents.utils import AgentError

#: smolagents' records of a conversation, rebuilt field by field (exactly these classes)
_RECORDS = frozenset(
    {
        ActionStep,
        PlanningStep,
        TaskStep,
        SystemPromptStep,
        FinalAnswerStep,
        ToolCall,
        ChatMessage,
        ChatMessageToolCall,
        ChatMessageToolCallFunction,
        Timing,
        TokenUsage,
    }
)
_SCALARS = frozenset({str, int, float, bool, type(None)})
_DEEPEST = 64  # a nesting deeper than any conversation's (or a cycle) is cut there


def memory_copy(memory: object) -> AgentMemory:
    """`memory` (a managed agent's) as a new `AgentMemory` of plain data (`plain`)."""
    prompt = getattr(getattr(memory, "system_prompt", None), "system_prompt", "")
    copy = AgentMemory(plain(prompt))
    steps = getattr(memory, "steps", None)
    copied: dict[int, tuple[Any, Any]] = {}
    copy.steps = [plain(s, 0, copied) for s in steps] if isinstance(steps, list) else []
    return copy


def plain(value: Any, depth: int = 0, copied: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """`value` as plain data: text, numbers, lists, tuples and dicts of them, smolagents' memory
    records rebuilt of them, an `AgentError` with its message only; anything else as a text
    naming its type (never its `str`, which may run code: an image's writes a file). Each object
    is copied once (`copied`, by id): a part shared twice is one copy, and a cycle (a list holding
    itself) is cut where it closes, never unrolled down to the depth cut (2**64 copies)."""
    kind = type(value)
    if kind in _SCALARS or kind is MessageRole:
        return value
    if depth > _DEEPEST:
        return "..."
    copied = {} if copied is None else copied
    if (found := copied.get(id(value))) is not None:
        return found[1]
    copied[id(value)] = (value, "...")  # while it is being copied (a cycle closes there); kept alive
    made = _plain(value, kind, depth + 1, copied)
    copied[id(value)] = (value, made)
    return made


def _plain(value: Any, kind: type, deeper: int, copied: dict[int, tuple[Any, Any]]) -> Any:
    if kind is list or kind is tuple:
        return kind(plain(v, deeper, copied) for v in value)
    if kind is dict:
        return {plain(k, deeper, copied): plain(v, deeper, copied) for k, v in value.items()}
    if isinstance(value, str):  # a subclass of text (smolagents' AgentText): its text
        return str.__str__(value)
    if kind in _RECORDS:
        fields = {
            f.name: plain(getattr(value, f.name), deeper, copied) for f in dataclasses.fields(value) if f.init
        }
        return dataclasses.replace(value, **fields)
    if isinstance(value, AgentError) and kind.__module__ == AgentError.__module__:
        return agent_error(kind, plain(getattr(value, "message", ""), deeper, copied))
    return f"<{kind.__name__}: not handed to code>"


def agent_error(cls: type[AgentError], *args: Any) -> AgentError:
    """An `AgentError` of class `cls` with `args` (its message first), without its logger (which
    its `__init__` takes and logs to), its traceback or its cause."""
    error: AgentError = BaseException.__new__(cls)
    Exception.__init__(error, *args)
    error.message = args[0] if args else ""
    return error
