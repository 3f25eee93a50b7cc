"""What a plain ToolNode would have given the model, for the calls the gate runs.

The gate decides whether a call runs and records it; how a langchain tool runs, and what its
ToolMessage looks like, stays langchain's:

- `flying(calls, config, runtimes=..., inject=...)` marks the calls the gate is about to run. A
  native tool (`gated_node`, `gated_middleware`) then runs as ToolNode runs it: its injected
  arguments are added by ToolNode's own `_inject_tool_args` from the call's `ToolRuntime`, then
  `tool.invoke(tool_call, config)`, so its pydantic arguments, its own `handle_tool_error`, its
  callbacks (`on_tool_start` / `on_tool_end` / `on_tool_error`) and its ToolMessage (status,
  content blocks, artifact) are the framework's. The gate stores the message's content; the
  ToolMessage itself is kept here, by tool call id, and is what the model receives for that run.
  A `Command` a read's tool returns is kept here too, and goes to the graph as ToolNode's would.
- `injected_keys(tool)` / `framework_keys(gate, tools)` name the arguments the framework supplies
  and the model never does; `model_call(call, keys)` drops them from a call before the gate sees
  it, so a value the model sent for one is never validated, hashed, approved, shown or stored,
  and never reaches the tool. Injected values are read when the call runs (on a resume, from the
  state of that re-run) and are never part of what was approved.
- `content_of(result)` is the ToolMessage content ToolNode makes of a return value (a string or
  content blocks as they are, anything else as JSON without escaping non-ASCII): what the model
  sees for a stored result (a replay) or a table row's function.
- `_spans.py` holds the callbacks the node fires itself (a table row's function; a call whose
  arguments the gate refused, which never reaches `tool.invoke`).
- `error_message(exc, call, flag)` applies ToolNode's `handle_tool_errors` to an exception a call
  raised through the gate: the same error ToolMessage, or the exception raised again.
- `invocation_error(tool, call, ...)` is the `ToolInvocationError` ToolNode raises for arguments
  the gate found invalid (the tool's own pydantic model over them): what the middleware answers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import pydantic
from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId
from langchain_core.tools.base import (
    _is_injected_arg_type,
    _normalize_message_content,
    _stringify,
    get_all_basemodel_annotations,
)
from langgraph.errors import is_invalid_resume
from langgraph.prebuilt.tool_node import (
    ToolInvocationError,
    ToolRuntime,
    _filter_validation_errors,
    _get_all_injected_args,
    _handle_tool_error,
    _infer_handled_types,
)
from langgraph.types import Command

from effectgate import EffectGate
from effectgate._logging import logger as guarded_logger
from effectgate.errors import NeedsReconciliation

from ._arguments import ArgumentsRefused, InvalidToolArguments

logger = guarded_logger(__name__)  # a handler that raises changes no call (effectgate._logging)

#: ToolNode's `_inject_tool_args(call, runtime, tool)`: the call with the trusted values added.
Inject = Callable[[ToolCall, ToolRuntime[Any, Any], BaseTool], ToolCall]


class ToolReportedError(Exception):
    """A tool's own error ToolMessage (its `handle_tool_error`): a failed run, answered with it."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(message.text)
        self.message = message


@dataclass
class Flight:
    """Calls the gate is about to run (by tool name), each one's ToolRuntime (by tool call id),
    and the ToolMessages and graph updates their tools produced (by tool call id). Mutated from
    the worker thread that runs a tool, read by the node."""

    calls: dict[str, ToolCall]
    config: RunnableConfig | None
    runtimes: Mapping[str, ToolRuntime[Any, Any]] = field(default_factory=dict[str, ToolRuntime[Any, Any]])
    inject: Inject | None = None
    graph_updates: bool = False  # a Command the tool returns goes to the graph (the call is a read)
    messages: dict[str, ToolMessage] = field(default_factory=dict[str, ToolMessage])
    updates: dict[str, Any] = field(default_factory=dict[str, Any])


# A ContextVar holding a mutable Flight: tools run in copies of the context (ToolNode's executor,
# the async driver's worker threads), and what they record must reach the node that set it.
_FLIGHT: ContextVar[Flight | None] = ContextVar("effectgate_langgraph_flight", default=None)


@contextmanager
def flying(
    calls: Iterable[ToolCall],
    config: RunnableConfig | None,
    *,
    runtimes: Mapping[str, ToolRuntime[Any, Any]] | None = None,
    inject: Inject | None = None,
    graph_updates: bool = False,
) -> Iterator[Flight]:
    """Mark `calls` as the ones the gate runs next, each with its ToolRuntime (by call id) and
    the injector that adds the trusted values. A gated step names each gated tool once (two calls
    of one gated tool register neither), so a tool name finds its call."""
    flight = Flight({c["name"]: c for c in calls}, config, dict(runtimes or {}), inject, graph_updates)
    token = _FLIGHT.set(flight)
    try:
        yield flight
    finally:
        _FLIGHT.reset(token)


def injected_keys(tool: BaseTool) -> frozenset[str]:
    """The arguments the framework supplies to `tool` and the model never does: every key
    ToolNode injects or strips (`InjectedState`, `InjectedStore`, `ToolRuntime`,
    `InjectedToolCallId`, any `InjectedToolArg`) and every argument langchain leaves out of the
    schema the model is shown."""
    found = _get_all_injected_args(tool)
    names = set(found.all_injected_keys) | set(found.state)
    names.update(n for n in (found.store, found.runtime) if n)
    names |= set(getattr(tool, "_injected_args_keys", frozenset()))
    full = tool.args_schema
    if isinstance(full, type) and issubclass(full, pydantic.BaseModel):
        shown_schema = tool.tool_call_schema
        shown = (
            set(shown_schema.get("properties", {}))
            if isinstance(shown_schema, dict)
            else set(getattr(shown_schema, "model_fields", {}))
        )
        names |= set(full.model_fields) - shown
    return frozenset(names)


def model_call(call: ToolCall, keys: frozenset[str] | None) -> ToolCall:
    """`call` as the gate sees it: without the injected keys (a model's value for one is dropped)."""
    if not keys or not keys & set(call["args"]):
        return call
    args = {k: v for k, v in call["args"].items() if k not in keys}
    return ToolCall(name=call["name"], args=args, id=call.get("id"), type="tool_call")


def framework_keys(gate: EffectGate, tools: Iterable[BaseTool]) -> dict[str, frozenset[str]]:
    """The injected keys of every tool name the gate or `tools` knows: a native row's tool and the
    tool offered under that name. A function of the tool name, so every task of a step (a
    sibling's registration, a re-run in another process) strips a call the same way."""
    keys: dict[str, frozenset[str]] = {}
    for spec in gate.table:
        keys[spec.name] = _NATIVE.get(spec.fn, frozenset()) if _hashable(spec.fn) else frozenset()
    for tool in tools:
        keys[tool.name] = keys.get(tool.name, frozenset()) | injected_keys(tool)
    return {name: found for name, found in keys.items() if found}


def _check(tool: BaseTool, args: Mapping[str, Any], keys: frozenset[str], call_id: Any) -> None:
    """The tool's own pydantic model over the arguments it will be invoked with (the injected
    values included, its tool call id as langchain fills it), before it runs."""
    model = tool.args_schema
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        return
    values = dict(args)
    if keys - set(values):
        hints = get_all_basemodel_annotations(model)
        for key in keys - set(values):
            hint = hints.get(key)
            if key == "tool_call_id" or (
                hint is not None and _is_injected_arg_type(hint, injected_type=InjectedToolCallId)
            ):
                values[key] = call_id
    try:
        model.model_validate(values)
    except pydantic.ValidationError as exc:
        raise InvalidToolArguments(tool.name, exc) from exc
    except Exception as exc:  # a validator's own error escapes pydantic as itself: still unrun
        raise ArgumentsRefused(tool.name, exc) from exc


def _as_call(
    tool: BaseTool, args: Mapping[str, Any], keys: frozenset[str]
) -> tuple[Any, Flight | None, str, RunnableConfig | None]:
    """What to invoke the tool with: a ToolCall with the trusted injected values inside a flight,
    the plain arguments elsewhere. Whatever was given for an injected key is dropped first."""
    flight = _FLIGHT.get()
    call = flight.calls.get(tool.name) if flight is not None else None
    given = {k: v for k, v in args.items() if k not in keys}
    if flight is None or call is None:
        if keys:
            raise InvalidToolArguments(
                tool.name,
                RuntimeError(
                    f"the tool takes arguments the graph supplies ({', '.join(sorted(keys))}), so "
                    "it runs only inside the gated node or middleware"
                ),
            )
        _check(tool, given, keys, None)
        return given, None, "", None
    call_id = str(call.get("id") or "")
    # The arguments are the gate's (the approved or edited ones), never the checkpoint's.
    value = ToolCall(name=tool.name, args=given, id=call.get("id"), type="tool_call")
    runtime = flight.runtimes.get(call_id)
    if keys:
        if runtime is None or flight.inject is None:
            raise InvalidToolArguments(tool.name, RuntimeError("no ToolRuntime for this call"))
        try:
            value = flight.inject(value, runtime, tool)
        except Exception as exc:  # no store, a missing state field: ToolNode's own errors
            raise InvalidToolArguments(tool.name, exc) from exc
        value["type"] = "tool_call"
    _check(tool, value["args"], keys, call.get("id"))
    return value, flight, call_id, runtime.config if runtime is not None else flight.config


def is_update(out: Any) -> bool:
    """A tool result that is a graph update: a Command, or a list of Commands and ToolMessages."""
    if isinstance(out, Command):
        return True
    return (
        isinstance(out, list)
        and any(isinstance(o, Command) for o in out)
        and all(isinstance(o, Command | ToolMessage) for o in out)
    )


def _ran(tool: BaseTool, flight: Flight | None, call_id: str, out: Any) -> Any:
    if flight is None:
        return out
    if isinstance(out, ToolMessage):
        flight.messages[call_id] = out
        if out.status == "error":  # the tool handled its own exception: the run failed
            raise ToolReportedError(out)
    elif is_update(out):
        if flight.graph_updates:
            flight.updates[call_id] = out
        else:
            logger.warning(
                "%s returned a Command: only a read's goes to the graph; the gate keeps its "
                "ToolMessage text, the rest of the update is dropped",
                tool.name,
            )
    return out


def invoke_tool(tool: BaseTool, args: Mapping[str, Any], keys: frozenset[str] = frozenset()) -> Any:
    """`tool.invoke` as ToolNode calls it when the gate runs a marked call (the injected values
    added to the gate's arguments); plain otherwise. `keys`: `injected_keys(tool)`."""
    value, flight, call_id, config = _as_call(tool, args, keys)
    return _ran(tool, flight, call_id, tool.invoke(value, config))


async def ainvoke_tool(tool: BaseTool, args: Mapping[str, Any], keys: frozenset[str] = frozenset()) -> Any:
    """`invoke_tool` for an async-only tool."""
    value, flight, call_id, config = _as_call(tool, args, keys)
    return _ran(tool, flight, call_id, await tool.ainvoke(value, config))


# The runners `native_tool` builds (their tool fires its own callbacks), with their injected keys.
_NATIVE: weakref.WeakKeyDictionary[Callable[..., Any], frozenset[str]] = weakref.WeakKeyDictionary()


def _hashable(fn: Callable[..., Any]) -> bool:
    try:
        hash(fn)
    except TypeError:  # an unhashable callable object: not one of ours
        return False
    return True


def mark_native(fn: Callable[..., Any], keys: frozenset[str] = frozenset()) -> None:
    _NATIVE[fn] = keys


def is_native(fn: Callable[..., Any]) -> bool:
    return _hashable(fn) and fn in _NATIVE


def content_of(result: Any) -> str | list[Any]:
    """The ToolMessage content ToolNode makes of a tool's return value."""
    normalized = _normalize_message_content(result)
    return _stringify(result) if normalized is None else normalized


def invocation_error(
    tool: BaseTool, call: ToolCall, runtime: ToolRuntime[Any, Any], inject: Inject, injected: Any
) -> ToolInvocationError | None:
    """ToolNode's `ToolInvocationError` for a call whose arguments the gate found invalid: the
    tool's own pydantic model over them, with the values ToolNode injects and without the errors
    of injected arguments (`injected`: ToolNode's `_injected_args` entry for the tool). It echoes
    `call`'s arguments, the model's own. None when that model accepts them (the gate's JSON
    schema is stricter) or the injected values cannot be supplied: the gate's text stays."""
    keys = injected_keys(tool)
    args = {k: v for k, v in call["args"].items() if k not in keys}
    given = ToolCall(name=call["name"], args=args, id=call.get("id"), type="tool_call")
    try:
        value = inject(given, runtime, tool) if keys else given
        _check(tool, value["args"], keys, call.get("id"))
    except InvalidToolArguments as exc:
        if isinstance(exc.source, pydantic.ValidationError):
            errors = _filter_validation_errors(exc.source, injected)
            return ToolInvocationError(call["name"], exc.source, dict(call["args"]), errors)
    except Exception:  # no store, a missing state field: not an argument the model can fix
        return None
    return None


def raise_injection_error(exc: BaseException) -> None:
    """ToolNode's own error (a missing store or state field, no runtime) when the values a tool's
    injected arguments need could not be supplied: ToolNode raises it before the tool runs,
    whatever `handle_tool_errors` says (a caller's wrapper around the node may still handle it)."""
    if isinstance(exc, InvalidToolArguments) and not isinstance(exc.source, pydantic.ValidationError):
        raise exc.source from exc


def error_message(exc: Exception, call: ToolCall, flag: Any) -> ToolMessage:
    """ToolNode's `handle_tool_errors` for an exception raised by a call the gate ran.

    The flag is judged on the tool's own exception (for a write whose outcome the gate could not
    know, the cause of its NeedsReconciliation; the store keeps that record either way): a type,
    a tuple of types or a typed callable handle only those types; `True`, a string or an untyped
    callable handle all. Arguments the tool's pydantic model refused are ToolNode's
    `ToolInvocationError`, which its default flag turns into an error ToolMessage; injected values
    that could not be supplied are raised (`raise_injection_error`); the error ToolMessage a tool
    made itself is its answer. Unhandled, the exception is raised again and fails the run."""
    cause = exc.__cause__ if isinstance(exc, NeedsReconciliation) else exc
    error = cause if isinstance(cause, Exception) else exc
    if isinstance(error, ArgumentsRefused):  # ToolNode sees the validator's own error
        error = error.source
    raise_injection_error(error)
    if isinstance(error, ToolReportedError):  # as ToolNode gives it, whatever the flag
        return error.message
    if isinstance(error, InvalidToolArguments):  # what ToolNode raises for arguments its tool refuses
        source = error.source
        assert isinstance(source, pydantic.ValidationError)
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
    # a resume value not fitting the tool's interrupt() response_schema fails the run (ToolNode's rule)
    if not flag or not isinstance(error, handled) or is_invalid_resume(error):
        raise error
    return _error_tool_message(error, call, flag)


def wrapper_failed(exc: Exception, call: ToolCall, flag: Any) -> ToolMessage:
    """ToolNode's rule for an exception out of a caller's wrapper: any truthy flag turns it
    into an error ToolMessage (no type filter), an invalid resume value is never handled."""
    if not flag or is_invalid_resume(exc):
        raise exc
    return _error_tool_message(exc, call, flag)


def _error_tool_message(error: Exception, call: ToolCall, flag: Any) -> ToolMessage:
    content = _handle_tool_error(error, flag=flag)
    return ToolMessage(content, name=call["name"], tool_call_id=str(call.get("id") or ""), status="error")
