"""The flow drivers' errors (`effectgate.flow` re-exports them), and what the drivers do with a
tool's job that could not run as asked: its StopIteration, a job its executor refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import OutcomeUnknown

RETURNED = (
    "the tool returned an awaitable, which call/execute cannot await while an event loop is running "
    "(call such a tool with acall/aexecute): "
)
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
