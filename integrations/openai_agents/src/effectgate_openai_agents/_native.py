"""The tools you already have: an SDK `FunctionTool` as the core's `NativeTool`.

    agent = gate_agent(
        Agent(name="support", tools=[get_order, refund_order]),
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
    )

`native_tool(tool)` reads the tool's name, description and `params_json_schema` (exactly what the
model is shown, so the arguments the gate validates and hashes are the ones the model was asked
for) and gives the gate a function that runs the tool itself. That function needs the SDK's
`ToolContext`, which only exists inside a call: the gated `on_invoke_tool` keeps the current call's
context in a context variable (`calling`) for as long as the gate works on that call, whether it
runs the tool at once (a read or a write) or, after approval, with the grant (`gate.aexecute`).

What the tool sees:

- its arguments are the ones the gate validated, froze and (for a gated row) bound to the
  approval, sent to the tool's own `on_invoke_tool` as JSON, so the SDK parses and validates them
  into the function's parameters as it always does; a name the function does not take (which the
  open schema of a `strict_mode=False` tool admits, and the SDK would drop) is `Invalid`, and
  arguments the SDK's model refuses when the call runs (a validator the schema cannot show, run
  after approval as the SDK runs it) are a definite failure (`ArgumentsRefused`: nothing ran);
- a first parameter typed `RunContextWrapper` (or `ToolContext`) receives the `ToolContext` of the
  SDK call that runs it: its `context` is the run context dict (with effectgate's reserved
  `"effectgate"` entry), its `tool_call_id` the SDK's call id. An approved call runs in the
  resumed run, so it sees that run's context (restored from the snapshot), not the first run's;
- a deferred operation the application executes after the run (`execute_deferred`) runs outside
  any SDK call: the parameter then sees a ToolContext made for it (`outside_run`), whose
  `context` is the one passed to `execute_deferred(..., context=...)` (default `{}`) and whose
  `tool_call_id` is the operation id;
- an exception reaches the gate first, which records the failure; then the tool's own failure
  policy applies, through the SDK's own code (`failed`): its `failure_error_function` (the SDK's
  default one unless replaced) formats it for the model, and `failure_error_function=None`
  raises it unchanged. Arguments the gate refuses (nothing ran) are the SDK's
  `ModelBehaviorError("Invalid JSON input for tool ...")` under a policy of the tool's own; under
  the SDK's default policy (which hides the error) the model is told effectgate's Invalid text,
  so it can correct the call. For a gated row the outcome of a call that raised is unknown
  (unless the row names the error in `definite_failures`): the model is told it needs
  reconciliation, whatever the tool's policy, because the effect may have happened.

A tool made from a plain (sync) function runs as the SDK runs it, in a worker thread, and the
gate knows it as a sync tool (`_run_sync`, driven by the core's async driver, `awaited`): a run
cancelled while the function runs (a request cancelled on a client disconnect) cannot stop that
thread, so, as for any sync tool, the call keeps its lease until the function returns and its
outcome is stored.

The tool's own `needs_approval` can only add a pause (`check_own_approval`): a gated row pauses
every new call whatever the tool's predicate says, and a read or write row, which effectgate never
pauses, refuses a tool that asks for approval (`TableError` when it is wrapped).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import inspect
import json
import keyword
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from agents import FunctionTool, _debug
from agents.exceptions import ModelBehaviorError
from agents.tool import (
    default_tool_error_function,
    maybe_invoke_function_tool_failure_error_function,
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext

from effectgate import EffectGate, Executed, Invalid, Outcome
from effectgate.errors import EffectGateError, TableError
from effectgate.flow import READY_CHECK, NotStarted
from effectgate.rows import NativeTool


@dataclasses.dataclass
class Call:
    """The SDK call the gate is working on: its ToolContext, and what the native tool returned
    when it ran in this call (mutated from the worker thread a sync call runs in)."""

    ctx: ToolContext[Any]
    ran: bool = False
    output: Any = None


#: `json.dumps(..., ensure_ascii=False, default=str)`, built once (dumps builds one per call).
_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
_CURRENT: ContextVar[Call | None] = ContextVar("effectgate_openai_agents_call", default=None)


@contextlib.contextmanager
def calling(ctx: ToolContext[Any]) -> Iterator[Call]:
    """Make `ctx` the current call's ToolContext (for native tools) while the gate works on it."""
    call = Call(ctx)
    token = _CURRENT.set(call)
    try:
        yield call
    finally:
        _CURRENT.reset(token)


def model_output(outcome: Outcome) -> Any:
    """What the SDK is given as the tool's output. A native tool that ran in this call: its own
    return value, as a plain FunctionTool gives it (the SDK turns typed outputs, `ToolOutputImage`
    and lists of them, into their items and anything else into text). A stored result (a replay)
    or a table row's function: its text, JSON without escaping non-ASCII."""
    call = _CURRENT.get()
    if isinstance(outcome, Executed):
        if call is not None and call.ran and not outcome.replay:
            return call.output
        if not isinstance(outcome.result, str):
            return _JSON.encode(outcome.result)
    return outcome.for_model()


def outside_run(
    tool: str, call_id: str, arguments: Mapping[str, Any], context: Any = None
) -> ToolContext[Any]:
    """The ToolContext a native tool sees when it runs outside an SDK run (a deferred operation)."""
    return ToolContext(
        {} if context is None else context,
        tool_name=tool,
        tool_call_id=call_id,
        tool_arguments=json.dumps(dict(arguments), separators=(",", ":")),
    )


def native_tool(tool: FunctionTool) -> NativeTool:
    """The core's view of an SDK function tool: its name, description and the JSON schema the
    model is shown, and an async function (arguments as keywords) that runs the tool itself.

    The function runs only where the adapter provides the SDK's ToolContext (a gated call of the
    tool through `gate_agent`/`gate_tools`, or `execute_deferred`); elsewhere it raises
    `EffectGateError` and runs nothing."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(
            f"native_tool takes an SDK FunctionTool (from @function_tool); got {type(tool).__name__}"
        )
    # A copy that raises instead of answering with its failure_error_function: the gate must see
    # a failure as a failure (a refund that raised is not a refund that returned an error text).
    raw = set_function_tool_failure_error_function(copy.copy(tool), None)
    name = tool.name

    def ready() -> Call:
        call = _CURRENT.get()
        if call is None:
            raise EffectGateError(
                f"{name} runs only inside its own gated call (gate_agent or gate_tools), where the "
                "SDK's ToolContext is known"
            )
        return call

    async def run_tool(**kwargs: Any) -> Any:
        call = ready()
        text = json.dumps(kwargs, separators=(",", ":"))
        _prepare(raw, call.ctx, text)  # refused: it never ran (`ArgumentsRefused`)
        output = await raw.on_invoke_tool(call.ctx, text)
        call.ran, call.output = True, output
        return output

    def run_sync_tool(**kwargs: Any) -> Any:
        return _run_sync(lambda: run_tool(**kwargs))

    # a plain function the SDK runs in a worker thread: the gate runs it as a sync tool, so a
    # cancelled run leaves it to its thread, whose outcome is stored (module docstring)
    fn = run_sync_tool if getattr(raw.on_invoke_tool, _SYNC_MARKER, False) else run_tool
    fn.__name__ = fn.__qualname__ = name
    names = _taken(tool)
    if names is not None:  # the names the gate accepts (`Invalid` otherwise: it never runs them)
        fn.__signature__ = inspect.Signature([_keyword(n) for n in names])  # type: ignore[union-attr]
    setattr(fn, _AWAITED, True)
    setattr(fn, READY_CHECK, ready)  # checked before the claim: elsewhere no grant is spent
    setattr(fn, SOURCE_ATTR, tool)  # what a row with this function runs (`_reach` checks it)
    return NativeTool(
        name=name,
        description=tool.description or name,
        schema=copy.deepcopy(tool.params_json_schema),
        fn=fn,
    )


def _taken(tool: FunctionTool) -> list[str] | None:
    """The argument names a `@function_tool`'s function takes: its schema's properties (the SDK's
    argument model of the function, which drops any other name where the schema is open,
    `strict_mode=False`: an approver would approve an argument that never runs). None for a
    FunctionTool made by hand, whose `on_invoke_tool` reads the JSON as it likes."""
    try:
        tool.__wrapped__  # noqa: B018 (raises for a tool `function_tool` did not make)
    except AttributeError:
        return None
    properties = tool.params_json_schema.get("properties")
    if not isinstance(properties, Mapping) or not all(_identifier(n) for n in properties):
        return None
    return list(properties)


def _identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _keyword(name: str) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY)


class ArgumentsRefused(NotStarted, ModelBehaviorError):
    """The SDK's argument model of a `@function_tool` refused the arguments (a validator the schema
    cannot show, whatever it raised: pydantic wraps only `ValueError` and `AssertionError`): the
    function never ran, so the gate records a definite failure (`NotStarted`), never an unknown
    outcome; the tool's failure policy sees the SDK's `ModelBehaviorError`."""

    def __init__(self, error: Exception) -> None:
        if isinstance(error, ModelBehaviorError):
            message = error.message
        else:  # a validator's own error: its type and text, as the SDK's failure policy shows them
            message = f"{type(error).__name__}: {error}"
        super().__init__(message)
        self.message = message


def _prepare(tool: FunctionTool, ctx: ToolContext[Any], text: str) -> None:
    """Prepare the arguments as the SDK's call of a `@function_tool` does before its function (its
    model, validators too), after approval as the SDK does, and hand them to that call, which then
    prepares nothing again (`ToolContext._function_tool_arguments`, 0.24): what it refuses is
    `ArgumentsRefused`. A tool made by hand prepares nothing of its own."""
    prepare = getattr(tool.on_invoke_tool, "prepare_arguments", None)
    if not callable(prepare) or getattr(ctx, "_function_tool_arguments", False) is not None:
        return
    try:
        prepared = prepare(text, tool.name)  # the SDK's data-only pass (no user code), or a placeholder
        ctx._function_tool_arguments = prepared.owner(text, tool.name) if prepared is not None else None
    except Exception as exc:  # a validator's own error escapes pydantic as itself: still unrun
        raise ArgumentsRefused(exc) from exc


#: The SDK tool a `native_tool` function runs: a row with it runs that tool, whatever tool the
#: agent holds under the row's name (`_reach.check_reach` checks both).
SOURCE_ATTR = "_effectgate_source"
#: The SDK's mark on the `on_invoke_tool` of a `@function_tool` made from a sync function (0.24).
_SYNC_MARKER = "__agents_sync_function_tool__"
_AWAITED = "_effectgate_awaited"


def awaited(fn: Any) -> bool:
    """Whether a gated call of the row function `fn` goes through the core's async driver
    (`acall` / `aexecute`): a coroutine function, or a native tool's function (a sync one runs in
    the driver's worker thread, which a cancelled run leaves to finish and store its outcome)."""
    return inspect.iscoroutinefunction(fn) or getattr(fn, _AWAITED, False) is True


class _Inline(ThreadPoolExecutor):
    """An executor that runs each job at once, in the thread that submits it (it starts none), as
    a thread of its own would run it: outside the submitting loop (the job may run one itself)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        loop = asyncio._get_running_loop()
        asyncio._set_running_loop(None)
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        finally:
            asyncio._set_running_loop(loop)
        return done

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None


_INLINE = _Inline(max_workers=1)


def _run_here(invoke: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_INLINE)  # the SDK's `asyncio.to_thread` of the function: this thread
    try:
        return loop.run_until_complete(invoke())
    finally:
        loop.close()


def _run_sync(invoke: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run the SDK's invocation of a sync function tool to its end in this (worker) thread; on a
    thread that runs an event loop (the sync API called from a coroutine), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(invoke)
    with ThreadPoolExecutor(max_workers=1) as own:
        return own.submit(contextvars.copy_context().run, _run_here, invoke).result()


def check_own_approval(gate: EffectGate, tool: FunctionTool, *, gated: bool) -> None:
    """The tool's own `needs_approval` is an escalation: it can add a pause, never remove one. A
    gated row already pauses every new call; a read or write row cannot pause (effectgate keeps no
    approval to bind the SDK's pause to), so a tool asking for approval there is a `TableError`."""
    spec = gate.table.get(tool.name)
    if tool.needs_approval is False or spec is None or gated:
        return
    raise TableError(
        tool.name,
        "needs_approval",
        f"the tool asks for approval (its own needs_approval), but its effect row is "
        f"{spec.effect.value}, which never pauses. Give it a gated row (send, money or destructive, "
        "naming the approver role; escalate= rules raise the role for some calls), or drop "
        "needs_approval from the tool",
    )


async def failed(tool: FunctionTool | None, name: str, ctx: ToolContext[Any], exc: Exception) -> Any:
    """A tool's failure, after the gate recorded it, handled as the SDK handles it for the plain
    tool (its own failure policy, through the SDK's `maybe_invoke_function_tool_failure_error_function`):
    the tool's `failure_error_function` (the SDK's default one unless replaced) formats it for the
    model, and `failure_error_function=None` raises it unchanged. A table row's function (no SDK
    tool) answers with effectgate's text."""
    if tool is None:
        return f"{name} failed: {type(exc).__name__}: {exc}"
    message = await maybe_invoke_function_tool_failure_error_function(
        function_tool=tool, context=ctx, error=exc
    )
    if message is None:
        raise exc
    return message


def own_policy(tool: FunctionTool, ctx: ToolContext[Any]) -> bool:
    """Whether the tool's failure policy is its own (a formatter, or None to raise), not the SDK's
    default formatter."""
    return resolve_function_tool_failure_error_function(tool, ctx) is not default_tool_error_function


def invalid_error(name: str, raw: str, outcome: Invalid) -> ModelBehaviorError:
    """The SDK's error for the raw arguments `raw` the gate refused (nothing ran), as the SDK words
    it: not JSON (the payload only where the SDK logs tool data), not an object, or not valid."""
    base = f"Invalid JSON input for tool {name}"
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return ModelBehaviorError(base if _debug.DONT_LOG_TOOL_DATA else f"{base}: {raw}")
    if not isinstance(parsed, Mapping):
        return ModelBehaviorError(f"{base}: expected a JSON object")
    return ModelBehaviorError(f"{base}: {outcome.message}")


__all__ = [
    "SOURCE_ATTR",
    "ArgumentsRefused",
    "Call",
    "awaited",
    "calling",
    "check_own_approval",
    "failed",
    "invalid_error",
    "model_output",
    "native_tool",
    "outside_run",
    "own_policy",
]
