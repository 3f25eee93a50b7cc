"""langchain HumanInTheLoopMiddleware's answer, `{"decisions": [...]}`, bridged to the gate.

    tools = GatedToolNode(gate, agent_id="support", native_approver=Approver("fiona", "finance"))
    graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg, context=..., version="v2")

HITL's answer names no approval and carries no grant. The step reads it as follows:

- The decisions match the payload's `action_requests` by position (the order of `requests`: the
  calls still waiting). A list of another length is refused whole: nothing is applied, and the
  next payload's `refused` says why.
- That order is never the checkpoint's: both the payload and the answer list the waiting calls
  in the order their approvals were first proposed, read from the gate's store
  (`in_proposal_order`). In an honest run that is the model's order (a step's calls are proposed
  in order at its first pause); a checkpoint whose paused tool calls were reordered after the
  pause still gets each decision applied to the call the reviewer saw at that position. When
  two or more calls wait and one has no recorded proposal (the event log was altered outside
  effectgate), there is no order the checkpoint cannot change: a positional answer is refused
  whole, and an answer by approval id still works.
- `{"type": "reject", "message"?}` always closes the approval (`gate.deny`), so the subject is
  free for other sessions. The reason is the message (langchain's own wording when none is
  given). It is recorded as the configured `native_approver` when their role may decide the
  call, else as the system identity `hitl-reject` holding the row's role: whoever may resume the
  graph may stop a call, and a rejection raises no one's privileges.
- `{"type": "approve"}` goes through `gate.approve(approval_id, version=..., approver=...)` as the
  application's `native_approver` (an `Approver`, or a function of the run's config and runtime
  context returning one), so role, version, args hash, expiry, self-approval and the two-person
  rule all hold. A `Grant` runs the call once with its token; a `PartialApproval` (a destructive
  call's first approver) leaves it paused, the card counting the approval; a refusal by the gate
  refuses the decision with the gate's reason. Without `native_approver` (or when the function
  returns None) it is refused with a message naming that setting, and the effectgate way.
- `{"type": "edit", "edited_action": {"name", "args"}}` is effectgate's edit: a new version that
  needs its own approval. `{"type": "respond"}` is refused: a gated call runs as approved or not
  at all.
- A call whose checkpoint no longer matches its approval (`mismatch`) accepts only a reject, and
  the signature, version and args-hash echoes are checked as for effectgate's own decisions.

The approver comes from the application, never from the model or the checkpoint: a function
given as `native_approver` is called with the `config` and `context=` of the invoke that brings
the answer, and should read who is deciding from the application's own request.

Each HITL answer is applied once, by the invoke that brought it (`provenance`). LangGraph
re-runs the node from its first line on every resume and replays every earlier answer in order;
what those did is in the store already (a grant spent, a partial approval counted, a denial, an
edit's version). A replayed approve applied again would be recorded as whoever the application
names for the later run, a decision that person never made, so an answer counts only when this
invoke's `Command` carries it (in its resume map under the interrupt's id, or as its plain
`resume`). Anything else is skipped: the answers LangGraph replays, the plain answer it keeps
among the checkpoint's pending writes and hands to the next pause on `invoke(None)`, and a
RESUME write put into the checkpoint. A plain answer whose invoke cannot be told (a nested
graph, a LangGraph that moved the loop) is refused, with how to answer by interrupt id.
And a new answer is applied only to what its interrupt showed (`_shown.refusal`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.types import Command

from effectgate import Approver, EffectGate

from ._decisions import DecisionRefused, Waiting

#: Who a HITL approve or reject comes from: a fixed approver, or one per run, from
#: `(config, context)`: the config and the runtime context (`context=`) of the invoke.
NativeApprover = Approver | Callable[[RunnableConfig, Any], Approver | None]
#: The identity a HITL reject is recorded under when no configured approver may decide the call.
HITL_REJECT = "hitl-reject"
HOW_TO_ANSWER = (
    "answer by approval id: Command(resume={approval_id: decision}), or "
    "effectgate_langgraph.resume({approval_id: decision}, out.interrupts), where a decision is "
    "effectgate_langgraph.approve(grant.token) (the token from gate.approve(...) or `effectgate "
    "approve`), deny(reason) or edit(args)"
)
NO_APPROVER = (
    "a HumanInTheLoopMiddleware approve ({'type': 'approve'}) carries no grant, and no approver is "
    "configured: build the node or middleware with native_approver=Approver(id, role) (or a "
    "function of the run's config and context returning one) to approve through gate.approve as "
    f"that approver; or {HOW_TO_ANSWER}"
)
# LangGraph's config keys (langgraph._internal._constants), all private: the per-task scratchpad
# (CONFIG_KEY_SCRATCHPAD: the task's answers in order, and the "null" resume), the task's
# namespace, this invoke's resume map (CONFIG_KEY_RESUME_MAP) and the task's call hook
# (CONFIG_KEY_CALL). There is no public way to tell a replayed answer.
_SCRATCHPAD_KEY = "__pregel_scratchpad"
_NS_KEY = "checkpoint_ns"
_RESUME_MAP_KEY = "__pregel_resume_map"
_CALL_KEY = "__pregel_call"


def is_hitl(answer: object) -> bool:
    """langchain's HITL resume shapes: `{"decisions": [...]}`, or in its per-call mode one bare
    decision `{"type": ...}` (neither key can be an approval id)."""
    if not isinstance(answer, Mapping):
        return False
    return isinstance(answer.get("decisions"), list) or isinstance(answer.get("type"), str)


@dataclass(frozen=True)
class Provenance:
    """Where the answer `interrupt()` just returned came from.

    `interrupt_id`: the interrupt this invoke's resume brought it for (None: a replay, read back
    from the checkpoint), and `slot`: the task's answer slot that interrupt was raised at (the
    record of what it showed is looked up by both: LangGraph 1.2.15 gives every interrupt of a
    task one id); `unconfirmed`: why a plain `Command(resume=value)` answer could not be
    confirmed as this invoke's (then it is neither applied nor taken for a replay: refused)."""

    interrupt_id: str | None
    slot: int = 0
    unconfirmed: str | None = None


UNCONFIRMED = (
    "this HumanInTheLoopMiddleware answer came as a plain Command(resume=...), and this LangGraph "
    "run does not show whether the invoke that runs this task brought it or it was read back from "
    "the checkpoint's pending writes (a nested graph, or a LangGraph this adapter does not know), "
    "so no decision was applied; answer by interrupt id: "
    "Command(resume={interrupt.id: answer}) for this payload's interrupt, or "
    f"{HOW_TO_ANSWER}"
)


def provenance(value: object) -> Provenance:
    """Whether the HITL answer `value` that `interrupt()` just returned was brought by the invoke
    that runs this task, and for which interrupt; see the module docstring.

    LangGraph hands a task its answers from three places: the answers its earlier runs consumed
    (the checkpoint's RESUME write for the task: replays, or a write put there by whoever holds
    the checkpoint), this invoke's resume map (`Command(resume={interrupt_id: value})`, set from
    the invoke's input only, never stored as a map), and the "null" resume
    (`Command(resume=value)`), which is a pending write of the checkpoint: LangGraph keeps it
    there after a task consumed it, and a later `invoke(None)` hands the same answer to the
    task's next interrupt. Only the invoke's own input tells that one apart, so a plain answer
    counts as this invoke's only when it is the very object the invoke's `Command` carries.
    `interrupt()` returns the object it was given (no `response_schema` here), so identity is
    exact. Raises when LangGraph keeps the task's answers elsewhere: a HITL answer must never be
    applied twice, nor silently dropped."""
    conf = get_config().get("configurable", {})
    scratchpad = conf.get(_SCRATCHPAD_KEY)
    answers = getattr(scratchpad, "resume", None)
    null_resume = getattr(scratchpad, "get_null_resume", None)
    ns = conf.get(_NS_KEY)
    slot = _slot_of(answers, value)
    if not callable(null_resume) or not isinstance(ns, str) or slot is None:
        raise RuntimeError(
            "this LangGraph keeps no per-task answers where effectgate_langgraph reads them, so a "
            "HumanInTheLoopMiddleware answer cannot be told from a replay; answer by approval id: "
            f"{HOW_TO_ANSWER}"
        )
    resume_map = conf.get(_RESUME_MAP_KEY)
    if isinstance(resume_map, Mapping):
        # LangGraph takes the slot's own id, or (an answer to an id raised by a release that gave
        # every interrupt of a task its first slot's id) the first slot's
        for interrupt_id, raised_at in ((slot_interrupt_id(ns, slot), slot), (slot_interrupt_id(ns, 0), 0)):
            if interrupt_id in resume_map and resume_map[interrupt_id] is value:
                return Provenance(interrupt_id, raised_at)
    if null_resume(False) is not value:
        return Provenance(None)  # one of the task's stored answers
    given = _invoke_input(conf)
    if given is _UNKNOWN:
        return Provenance(None, unconfirmed=UNCONFIRMED)
    if isinstance(given, Command) and given.resume is value:
        return Provenance(slot_interrupt_id(ns, slot), slot)
    return Provenance(None)  # the checkpoint's null resume, brought by an earlier invoke


def next_slot() -> int | None:
    """The answer slot of the task's next interrupt (the one `interrupt()` raises now), if known."""
    answers = getattr(get_config().get("configurable", {}).get(_SCRATCHPAD_KEY), "resume", None)
    return len(answers) if isinstance(answers, list) else None


def _slot_of(answers: object, value: object) -> int | None:
    """The task's answer slot holding `value` (the last one, by identity)."""
    if not isinstance(answers, list):
        return None
    return next((i for i in range(len(answers) - 1, -1, -1) if answers[i] is value), None)


_UNKNOWN = object()


def _invoke_input(conf: Mapping[str, Any]) -> object:
    """The input of the invoke that runs this task (a `Command`, None, state...), or `_UNKNOWN`.

    LangGraph passes it to no task. The runner gives each task a call hook bound to the loop's
    `accept_push` (`__pregel_call`: `functools.partial(..., schedule_task=loop.accept_push)`),
    and the loop keeps the input (`loop.input`); both private. In a nested graph that loop is the
    subgraph's, whose input is not the invoke's (the answer comes from the parent's), so it is
    `_UNKNOWN` there too, as it is when a release moves either."""
    call = conf.get(_CALL_KEY)
    schedule = call.keywords.get("schedule_task") if isinstance(call, functools.partial) else None
    loop = getattr(schedule, "__self__", None)
    if loop is None or getattr(loop, "is_nested", True) or not hasattr(loop, "input"):
        return _UNKNOWN
    return loop.input


def slot_interrupt_id(ns: str, answered: int) -> str:
    """The id LangGraph gives the interrupt of a task's slot `answered` (its private rule: newer
    releases suffix the slot, before that every interrupt of a task was named after its namespace,
    which is also the first slot's id now)."""
    try:
        from langgraph.types import _interrupt_id
    except ImportError:  # LangGraph before `_interrupt_id` (1.2.15, the lowest supported)
        from xxhash import xxh3_128_hexdigest

        return xxh3_128_hexdigest(ns.encode())
    return _interrupt_id(ns, answered)


def in_proposal_order(gate: EffectGate, waiting: Sequence[Waiting]) -> list[Waiting]:
    """The step's waiting calls in the order their approvals were first proposed (each one's
    first "proposed" event id in the gate's store, `Waiting.proposed`), whatever order the
    checkpoint lists them in. One call needs no order and is not looked up. Calls whose approval
    has no recorded proposal come last, by approval id (`proposed` None: `by_position` refuses)."""
    if len(waiting) < 2:
        return list(waiting)
    first = gate.store.first_proposed([w.pending.approval_id for w in waiting])
    placed = [dataclasses.replace(w, proposed=first.get(w.pending.approval_id)) for w in waiting]
    return sorted(placed, key=lambda w: (w.proposed is None, w.proposed or 0, w.pending.approval_id))


def by_position(answer: Mapping[str, Any], waiting: Sequence[Waiting]) -> list[tuple[Waiting, object]]:
    """Each waiting call (in `in_proposal_order`) with the decision at its position;
    DecisionRefused for a list of another length, or when two or more calls wait and one has
    no recorded proposal (then none is applied)."""
    decisions: list[object] = (
        list(answer["decisions"]) if isinstance(answer.get("decisions"), list) else [answer]
    )
    if len(decisions) != len(waiting):
        raise DecisionRefused(
            f"the answer has {len(decisions)} decision(s) for {len(waiting)} waiting call(s); "
            "HumanInTheLoopMiddleware's answer matches them by position, in the order of the "
            "payload's action_requests, so none was applied: answer with one decision per request"
        )
    unplaced = [w.pending.approval_id for w in waiting if w.proposed is None]
    if len(waiting) > 1 and unplaced:
        raise DecisionRefused(
            f"the gate's store has no record of when approval(s) {', '.join(unplaced)} were "
            "proposed, so the order of the payload's action_requests cannot be told from the "
            f"checkpoint's and no decision was applied by position; {HOW_TO_ANSWER}"
        )
    return list(zip(waiting, decisions, strict=True))


def matched(
    answer: Mapping[Any, Any], waiting: Sequence[Waiting]
) -> list[tuple[str, Waiting | None, object]]:
    """Each decision of the answer with the waiting call it answers (None: no such call). A HITL
    answer by position (`by_position`), any other by approval id."""
    if is_hitl(answer):
        return [(w.pending.approval_id, w, raw) for w, raw in by_position(answer, waiting)]
    by_id = {w.pending.approval_id: w for w in waiting}
    return [(str(k), by_id.get(k) if isinstance(k, str) else None, raw) for k, raw in answer.items()]


__all__ = [
    "HITL_REJECT",
    "HOW_TO_ANSWER",
    "NO_APPROVER",
    "UNCONFIRMED",
    "NativeApprover",
    "Provenance",
    "by_position",
    "in_proposal_order",
    "is_hitl",
    "matched",
    "next_slot",
    "provenance",
    "slot_interrupt_id",
]
