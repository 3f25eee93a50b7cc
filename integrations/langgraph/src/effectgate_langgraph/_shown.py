"""Which approvals each interrupt showed, kept in the gate's store, never the checkpoint.

LangGraph names an interrupt after its task's place in the checkpoint (`Interrupt.id` hashes the
task's namespace, which `create_agent`'s `Send`s and any one-call-per-task graph number by
position), so an answer addressed to an interrupt id reaches whatever call the checkpoint now
puts in that task. Reversing two paused `Send`s made an approve given on the refund's card run
the credit. An answer by approval id names its call; a HumanInTheLoopMiddleware answer
(`{"decisions": [...]}` or a bare `{"type": ...}`) names none.

So when a step pauses, the gate's log records what the interrupt showed (`SHOWN`: its id and each
listed approval's id, version and args hash). A HITL answer is applied only if every record under
the interrupt it answers shows exactly the calls now waiting, at the same versions and args
hashes; otherwise it is refused whole: nothing is applied, nothing runs, the approvals stay
pending, and the next payload's `refused` says why. An answer by approval id is not affected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt

from effectgate import CallContext, EffectGate

from ._decisions import ApprovalPayload, Waiting
from ._hitl import HOW_TO_ANSWER, is_hitl, is_newest_answer

#: The event kind of an interrupt's record (detail: `interrupt_id`, `shown`).
SHOWN = "langgraph_interrupt_shown"
# LangGraph's config keys for the task's namespace and answers (langgraph._internal._constants).
_NS_KEY = "checkpoint_ns"
_SCRATCHPAD_KEY = "__pregel_scratchpad"

# LangGraph reads a resume dict whose keys all look like xxh3 digests (32 lowercase hex) as a
# map from interrupt id to value. effectgate's default approval ids have that shape too, so a
# plain `Command(resume={approval_id: decision})` lands in this config entry instead of reaching
# `interrupt()`. Reading our own approval ids from it keeps that documented form working.
_RESUME_MAP_KEY = "__pregel_resume_map"

#: Each listed call as [approval id, version, args hash], sorted.
Shown = list[list[Any]]


@dataclass(frozen=True)
class Ask:
    """One pause: the payload, and what it shows of each call (`shown`) for the run `ctx`."""

    payload: ApprovalPayload
    approval_ids: frozenset[str]
    shown: Shown
    ctx: CallContext


@dataclass(frozen=True)
class Answer:
    """What an `Ask` got back; `newest`: brought by this resume, not replayed from an earlier one
    (told apart for HITL answers only, see `_hitl.is_newest_answer`); `interrupt_id`: the
    interrupt a newest HITL answer was given for (checked against the store by `refusal`)."""

    value: object
    newest: bool = True
    interrupt_id: str | None = None


def shown(waiting: Sequence[Waiting]) -> Shown:
    """What a payload listing `waiting` shows of each call: approval id, version, args hash."""
    return sorted([w.pending.approval_id, w.pending.version, w.pending.card.args_hash] for w in waiting)


def record(gate: EffectGate, raised: GraphInterrupt, calls: Shown, ctx: CallContext) -> None:
    """Record in the gate's log what the interrupt `raised` carries showed."""
    for intr in raised.args[0] if raised.args and isinstance(raised.args[0], tuple) else ():
        interrupt_id = getattr(intr, "id", None)
        if isinstance(interrupt_id, str):
            gate.note(SHOWN, ctx=ctx, interrupt_id=interrupt_id, shown=calls)


def answered_interrupt(value: object) -> str | None:
    """The id of the interrupt the newest answer `value` of this task was addressed to (the
    task's last slot); None for `Command(resume=value)`, addressed to no interrupt (LangGraph
    refuses it while several interrupts are pending; the node orders one task's calls itself)."""
    conf = get_config().get("configurable", {})
    null_resume = getattr(conf.get(_SCRATCHPAD_KEY), "get_null_resume", None)
    if callable(null_resume) and null_resume(False) is value:
        return None
    answers = getattr(conf.get(_SCRATCHPAD_KEY), "resume", None)
    ns = conf.get(_NS_KEY)
    if not isinstance(answers, list) or not answers or not isinstance(ns, str):
        raise RuntimeError(
            "this LangGraph keeps no per-task answers where effectgate_langgraph reads them, so "
            f"the interrupt a HumanInTheLoopMiddleware answer was given for is unknown; {HOW_TO_ANSWER}"
        )
    return _slot_interrupt_id(ns, len(answers) - 1)


def _slot_interrupt_id(ns: str, answered: int) -> str:
    """The id LangGraph gave the interrupt of a task's slot `answered` (its private rule: newer
    releases suffix the slot, before that every interrupt of a task was named after its namespace,
    which is also the first slot's id now)."""
    try:
        from langgraph.types import _interrupt_id
    except ImportError:  # LangGraph before `_interrupt_id` (1.2.15, the lowest supported)
        from xxhash import xxh3_128_hexdigest

        return xxh3_128_hexdigest(ns.encode())
    return _interrupt_id(ns, answered)


def refusal(gate: EffectGate, interrupt_id: str, calls: Shown, session_id: str) -> str | None:
    """Why a HITL answer to `interrupt_id` must not be applied to `calls` (None: it may). The
    records are the session's (the thread's): one read of its pauses, not of every thread's."""
    details = [_detail(e.detail_json) for e in gate.store.events(kind=SHOWN, session_id=session_id)]
    seen = [d.get("shown") for d in details if d.get("interrupt_id") == interrupt_id]
    if seen and all(s == calls for s in seen):
        return None
    what = (
        "the gate's store has no record of what it showed"
        if not seen
        else "it showed other calls (or versions) than the ones now waiting in its task"
    )
    return (
        f"this HumanInTheLoopMiddleware answer was given for interrupt {interrupt_id}, and {what}: "
        "the checkpoint may no longer put there the call the reviewer saw, so no decision was "
        f"applied; answer this payload's interrupt, or {HOW_TO_ANSWER}"
    )


#: A raised interrupt and what it showed, recorded by the driver (off the event loop).
Raised = tuple[GraphInterrupt, Shown, CallContext]


def asker(raised: list[Raised]) -> Callable[[Ask], Answer]:
    """`interrupt()`, noting each raised interrupt in `raised` (the driver records it) and the
    interrupt a HITL answer answers, except that a plain `{approval_id: decision}` resume is
    read once from the run's resume map (see `_RESUME_MAP_KEY`)."""
    used = False

    def ask(op: Ask) -> Answer:
        nonlocal used
        if not used:
            used = True
            resume_map = get_config().get("configurable", {}).get(_RESUME_MAP_KEY)
            if isinstance(resume_map, Mapping):
                picked = {k: v for k, v in resume_map.items() if k in op.approval_ids}
                if picked:
                    return Answer(picked)
        try:
            value = interrupt(op.payload)
        except GraphInterrupt as exc:
            raised.append((exc, op.shown, op.ctx))
            raise
        if not is_hitl(value):
            return Answer(value)
        if not is_newest_answer(value):
            return Answer(value, newest=False)
        return Answer(value, interrupt_id=answered_interrupt(value))

    return ask


def _detail(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = [
    "SHOWN",
    "Answer",
    "Ask",
    "Raised",
    "Shown",
    "answered_interrupt",
    "asker",
    "record",
    "refusal",
    "shown",
]
