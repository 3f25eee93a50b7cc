"""What a plain ToolNode would have given the model, for the calls the gate runs.

The gate decides whether a call runs and records it; how a langchain tool runs, and what its
ToolMessage looks like, stays langchain's:

- `flying(calls, config)` marks the calls the gate is about to run. A native tool
  (`gated_node`, `gated_middleware`) then runs as ToolNode runs it: `tool.invoke(tool_call,
  config)`, so its pydantic arguments, its own `handle_tool_error`, its callbacks
  (`on_tool_start` / `on_tool_end` / `on_tool_error`) and its ToolMessage (status, content blocks,
  artifact) are the framework's. The gate stores the message's content; the ToolMessage itself is
  kept here, by tool call id, and is what the model receives for that run.
- `content_of(result)` is the ToolMessage content ToolNode makes of a return value (a string or
  content blocks as they are, anything else as JSON without escaping non-ASCII): what the model
  sees for a stored result (a replay) or a table row's function.
- `tool_span(tool, call, config)` fires `on_tool_start` for a table row's call (its function is
  not a langchain tool, so nothing else would): the node ends it with the ToolMessage or the error.
- `error_message(exc, call, flag)` applies ToolNode's `handle_tool_errors` to an exception a call
  raised through the gate: the same error ToolMessage, or the exception raised again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import pydantic
from langchain_core.callbacks import CallbackManager, CallbackManagerForToolRun
from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.tools.base import _normalize_message_content, _stringify
from langgraph.prebuilt.tool_node import (
    ToolInvocationError,
    _filter_validation_errors,
    _handle_tool_error,
    _infer_handled_types,
)

from effectgate.errors import NeedsReconciliation


class InvalidToolArguments(ValueError):
    """The tool's own pydantic model refused the arguments; the tool did not run."""

    def __init__(self, tool: str, error: pydantic.ValidationError) -> None:
        self.tool = tool
        self.source = error
        self.errors = error.errors(include_url=False)
        super().__init__(f"{tool}: the tool refused its arguments: {error}")


@dataclass
class Flight:
    """Calls the gate is about to run (by tool name) and the ToolMessages their tools produced
    (by tool call id). Mutated from the worker thread that runs a tool, read by the node."""

    calls: dict[str, ToolCall]
    config: RunnableConfig | None
    messages: dict[str, ToolMessage] = field(default_factory=dict[str, ToolMessage])


# A ContextVar holding a mutable Flight: tools run in copies of the context (ToolNode's executor,
# the async driver's worker threads), and what they record must reach the node that set it.
_FLIGHT: ContextVar[Flight | None] = ContextVar("effectgate_langgraph_flight", default=None)


@contextmanager
def flying(calls: Iterable[ToolCall], config: RunnableConfig | None) -> Iterator[Flight]:
    """Mark `calls` as the ones the gate runs next. A gated step names each gated tool once (two
    calls of one gated tool register neither), so a tool name finds its call."""
    flight = Flight({c["name"]: c for c in calls}, config)
    token = _FLIGHT.set(flight)
    try:
        yield flight
    finally:
        _FLIGHT.reset(token)


def _as_call(tool: BaseTool, args: Mapping[str, Any]) -> tuple[Any, Flight | None, str]:
    flight = _FLIGHT.get()
    call = flight.calls.get(tool.name) if flight is not None else None
    if flight is None or call is None:
        return dict(args), None, ""
    call_id = call.get("id")
    # The arguments are the gate's (the approved or edited ones), never the checkpoint's.
    value = {"name": tool.name, "args": dict(args), "id": call_id, "type": "tool_call"}
    return value, flight, str(call_id or "")


def invoke_tool(tool: BaseTool, args: Mapping[str, Any]) -> Any:
    """`tool.invoke` as ToolNode calls it when the gate runs a marked call; plain otherwise."""
    value, flight, call_id = _as_call(tool, args)
    out = tool.invoke(value, flight.config if flight is not None else None)
    if flight is not None and isinstance(out, ToolMessage):
        flight.messages[call_id] = out
    return out


async def ainvoke_tool(tool: BaseTool, args: Mapping[str, Any]) -> Any:
    """`invoke_tool` for an async-only tool."""
    value, flight, call_id = _as_call(tool, args)
    out = await tool.ainvoke(value, flight.config if flight is not None else None)
    if flight is not None and isinstance(out, ToolMessage):
        flight.messages[call_id] = out
    return out


# The runners `native_tool` builds: their tool fires its own callbacks.
_NATIVE: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def mark_native(fn: Callable[..., Any]) -> None:
    _NATIVE.add(fn)


def is_native(fn: Callable[..., Any]) -> bool:
    try:
        return fn in _NATIVE
    except TypeError:  # an unhashable callable object: not one of ours
        return False


def tool_span(tool: BaseTool, call: ToolCall, config: RunnableConfig) -> CallbackManagerForToolRun:
    """`on_tool_start` for a call a table row's function answers, as `BaseTool.run` fires it for
    a langchain tool (the config's callbacks, tags and metadata, the tool's own)."""
    manager = CallbackManager.configure(
        config.get("callbacks"),
        tool.callbacks,
        bool(tool.verbose),
        config.get("tags"),
        tool.tags,
        config.get("metadata"),
        tool.metadata,
    )
    args = dict(call["args"])
    return manager.on_tool_start(
        {"name": tool.name, "description": tool.description},
        str(args),
        name=config.get("run_name"),
        inputs=args,
        tool_call_id=call.get("id"),
    )


def content_of(result: Any) -> str | list[Any]:
    """The ToolMessage content ToolNode makes of a tool's return value."""
    normalized = _normalize_message_content(result)
    return _stringify(result) if normalized is None else normalized


def error_message(exc: Exception, call: ToolCall, flag: Any) -> ToolMessage:
    """ToolNode's `handle_tool_errors` for an exception raised by a call the gate ran.

    The flag is judged on the tool's own exception (for a write whose outcome the gate could not
    know, the cause of its NeedsReconciliation; the store keeps that record either way): a type,
    a tuple of types or a typed callable handle only those types; `True`, a string or an untyped
    callable handle all. Arguments the tool's pydantic model refused are ToolNode's
    `ToolInvocationError`, which its default flag turns into an error ToolMessage. Unhandled, the
    exception is raised again and fails the run."""
    cause = exc.__cause__ if isinstance(exc, NeedsReconciliation) else exc
    error = cause if isinstance(cause, Exception) else exc
    if isinstance(error, InvalidToolArguments):  # what ToolNode raises for arguments its tool refuses
        source = error.source
        error = ToolInvocationError(
            call["name"], source, dict(call["args"]), _filter_validation_errors(source, None)
        )
    handled: tuple[type[Exception], ...]
    if isinstance(flag, type) and issubclass(flag, Exception):
        handled = (flag,)
    elif isinstance(flag, tuple):
        handled = flag
    elif callable(flag):
        handled = _infer_handled_types(flag)
    else:
        handled = (Exception,)
    if not flag or not isinstance(error, handled):
        raise error
    return ToolMessage(
        content=_handle_tool_error(error, flag=flag),
        name=call["name"],
        tool_call_id=str(call.get("id") or ""),
        status="error",
    )
