"""The flow drivers' errors (`effectgate.flow` re-exports them), and what the drivers do with a
tool's job that could not run as asked: its StopIteration, a job its executor refused."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import OutcomeUnknown

RETURNED = (
    "the tool returned an awaitable, which call/execute cannot await while an event loop is running "
    "(call such a tool with acall/aexecute): "
)
T = TypeVar("T")
_SHUT = "the event loop's default executor is shut down: the call's "


class NotStarted(RuntimeError):
    """A tool that never started: its coroutine refused on a running loop before its first step
    (from a plain function that returns one), or its job refused or dropped unrun by a shut-down
    executor. Nothing ran, so its record is a definite failure, not an unknown outcome."""


class Unfinished(OutcomeUnknown, RuntimeError):
    """A tool's awaitable left unfinished: started but refused on a loop, or cancelled from within."""


class Abandoned(RuntimeError):
    """Raised before a claim in a flow its task left to a worker thread (cancelled, interrupted):
    the outcome of the tool that ran is stored (`_Worker`), and nothing more is claimed."""


def stopped(stop: StopIteration) -> RuntimeError:
    """A tool's StopIteration (`next()` on an empty iterator), raised as the RuntimeError a
    coroutine tool's is: it cannot cross a Future (the async driver's task would wait for ever)."""
    error = RuntimeError("the tool raised StopIteration")
    error.__cause__ = stop
    return error


def dropped(tool: bool, outcome: bool, call: Callable[[], Any]) -> Any:
    """An async flow's job (`call`) its shut-down executor refused or dropped unrun, the call not
    cancelled: a tool never starts (`NotStarted`, which the flow records as a definite failure); a
    store step that stores a tool's outcome runs here, on the loop; any other step is refused
    (nothing of it ran, and nothing more is claimed)."""
    if tool:
        raise NotStarted(_SHUT + "tool was refused before it started: it never ran (recorded failed)")
    if not outcome:
        raise RuntimeError(_SHUT + "store work was refused before it started: nothing of it ran")
    return call()


def ran(value: T) -> T:
    """A write or gated tool's return value, unless it is work the gate never runs: a coroutine
    (an async tool that returned one unawaited), a generator or an async generator (a plain
    function returning one, a generator function behind a decorator) not run to its end, or a
    pending Future (a task, a thread pool's job) the tool handed its work to. The
    tool's own body ran, the returned work did not (or only partly): an unknown outcome
    (`Unfinished`), the work closed if it never started. Before, the call was recorded executed
    (`{"unserializable": "coroutine"}`), or the result's serialization ran a generator's body."""
    work: Any = value
    state: str
    if type(work) in PLAIN:  # the usual result: no inspection
        return value
    if inspect.iscoroutine(work):
        state = inspect.getcoroutinestate(work)
    elif inspect.isgenerator(work):
        state = inspect.getgeneratorstate(work)
    elif inspect.isasyncgen(work) and work.ag_frame is not None:
        state = "SUSPENDED"  # not closed here either way: its `aclose()` is to be awaited
    elif asyncio.isfuture(work) or isinstance(work, concurrent.futures.Future):
        # work handed to a task, a pool: run only once done with a result (a cancelled job never
        # ran, a failed one is no result: neither is recorded run)
        state = "CLOSED" if work.done() and not work.cancelled() and work.exception() is None else "PENDING"
    else:
        return value
    if state.endswith("CLOSED"):  # it ran to its end (or its error) in the tool
        return value
    if state.endswith("CREATED"):
        work.close()  # never started: nothing of it runs later, nor is warned about as never awaited
    raise Unfinished(f"the tool returned a {type(work).__name__} it did not run to its end")


#: The types of the usual result, which neither `ran` nor `flow.run_sync` inspects.
PLAIN = frozenset({dict, list, str, int, float, bool, type(None), tuple})


def foreign(value: object) -> None:
    """`Unfinished` for a pending Future of another event loop (a tool that handed its work to a
    loop of its own, in another thread): it cannot be awaited on this one, and its work may still
    land. Before, awaiting it raised a plain RuntimeError, which a write takes for a definite
    failure: the record ended `failed`, and the same call again ran the tool a second time."""
    if asyncio.isfuture(value) and not value.done() and value.get_loop() is not asyncio.get_running_loop():
        raise Unfinished("the tool returned a pending Future of another event loop (its outcome is unknown)")
