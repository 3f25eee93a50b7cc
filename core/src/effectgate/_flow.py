"""Running one state machine both synchronously and on an event loop.

The gate writes each operation once, as a generator that yields an `Invoke` whenever it needs a
tool (or a check) to run and receives the tool's return value (or its exception) back. The sync
driver runs everything inline. The async driver runs the store work between yields in a worker
thread, so the event loop never waits on the database, and awaits coroutine tools on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from .context import ToolContext

T = TypeVar("T")


class Invoke:
    """Run `fn(**args)` (plus the ToolContext parameters it declares) and send back the result.

    A plain slotted class, not a dataclass: one is built per tool call on the read hot path."""

    __slots__ = ("args", "context_params", "fn", "tool_context")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Mapping[str, Any],
        context_params: frozenset[str] = frozenset(),
        tool_context: ToolContext | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.context_params = context_params
        self.tool_context = tool_context

    def kwargs(self) -> Mapping[str, Any]:
        if self.tool_context is None or not self.context_params:
            return self.args
        kwargs = dict(self.args)
        for name in self.context_params:
            kwargs[name] = self.tool_context
        return kwargs


Flow = Generator[Invoke, Any, T]


def _call_sync(req: Invoke) -> Any:
    value = req.fn(**req.kwargs())
    if type(value) in _PLAIN or not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(value))
    close = getattr(value, "close", None)
    if callable(close):
        close()
    raise RuntimeError(
        "this tool is async and an event loop is running: use the gate's async methods "
        "(acall, aexecute) instead of call/execute"
    )


_PLAIN = frozenset({dict, list, str, int, float, bool, type(None), tuple})


async def _await(value: Any) -> Any:
    return await value


def drive(flow: Flow[T]) -> T:
    """Run a flow to completion on this thread."""
    try:
        req = next(flow)
        while True:
            try:
                value = _call_sync(req)
            except Exception as exc:
                req = flow.throw(exc)
                continue
            req = flow.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


_DONE = object()


def _advance(step: Callable[[], Invoke]) -> Any:
    # StopIteration cannot cross a Future (asyncio turns it into RuntimeError); unwrap here.
    try:
        return step()
    except StopIteration as stop:
        return (_DONE, stop.value)


async def adrive(flow: Flow[T]) -> T:
    """Run a flow with its store work in a worker thread and coroutine tools on the loop."""
    out = await asyncio.to_thread(_advance, lambda: next(flow))
    while not (isinstance(out, tuple) and len(out) == 2 and out[0] is _DONE):
        req: Invoke = out
        try:
            if inspect.iscoroutinefunction(req.fn):
                value = await req.fn(**req.kwargs())
            else:
                value = await asyncio.to_thread(req.fn, **req.kwargs())
                if inspect.isawaitable(value):
                    value = await value
        except Exception as exc:
            out = await asyncio.to_thread(_advance, lambda e=exc: flow.throw(e))  # type: ignore[misc]
            continue
        out = await asyncio.to_thread(_advance, lambda v=value: flow.send(v))  # type: ignore[misc]
    return out[1]  # type: ignore[no-any-return]
