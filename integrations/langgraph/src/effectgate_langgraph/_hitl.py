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

Each HITL answer is applied once, by the run its resume brought (`is_newest_answer`). LangGraph
re-runs the node from its first line on every resume and replays every earlier answer in order;
what those did is in the store already (a grant spent, a partial approval counted, a denial, an
edit's version). A replayed approve applied again would be recorded as whoever the application
names for the later run, a decision that person never made, so replayed HITL answers are skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config

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
# LangGraph's per-task scratchpad (langgraph._internal._constants.CONFIG_KEY_SCRATCHPAD): it holds
# the task's answers in order, the newest last. There is no public way to tell a replayed answer.
_SCRATCHPAD_KEY = "__pregel_scratchpad"


def is_hitl(answer: object) -> bool:
    """langchain's HITL resume shapes: `{"decisions": [...]}`, or in its per-call mode one bare
    decision `{"type": ...}` (neither key can be an approval id)."""
    if not isinstance(answer, Mapping):
        return False
    return isinstance(answer.get("decisions"), list) or isinstance(answer.get("type"), str)


def is_newest_answer(value: object) -> bool:
    """Whether `interrupt()` just returned the answer this resume brought, not one it replays.

    `interrupt()` returns the very object the task's scratchpad holds. This resume's answer is
    either the run's "null" resume (`Command(resume=value)`: `get_null_resume`, the same object
    before and after `interrupt()` consumes it) or, addressed by interrupt id, the last of the
    task's answers (`resume`); earlier answers are separate objects read back from the
    checkpoint. Raises when the scratchpad is not there (a LangGraph this adapter does not know):
    a HITL answer must never be applied twice, nor silently dropped."""
    scratchpad = get_config().get("configurable", {}).get(_SCRATCHPAD_KEY)
    answers = getattr(scratchpad, "resume", None)
    null_resume = getattr(scratchpad, "get_null_resume", None)
    if not isinstance(answers, list) or not callable(null_resume):
        raise RuntimeError(
            "this LangGraph keeps no per-task answers where effectgate_langgraph reads them, so a "
            "HumanInTheLoopMiddleware answer cannot be told from a replay; answer by approval id: "
            f"{HOW_TO_ANSWER}"
        )
    brought = null_resume(False)
    if brought is not None:
        return brought is value
    return bool(answers) and answers[-1] is value


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
    "NativeApprover",
    "by_position",
    "in_proposal_order",
    "is_hitl",
    "is_newest_answer",
    "matched",
]
