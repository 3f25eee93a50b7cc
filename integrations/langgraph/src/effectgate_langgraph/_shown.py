"""Which approvals each interrupt showed, kept in the gate's store, never the checkpoint.

LangGraph names an interrupt after its task's place in the checkpoint (`Interrupt.id` hashes the
task's namespace, which `create_agent`'s `Send`s and any one-call-per-task graph number by
position), so an answer addressed to an interrupt id reaches whatever call the checkpoint now
puts in that task. Reversing two paused `Send`s made an approve given on the refund's card run
the credit. An answer by approval id names its call; a HumanInTheLoopMiddleware answer
(`{"decisions": [...]}` or a bare `{"type": ...}`) names none.

So when a step pauses, the gate's log records what the interrupt showed (`SHOWN`: its id and each
listed approval's id, version and args hash, in the payload's order, sealed with the gate's
keyring). A HITL answer is applied only if every sealed record under the interrupt it answers
shows exactly the calls now waiting, in the same order, at the same versions and args hashes
(the order is the store's event log's, which a database writer could change); otherwise it is
refused whole: nothing is applied, nothing runs, the approvals stay pending, and the next
payload's `refused` says why. That holds for a plain
`Command(resume=answer)` too: it answers the task's next interrupt slot, whose id LangGraph
derives as it does for the one it raises (`_hitl.provenance`). Editing the paused call in the
checkpoint (`update_state`) starts a new task, whose interrupt no record shows, so the answer is
refused, never applied to what the checkpoint holds now. An answer by approval id is not
affected (its decisions name their approvals, and a token binds version and args hash).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt

from effectgate import CallContext, EffectGate
from effectgate.adapter import TamperedState, sign_state, verify_state
from effectgate.redact import MARK, entries, entry_sealed, is_redacted
from effectgate.stores.records import RedactedRow

from ._decisions import ApprovalPayload, Waiting
from ._hitl import HOW_TO_ANSWER, is_hitl, next_slot, provenance, slot_interrupt_id

#: The event kind of an interrupt's record (detail: `interrupt_id`, `shown`).
SHOWN = "langgraph_interrupt_shown"
#: The event kind of a pause answered from the resume map by approval id (detail: `interrupt_id`,
#: `slot`, `approval_ids`, sealed as `SHOWN` is): the task's answer slot it was raised at was left
#: for the task's next interrupt().
ANSWERED_BY_ID = "langgraph_interrupt_answered_by_id"
# LangGraph reads a resume dict whose keys all look like xxh3 digests (32 lowercase hex) as a
# map from interrupt id to value. effectgate's default approval ids have that shape too, so a
# plain `Command(resume={approval_id: decision})` lands in this config entry instead of reaching
# `interrupt()`. Reading our own approval ids from it keeps that documented form working.
_RESUME_MAP_KEY = "__pregel_resume_map"
# The task's answers in order, and its namespace (as `_hitl` reads them).
_SCRATCHPAD_KEY = "__pregel_scratchpad"
_NS_KEY = "checkpoint_ns"

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
    """What an `Ask` got back; `newest`: brought by this invoke's resume, not replayed from the
    checkpoint (`_hitl.provenance`; an answer by approval id: `_brought`); `interrupt_id`: the
    interrupt a newest HITL answer was given for, addressed or not, raised at the task's answer
    `slot` (checked against the store by `refusal`); `unconfirmed`: why a HITL answer could be
    told neither way (it is refused); `kept`: False for an answer read from the resume map,
    of which the checkpoint keeps no copy for the step's next run."""

    value: object
    newest: bool = True
    interrupt_id: str | None = None
    slot: int = 0
    unconfirmed: str | None = None
    kept: bool = True


def shown(waiting: Sequence[Waiting]) -> Shown:
    """What a payload listing `waiting` shows of each call: approval id, version, args hash, in
    the payload's order (a positional answer is applied in the order the reviewer saw)."""
    return [[w.pending.approval_id, w.pending.version, w.pending.card.args_hash] for w in waiting]


def _sealed(session_id: str, interrupt_id: object, slot: object, calls: object) -> dict[str, Any]:
    """What a record's seal covers: the store's event log is not sealed, and its order of the
    calls (`_hitl.in_proposal_order`) decides which call a positional answer reaches."""
    return {"session_id": session_id, "interrupt_id": interrupt_id, "slot": slot, "shown": calls}


def record(gate: EffectGate, pauses: Pauses) -> None:
    """After a run of the step that paused: its pauses answered from the resume map
    (`note_mapped`), then each interrupt it raised (`record_shown`), in that order."""
    note_mapped(gate, pauses.mapped)
    for raised in pauses.raised:
        record_shown(gate, *raised)


def record_shown(
    gate: EffectGate, raised: GraphInterrupt, calls: Shown, ctx: CallContext, slot: int | None
) -> None:
    """Record in the gate's log what the interrupt `raised` carries showed, and the task's answer
    slot it was raised at (LangGraph 1.2.15 gives every interrupt of a task the same id). The
    record also lists the approvals it showed (`approval_ids`), so retention keeps it while any
    of them is open (`effectgate.stores._redaction.Call.named`): the answer is checked against it."""
    approval_ids = sorted({str(c[0]) for c in calls})
    for intr in raised.args[0] if raised.args and isinstance(raised.args[0], tuple) else ():
        interrupt_id = getattr(intr, "id", None)
        if isinstance(interrupt_id, str):
            seal = sign_state(gate, "langgraph.shown", _sealed(ctx.session_id, interrupt_id, slot, calls))
            gate.note(
                SHOWN,
                ctx=ctx,
                interrupt_id=interrupt_id,
                slot=slot,
                shown=calls,
                approval_ids=approval_ids,
                seal=seal,
            )


def refusal(gate: EffectGate, interrupt_id: str, slot: int, calls: Shown, session_id: str) -> str | None:
    """Why a HITL answer to `interrupt_id`, raised at the task's answer `slot`, must not be
    applied to `calls` (None: it may). The records are the session's (the thread's): one read of
    its pauses, not of every thread's. A record without a slot (an earlier release) counts for
    every slot of its interrupt. Only a record whose seal verifies counts, and it must show the
    calls in the order they wait now: the order comes from the store's event log, which the
    keyring does not seal, so a reordered log cannot move a decision onto another call."""
    details = [_detail(e.detail_json) for e in gate.store.events(kind=SHOWN, session_id=session_id)]
    seen = [
        d.get("shown")
        for d in details
        if d.get("interrupt_id") == interrupt_id
        and d.get("slot") in (None, slot)
        and _verified(gate, session_id, d)
    ]
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


#: A raised interrupt, what it showed and its answer slot, recorded by the driver (off the loop).
Raised = tuple[GraphInterrupt, Shown, CallContext, int | None]
#: A pause answered from the resume map: the run, the task's namespace, the slot left unused and
#: the approvals it listed.
Mapped = tuple[CallContext, str, int, frozenset[str]]


@dataclass
class Pauses:
    """What one run of a step's driver notes of its pauses (`asker`), recorded by `record` and
    `skip_answered`: the interrupts it raised, the pauses answered from the resume map, and how
    many times it called interrupt()."""

    raised: list[Raised] = field(default_factory=list)
    mapped: list[Mapped] = field(default_factory=list)
    asked: int = 0


def asker(pauses: Pauses) -> Callable[[Ask], Answer]:
    """`interrupt()`, noting each raised interrupt in `pauses.raised` (the driver records it), how
    many times it was called in `pauses.asked`, and the interrupt a HITL answer answers, except
    that a plain `{approval_id: decision}` resume is read once from the run's resume map (see
    `_RESUME_MAP_KEY`); that answer takes no answer slot of the task, so the slot the step's
    pause was raised at is noted in `pauses.mapped` (recorded by `note_mapped`)."""
    used = False

    def ask(op: Ask) -> Answer:
        nonlocal used
        if not used:
            used = True
            conf = get_config().get("configurable", {})
            resume_map = conf.get(_RESUME_MAP_KEY)
            if isinstance(resume_map, Mapping):
                picked = {k: v for k, v in resume_map.items() if k in op.approval_ids}
                if picked:
                    if (slot := next_slot()) is not None and isinstance(ns := conf.get(_NS_KEY), str):
                        pauses.mapped.append((op.ctx, ns, slot, op.approval_ids))
                    return Answer(picked, kept=False)
        pauses.asked += 1
        try:
            value = interrupt(op.payload)
        except GraphInterrupt as exc:
            pauses.raised.append((exc, op.shown, op.ctx, next_slot()))
            raise
        if not is_hitl(value):
            return Answer(value, newest=_brought(value))
        came = provenance(value)
        return Answer(
            value,
            newest=came.interrupt_id is not None,
            interrupt_id=came.interrupt_id,
            slot=came.slot,
            unconfirmed=came.unconfirmed,
        )

    return ask


def _brought(value: object) -> bool:
    """Whether an answer by approval id was brought by this invoke's resume (False: one of the
    task's answers kept in the checkpoint, a replay or a write put there by whoever can write
    it: `_step` applies only its grant tokens, which vouch for themselves). Where LangGraph's
    bookkeeping cannot tell, it counts as brought: the token's and the store's checks still hold."""
    try:
        came = provenance(value)
    except RuntimeError:
        return True
    return came.interrupt_id is not None or came.unconfirmed is not None


def _position(asked: int) -> int:
    """How many interrupt() calls the task made so far (the answer slot its next one takes): its
    scratchpad's counter, read without advancing it, so an outer middleware's interrupt() before
    the step's counts too. Where LangGraph keeps it otherwise: the step's own, `asked`."""
    pad = get_config().get("configurable", {}).get(_SCRATCHPAD_KEY)
    counter = getattr(getattr(pad, "interrupt_counter", None), "_counter", False)
    if counter is None:  # LangGraph's lazy counter, not started: no interrupt() yet
        return 0
    found = re.fullmatch(r"count\((\d+)\)", repr(getattr(counter, "__self__", None)))
    return int(found.group(1)) if found else asked


def _unasked(asked: int) -> tuple[str, str, int] | None:
    """The task's thread, namespace and number of answers when it holds more than the `asked`
    interrupt() calls the task made so far (`_position`): None otherwise."""
    conf = get_config().get("configurable", {})
    answers = getattr(conf.get(_SCRATCHPAD_KEY), "resume", None)
    ns, thread = conf.get(_NS_KEY), conf.get("thread_id")
    if not isinstance(answers, list) or len(answers) <= asked or not isinstance(ns, str) or thread is None:
        return None
    return str(thread), ns, len(answers)


def note_mapped(gate: EffectGate, mapped: Sequence[Mapped]) -> None:
    """Record that the step's pause at each slot of `mapped` was answered by approval id from
    the resume map: the slot holds no answer of the step, and the task's next interrupt() (a
    tool's own question) is raised there and answered there (`_step_slots`). The record lists
    the approvals the pause showed, so retention keeps it as long as the pause's own (`record`)."""
    for ctx, ns, slot, approval_ids in mapped:
        interrupt_id = slot_interrupt_id(ns, slot)
        listed = sorted(approval_ids)
        seal = sign_state(gate, _PURPOSE[ANSWERED_BY_ID], _sealed(ctx.session_id, interrupt_id, slot, listed))
        gate.note(
            ANSWERED_BY_ID, ctx=ctx, interrupt_id=interrupt_id, slot=slot, approval_ids=listed, seal=seal
        )


def _step_slots(
    gate: EffectGate, session_id: str, ns: str, approvals: frozenset[str] = frozenset()
) -> set[int]:
    """The answer slots of the task `ns` at which the step paused (its records, `record`) and
    whose answer is the step's: not a pause answered by approval id from the resume map after
    it (`note_mapped`), whose slot the task's next interrupt() took. Only sealed records count:
    the event log is not sealed, and a record added there would hand the step's answer (a grant
    token) to the task's next interrupt(). With the step's `approvals`, a record listing none of
    them is another step's (a call an outer middleware made after it, in the same task), whose
    answer is that step's to apply; an erased record lists none and counts."""
    events = sorted(
        (e for kind in (SHOWN, ANSWERED_BY_ID) for e in gate.store.events(kind=kind, session_id=session_id)),
        key=lambda e: e.id or 0,
    )
    slots: dict[int, bool] = {}
    erased: dict[tuple[str, str, str], RedactedRow] | None = None
    for e in events:
        d = _detail(e.detail_json)
        slot = d.get("slot")
        if not isinstance(slot, int) or d.get("interrupt_id") != slot_interrupt_id(ns, slot):
            continue
        if is_redacted(e.detail_json):  # erased by retention (its seal too): its entry vouches
            erased = entries(gate.store) if erased is None else erased
            if not _erased(gate, erased.get(("eg_events", str(e.id), "detail_json")), d):
                continue
        elif not _verified(gate, session_id, d, e.kind):  # an unsealed record moves no answer
            continue
        if approvals and (listed := _listed(d, e.kind)) and not approvals & listed:
            continue
        slots[slot] = e.kind == SHOWN
    return {slot for slot, paused in slots.items() if paused}


def _erased(gate: EffectGate, entry: RedactedRow | None, marked: Mapping[str, Any]) -> bool:
    """Whether an erased record's `marked` detail is what `redact` left: its entry is sealed with
    the gate's keyring and holds the marker's redaction id and kept facts."""
    if entry is None or not entry_sealed(gate.keyring, entry):
        return False
    facts = {k: v for k, v in marked.items() if k != MARK}
    return entry.redaction_id == marked.get(MARK) and entry.kept_json == json.dumps(facts, sort_keys=True)


def _take(asked: int, slots: set[int], answered: int) -> None:
    """Take, without applying, the answers at the step's own slots from the task's position
    `asked` on (`_position`): LangGraph matches a task's answers to its interrupt() calls by
    order, and a step settled from the store asks fewer times than it paused, so a tool's own
    interrupt() in the same task would be handed
    an answer given to the gate (an approval's grant token) instead of its own. A pause not
    answered yet is left alone (`answered`: the task's stored answers)."""
    while asked in slots and asked < answered:
        interrupt(None)  # the slot holds an answer: it is returned, nothing is raised
        asked += 1


def skip_answered(gate: EffectGate, pauses: Pauses, approvals: frozenset[str] = frozenset()) -> None:
    """After a settled step (its calls' `approvals`): the answers its earlier pauses got that this
    run did not ask for (this run's pauses answered from the resume map are recorded first,
    `note_mapped`)."""
    note_mapped(gate, pauses.mapped)
    if (where := _unasked(at := _position(pauses.asked))) is not None:
        _take(at, _step_slots(gate, *where[:2], approvals), where[2])


async def askip_answered(gate: EffectGate, pauses: Pauses, approvals: frozenset[str] = frozenset()) -> None:
    """`skip_answered`, the store work in a worker thread."""
    await asyncio.to_thread(note_mapped, gate, pauses.mapped)
    if (where := _unasked(at := _position(pauses.asked))) is not None:
        _take(at, await asyncio.to_thread(_step_slots, gate, *where[:2], approvals), where[2])


#: The seal's purpose of each kind of record, and the detail field holding the calls it lists.
_PURPOSE = {SHOWN: "langgraph.shown", ANSWERED_BY_ID: "langgraph.answered_by_id"}
_CALLS = {SHOWN: "shown", ANSWERED_BY_ID: "approval_ids"}


def _listed(detail: Mapping[str, Any], kind: str) -> frozenset[str]:
    """The approval ids a verified record lists (the field its seal covers)."""
    calls = detail.get(_CALLS[kind])
    if not isinstance(calls, list):
        return frozenset()
    return frozenset(str(c[0] if isinstance(c, list) and c else c) for c in calls)


def _verified(gate: EffectGate, session_id: str, detail: Mapping[str, Any], kind: str = SHOWN) -> bool:
    calls = detail.get(_CALLS[kind])
    fields = _sealed(session_id, detail.get("interrupt_id"), detail.get("slot"), calls)
    try:
        verify_state(gate, _PURPOSE[kind], fields, detail.get("seal"))
    except (TamperedState, RecursionError):
        return False
    return True


def _detail(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = [
    "ANSWERED_BY_ID",
    "SHOWN",
    "Answer",
    "Ask",
    "Mapped",
    "Pauses",
    "Raised",
    "Shown",
    "asker",
    "askip_answered",
    "note_mapped",
    "record",
    "record_shown",
    "refusal",
    "shown",
    "skip_answered",
]
