"""Decisions made from an event loop (`aapprove`, `adeny`): in a worker thread, which a cancelled
task cannot stop, so a decision's transaction may commit after its caller was cancelled.

A grant committed so is one whose token nobody holds (only its hash is stored): the approval
would stay approved, and approving it again `AlreadyDecided`, until the grant lapsed. So a
cancelled decision waits for its thread (shielded: a cancellation cannot stop it), voids a grant
it minted (`_release.release`: a sealed `release` decision of its round, and its stored expiry
set to now; a lapsed grant may be granted again, by a new round of approvers), and then raises
its CancelledError with a note of what landed: the grant voided, a partial approval, a denial
(final: nothing runs). A task closed without being resumed (its loop stopped) leaves the voiding
to the thread. A job the loop's executor refused or dropped unrun decided nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ._logging import logger
from .errors import TokenError
from .outcomes import Grant, PartialApproval, Recorded, Refused

D = TypeVar("D")
log = logger("effectgate._decisions")
_SHUT = "the event loop's default executor is shut down: nothing was decided"
#: How `void` releases a grant (`_release.release`): the sealed decision's reason, the event.
VOIDED = {
    "why": "its aapprove was cancelled: never handed out",
    "kind": "grant_voided",
    "reason": "cancelled",
}


def void(release: Callable[[str], None], decision: object) -> bool:
    """Void a grant a cancelled `aapprove` minted (nobody holds its token) through `release`
    (`_release.release`, recording `grant_voided`). False where it is not that grant any more
    (presented, replaced, lapsed: `release` refuses it) or the decision was no grant."""
    if not isinstance(decision, Grant):
        return False
    try:
        release(decision.token)
    except TokenError:
        return False
    log.warning("grant voided (its aapprove was cancelled): approval=%s", decision.approval_id)
    return True


def _undone(undo: Callable[[D], bool], decision: D) -> bool:
    try:
        return undo(decision)
    except Exception:  # the grant stays as it landed: lapsing at its expiry
        log.warning("a cancelled decision could not be undone", exc_info=True)
        return False


def _note(decision: object, voided: bool) -> str:
    if isinstance(decision, Grant):
        if voided:
            return f"approval {decision.approval_id} was granted, and the grant voided: approve it again"
        return f"approval {decision.approval_id} was granted; its grant could not be voided"
    if isinstance(decision, PartialApproval | Recorded):
        done = f"{decision.approvals} of {decision.required}"
        return f"approval {decision.approval_id}: this approval was recorded ({done})"
    if isinstance(decision, Refused):
        return f"approval {decision.approval_id} was denied (final)"
    return "the decision landed"


async def decided(decide: Callable[[], D], undo: Callable[[D], bool]) -> D:
    """`decide()` in a worker thread; if the task is cancelled meanwhile, wait for it, `undo` what
    it decided (a grant) and raise the CancelledError with a note saying what landed."""
    lock, left, done = threading.Lock(), [False], list[D]()

    def job() -> D:
        decision = decide()
        with lock:
            done.append(decision)
            if not left[0]:
                return decision
        _undone(undo, decision)  # the task was closed before it could take it
        return decision

    loop = asyncio.get_running_loop()
    try:
        fut = loop.run_in_executor(None, functools.partial(contextvars.copy_context().run, job))
    except RuntimeError as exc:
        raise RuntimeError(_SHUT) from exc
    try:
        return await asyncio.shield(fut)
    except GeneratorExit:  # closed, never to be resumed: the thread undoes (or here, if it ended)
        with lock:
            left[0], untaken = True, list(done)
        for decision in untaken:
            _undone(undo, decision)
        raise
    except asyncio.CancelledError as cancelled:
        task = asyncio.current_task()
        if fut.cancelled() and task is not None and not task.cancelling():
            raise RuntimeError(_SHUT) from cancelled  # dropped unrun by its executor
        await _waited(fut)
        if fut.cancelled() or fut.exception() is not None:
            raise  # nothing decided
        decision = fut.result()
        voided = False
        if isinstance(decision, Grant):
            try:
                undone = loop.run_in_executor(None, _undone, undo, decision)
            except RuntimeError:  # the executor shut down meanwhile: here, now
                voided = _undone(undo, decision)
            else:
                await _waited(undone)
                voided = not undone.cancelled() and undone.result()
        cancelled.add_note(_note(decision, voided))
        raise


async def _waited(fut: asyncio.Future[Any]) -> None:
    """Wait for `fut` to end, whatever cancels the task meanwhile (its caller's cancellation is
    raised after, once)."""
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({fut})
