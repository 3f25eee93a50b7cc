"""Running one state machine both synchronously and on an event loop.

The gate writes each operation once, as a generator (a `Flow`) that yields an `Invoke` whenever
it needs a tool (or a check) to run and receives the tool's return value (or its exception) back.
The sync driver runs everything inline; the async one runs the store work between yields in a
worker thread (the event loop never waits on the database) and awaits coroutine tools on the loop.

Adapters compose the gate's flows (`gate.flows`) into their own with `yield from`, and may yield
requests of their own (LangGraph's "ask a person" pause): the drivers send back what
`other(request)` returns for a request that is not an `Invoke` (what it raises propagates).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from ._flowjobs import PLAIN, RETURNED, dropped, foreign, stopped
from ._flowjobs import Abandoned as Abandoned
from ._flowjobs import NotStarted as NotStarted
from ._flowjobs import Unfinished as Unfinished
from ._logging import logger
from ._rowcheck import is_async
from .context import ToolContext
from .errors import EffectGateError

T = TypeVar("T")
_log = logger("effectgate._execution")  # a raising handler must not skip _abandon


class Invoke:
    """Run `fn(**args)` (plus the ToolContext parameters it declares) and send back the result (a
    plain slotted class, not a dataclass: one is built per tool call on the read hot path)."""

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

_ASYNC_ON_LOOP = "this tool is async and an event loop is running: use acall/aexecute, not call/execute"

#: An attribute a tool function may carry: a callable that raises where the tool cannot run at
#: all (an adapter's native tool outside the framework's own call), checked before anything is
#: claimed, so no grant is spent on a run that could not start (and none recorded as unknown).
READY_CHECK = "_effectgate_ready"


def refuse_async_on_loop(fn: Callable[..., Any]) -> None:
    """Raise RuntimeError, before anything is claimed, where `drive` would refuse `fn`'s
    coroutine only after the claim: an async tool driven synchronously on a thread whose event
    loop is running (a notebook cell calling `execute`). The async driver runs a flow's steps in
    worker threads, where no loop runs. First `refuse_abandoned`, then `fn`'s `READY_CHECK`."""
    refuse_abandoned()
    while isinstance(fn, functools.partial):
        fn = fn.func
    ready = getattr(fn, READY_CHECK, None)
    if ready is not None:
        ready()
    if is_async(fn):  # also behind a plain decorator (`functools.wraps`), or an async `__call__`
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(_ASYNC_ON_LOOP)


def refuse_abandoned() -> None:
    """`Abandoned` in a flow its task left to a worker thread: nothing more claimed or proposed."""
    worker = getattr(_jobs, "worker", None)
    if worker is not None and worker.abandoned:
        raise Abandoned("the call was cancelled: nothing more is claimed for it")


def run_sync(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """What `drive` does with an `Invoke`: `fn(**kwargs)`, an awaitable result run to completion
    (refused while an event loop runs on this thread)."""
    try:
        value = fn(**kwargs)
    except StopIteration as stop:
        raise stopped(stop) from stop
    if type(value) in PLAIN or not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:  # not `asyncio.run`: it
            return runner.run(_own(value))  # unsets the thread's event loop, which the caller may use
    coro = value.get_coro() if isinstance(value, asyncio.Task) else value  # a task it scheduled here
    unrun = inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
    close = getattr(value, "cancel" if unrun and coro is not value else "close", None)  # unrun: stopped
    if callable(close):
        close()
    if unrun:  # claimed already: a gated call's grant is spent, so `aexecute` would refuse it
        raise NotStarted(
            RETURNED + "it never ran and is recorded failed (a gated call's grant is spent: propose it again)"
        )
    raise Unfinished(RETURNED + "it was started and left unfinished (its outcome is unknown)")


_jobs = threading.local()  # `.worker`: the `_Worker` whose store work runs on this thread


async def _own(value: Any) -> Any:
    """Await a tool's awaitable; a CancelledError of its own, while its call was not cancelled,
    is its unknown outcome (an error), not its caller's cancellation."""
    try:
        foreign(value)  # a pending Future of another loop: its work may land (an unknown outcome)
        return await value
    except asyncio.CancelledError as exc:
        if _cancelling():
            raise
        raise Unfinished("the tool's coroutine raised CancelledError (its call was not cancelled)") from exc


Other = Callable[[Any], Any]


def _refuse_other(request: Any) -> Any:
    raise TypeError(f"this flow yielded {request!r}, which only an adapter's driver can answer")


def drive(flow: Generator[Any, Any, T], *, other: Other = _refuse_other) -> T:
    """Run a flow to completion on this thread: a flow of its own, also when an abandoned async
    flow's work calls the gate (a hook), so `Abandoned` refuses none of its claims."""
    outer = getattr(_jobs, "worker", None)
    if outer is None:
        return _drive(flow, other)
    _jobs.worker = None
    try:
        return _drive(flow, other)
    finally:
        _jobs.worker = outer


def _drive(flow: Generator[Any, Any, T], other: Other) -> T:
    try:
        req = next(flow)
        while True:
            if not isinstance(req, Invoke):
                req = flow.send(other(req))
                continue
            try:
                value = run_sync(req.fn, req.kwargs())
            except Exception as exc:
                req = flow.throw(exc)
                continue
            req = flow.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    except BaseException:
        _abandon(flow)
        raise


def _abandon(flow: Generator[Any, Any, Any]) -> None:
    """A flow left at a tool that never returned (KeyboardInterrupt, a cancelled task): closed now,
    its `finally` blocks run (its lease released), not when a kept exception lets it be collected."""
    try:
        flow.close()
    except ValueError:  # running in another thread: an async flow's, left to it (`_Worker`)
        return


_DONE = object()


def _advance(step: Callable[[], Invoke]) -> Any:
    # StopIteration cannot cross a Future (asyncio turns it into RuntimeError); unwrap here.
    try:
        return step()
    except StopIteration as stop:
        return (_DONE, stop.value)


async def adrive(flow: Generator[Any, Any, T], *, other: Other = _refuse_other) -> T:
    """Run a flow with its store work in a worker thread and coroutine tools on the loop."""
    worker = _Worker(flow)
    try:
        return await _adrive(flow, other, worker)
    except BaseException:
        worker.abandon()
        raise


class _Worker:
    """The part of an async flow that runs in a worker thread (a store step, a sync tool). A task
    cancelled meanwhile cannot stop that thread: the flow is left to it, never closed under it
    (its lease would lapse while its tool still ran). A tool that ends has its outcome stored, also
    when the task ended just before taking it; a store step that ends closes the flow, one still
    queued runs only if it stores a tool's outcome (no tool starts for a cancelled call, nothing
    more is claimed: `Abandoned`). Jobs are shielded, in a copy of the context (`to_thread`)."""

    __slots__ = ("abandoned", "busy", "flow", "handover", "lock")

    def __init__(self, flow: Generator[Any, Any, Any]) -> None:
        self.flow, self.lock, self.busy, self.abandoned = flow, threading.Lock(), False, False
        self.handover: tuple[bool, Any] | None = None  # a tool's outcome the task has not taken

    async def step(self, step: Callable[[], Any], *, outcome: bool = False) -> Any:
        """Run a store step (`outcome`: it hands a tool's outcome to the flow, to be stored)."""
        return await self._run(self._step, step, outcome)

    async def tool(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
        return await self._run(self._tool, fn, kwargs)

    async def _run(self, job: Callable[..., Any], *args: Any) -> Any:
        call = functools.partial(contextvars.copy_context().run, job, *args)
        with self.lock:
            self.busy = True
        try:
            fut = asyncio.get_running_loop().run_in_executor(None, call)
        except RuntimeError:  # its executor is shut down: refused, nothing of it ran
            return self._unrun(job, args, call)
        except BaseException:
            with self.lock:
                self.busy = False
            raise
        taken = True
        try:
            return await asyncio.shield(fut)
        except (asyncio.CancelledError, GeneratorExit) as exc:  # GeneratorExit: a pending task collected
            if isinstance(exc, asyncio.CancelledError) and fut.cancelled() and not _cancelling():
                return self._unrun(job, args, call)  # dropped at shutdown
            taken = False  # a tool's outcome stays in `handover`, for `abandon`
            fut.add_done_callback(functools.partial(_retrieved, call))
            raise
        finally:
            if taken:
                with self.lock:
                    self.handover = None

    def _unrun(self, job: Callable[..., Any], args: tuple[Any, ...], call: Callable[[], Any]) -> Any:
        with self.lock:
            self.busy = False  # its executor refused or dropped it: never started (`dropped`)
        return dropped(job == self._tool, job == self._step and args[-1] is True, call)

    def _step(self, step: Callable[[], Any], outcome: bool) -> Any:
        with self.lock:
            skip = self.abandoned and not outcome  # queued when the task ended: nothing runs
        if skip:
            self._left()
            _abandon(self.flow)
            return None
        outer, _jobs.worker = getattr(_jobs, "worker", None), self
        try:
            return _advance(step)
        finally:
            _jobs.worker = outer
            if self._left():
                _abandon(self.flow)

    def _tool(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
        with self.lock:
            skip = self.abandoned
        if skip:  # queued when the task ended: no tool starts for a cancelled call
            self._left()
            _abandon(self.flow)
            return None
        try:
            value = fn(**kwargs)
        except StopIteration as stop:
            error = stopped(stop)
            self._ended(False, error)
            raise error from stop
        except BaseException as exc:
            self._ended(False, exc)
            raise
        self._ended(True, value)
        return value

    def _left(self) -> bool:
        """The thread's work ended: whether the flow was abandoned meanwhile (it is ours now)."""
        with self.lock:
            self.busy = False
            return self.abandoned

    def _ended(self, returned: bool, value: Any) -> None:
        with self.lock:
            self.busy = False
            if not self.abandoned:
                self.handover = (returned, value)  # the task's, unless it ends before taking it
                return
        self.store(returned, value)

    def store(self, returned: bool, value: Any) -> None:
        """Store a tool's outcome (its value or exception) in an abandoned flow, then close it."""
        if returned and inspect.isawaitable(value):  # an async result nobody awaits now
            unrun = inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == inspect.CORO_CREATED
            getattr(value, "close", lambda: None)()
            # nothing ran: a definite failure (`NotStarted`); else its outcome is unknown (in flight)
            returned, value = (
                False,
                NotStarted("the call was cancelled before its coroutine ran") if unrun else None,
            )
        if returned or isinstance(value, Exception):
            outer, _jobs.worker = getattr(_jobs, "worker", None), self
            try:
                (self.flow.send if returned else self.flow.throw)(value)
            except StopIteration:
                pass
            except Exception as exc:  # the flow's own refusals are recorded before they are raised
                if exc is not value and not isinstance(exc, (EffectGateError, Abandoned)):
                    _log.warning(
                        "the outcome of a cancelled call could not be stored (%s); its record is "
                        "left in flight for recover()",
                        type(exc).__name__,
                        exc_info=True,
                    )
            finally:
                _jobs.worker = outer
        _abandon(self.flow)

    def abandon(self) -> None:
        """The task ended early (cancelled, interrupted): leave the flow to the thread whose job is
        running or queued, store a tool's outcome the task did not take (store work), or close it."""
        with self.lock:
            self.abandoned = True  # whatever runs of it from now on claims nothing more
            if self.busy:
                return
            untaken, self.handover = self.handover, None
        if untaken is None:
            _abandon(self.flow)
            return
        job = functools.partial(self.store, *untaken)
        try:
            asyncio.get_running_loop().run_in_executor(None, job)
        except RuntimeError:  # no loop or executor left: here, now
            job()


def _cancelling() -> bool:
    """Whether this task's caller cancelled it (with no task: as if it had)."""
    return (task := asyncio.current_task()) is None or task.cancelling() > 0


def _retrieved(call: Callable[[], Any], fut: asyncio.Future[Any]) -> None:
    """A job left to its thread: its error is the flow's; one its executor dropped unrun runs here."""
    if not fut.cancelled():
        fut.exception()
        return
    with contextlib.suppress(Exception):  # the flow's own error, recorded before it was raised
        call()


async def _adrive(flow: Generator[Any, Any, T], other: Other, worker: _Worker) -> T:
    out = await worker.step(lambda: next(flow))
    while not (isinstance(out, tuple) and len(out) == 2 and out[0] is _DONE):
        if not isinstance(out, Invoke):
            answer = other(out)
            out = await worker.step(lambda a=answer: flow.send(a))  # type: ignore[misc]
            continue
        req: Invoke = out
        try:
            if inspect.iscoroutinefunction(req.fn):
                value = await _own(req.fn(**req.kwargs()))
            else:
                value = await worker.tool(req.fn, req.kwargs())
                if inspect.isawaitable(value):
                    value = await _own(value)
        except Exception as exc:
            out = await worker.step(lambda e=exc: flow.throw(e), outcome=True)  # type: ignore[misc]
            continue
        out = await worker.step(lambda v=value: flow.send(v), outcome=True)  # type: ignore[misc]
    return out[1]  # type: ignore[no-any-return]


def done(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Flow[T]:
    """A flow with no tool to run: `fn(*args, **kwargs)`, at its first step (store work)."""
    yield from ()  # a generator: nothing runs until the driver asks
    return fn(*args, **kwargs)
