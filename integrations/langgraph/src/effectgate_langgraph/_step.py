"""One model step's gated calls: register, pause once, apply the answer, repeat until settled.

LangGraph re-runs a node from its first line on every resume, so this flow is written to be run
again and again with the same result:

1. Register every gated call of the step through `gate.call_step` (the core's intent key finds
   the same approval on a re-run; two calls of one gated tool register neither). Reads and
   writes are not touched here: they run after the step is settled, once.
2. While some gated call still waits, raise ONE `interrupt()` listing all of them (in the order
   their approvals were first proposed, from the store: `_hitl.in_proposal_order`), and apply the
   answer through the core (`execute` with the grant token, `deny`, or `call` with edited
   arguments; with `defer`, a grant is settled as `_grants.Granted`, spent where its call runs,
   for GatedToolNode's wrappers to run or short-circuit). Each loop turn consumes one interrupt
   slot, so a re-run replays the same answers in the same order; what an answer already did is
   in the store and comes back as a replay. Of an answer by approval id that this invoke did not
   bring (read back from the checkpoint), only the grant tokens are applied; a deny or edit
   there is refused (`STORED_ANSWER`). langchain's HITL answer (`{"decisions": [...]}`, by
   position) is bridged in `_hitl.py`: a reject closes the approval, an approve goes through
   `gate.approve` as the application's `native_approver`, and a replayed HITL answer is skipped
   (it was applied by its own run). With `defer`, such a grant the step cannot keep across its
   next pause is given back there and granted again when the step settles (`_regrant`).
   A call whose approval row no longer verifies (edited in the database) is refused as
   `tampered` for the model, never asked for again: no decision could settle it.

The flow composes the gate's flows (`gate.flows`) with `yield from`, plus its own `Ask` (the
pause): one body serves the sync and async node, driven by `effectgate.flow.drive` / `adrive`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolCall
from langgraph.errors import GraphInterrupt

from effectgate import Approver, CallContext, EffectGate, Pending, Refused, flow
from effectgate.adapter import DecisionMismatch, Paused, bind_decision, is_gated, rejecting_approver
from effectgate.errors import ApprovalError, ArgumentError, PolicyViolation, TamperedRecord, TokenError
from effectgate.tokens import Keyring

from ._artifacts import restore
from ._decisions import (
    Approve,
    Decision,
    DecisionRefused,
    Deny,
    Edit,
    NativeApprove,
    RefusedDecision,
    Reject,
    Waiting,
    payload,
    read_decision,
)
from ._grants import Granted, Settled, grant, spend
from ._hitl import HITL_REJECT, HOW_TO_ANSWER, UNCONFIRMED, in_proposal_order, is_hitl, matched
from ._identity import call_id, reused_ids
from ._regrant import UNKEPT, Regrant, give_back, native_grant, noted, settled
from ._shown import Answer, Ask, Pauses, asker, askip_answered, record, refusal, shown, skip_answered
from ._slots import Slot, slot_of
from ._unknown import settle_unknown

#: The application's approver for HITL decisions in this run (`effectgate.adapter.native_approver`).
ApproverOf = Callable[[], Approver | None]
StepFlow = Generator[Any, Any, dict[str, Settled]]


def settle_step(
    gate: EffectGate,
    calls: Sequence[ToolCall],
    ctx: CallContext,
    *,
    own: frozenset[str] | None = None,
    resume_identity: str,
    injected_keys: Mapping[str, frozenset[str]] | None = None,
    approver_of: ApproverOf = lambda: None,
    defer: bool = False,
) -> StepFlow:
    """Settle the gated calls among `calls` (those in `own`, or all); see the module docstring.

    `calls` are as the gate sees them, without injected keys; calls whose id the model put on
    more than one call of the step are neither registered nor settled (`reused_ids`).
    `injected_keys` (by tool name) are dropped from a reviewer's edited arguments too: the graph
    supplies them when it runs.
    `approver_of` names the application's native approver, asked only when a HITL decision
    needs one. `defer`: an approved call's grant is not spent here but settled as `Granted`,
    for the call's own tool-call path to spend (`_grants`)."""
    keys = injected_keys or {}
    reused = reused_ids(gate, calls)
    gated = [c for c in calls if is_gated(gate, c["name"])]
    # a call under a reused id is settled by none, but counts for the parallel-calls rule: its
    # tool's other call of the step is registered neither (the core refuses them all)
    tools = [c["name"] for c in gated]
    gated = [c for c in gated if call_id(c) not in reused or tools.count(c["name"]) > 1]
    if own is not None:  # one task's calls: a sibling's call is registered by its own task, as an
        # outer middleware changed it there; a sibling of the same tool is passed for the
        # parallel-calls rule (it registers none of them)
        names = {c["name"] for c in gated if call_id(c) in own}
        gated = [c for c in gated if call_id(c) in own or c["name"] in names]
    if not gated:
        return {}
    registered = yield from gate.flows.call_step([(c["name"], c["args"], c.get("id")) for c in gated], ctx)
    outcomes = yield from flow.done(settle_unknown, gate, registered)  # a run of unknown outcome is settled
    approvals = {call_id(c): getattr(r, "approval_id", None) for c, r in zip(gated, registered, strict=True)}
    slots = {
        call_id(c): slot_of(gate, c, o, ctx)
        for c, o in zip(gated, outcomes, strict=True)
        if (own is None or call_id(c) in own) and call_id(c) not in reused
    }
    matching = {c: s.outcome for c, s in slots.items() if s.mismatch is None} if defer else {}
    found = (yield from flow.done(noted, gate, ctx, matching)) if matching else {}
    for cid, regrant in found.items():  # a HITL grant given back at a pause of this step: granted below
        slots[cid].outcome = regrant
    refused: list[RefusedDecision] = [
        {"approval_id": s.outcome.approval_id, "reason": s.mismatch}
        for s in slots.values()
        if s.mismatch is not None and isinstance(s.outcome, Pending)
    ]
    again: list[RefusedDecision] = []  # why a HITL grant given back was not granted again
    while True:
        if any(isinstance(s.outcome, Pending) for s in slots.values()):  # no HITL grant outlives a pause
            for cid, s in slots.items():
                if isinstance(g := s.outcome, Granted) and (g.native is not None or not g.kept):
                    call_ctx = dataclasses.replace(ctx, tool_call_id=cid)
                    s.outcome = yield from flow.done(give_back, gate, call_ctx, g)
                    if g.native is None:  # the resume map's token: asked for again, told why
                        refused.append({"approval_id": Keyring.read(g.token).approval_id, "reason": UNKEPT})
        # ordered by the store, not the checkpoint: a HITL answer is matched to them by position
        waiting = in_proposal_order(
            gate,
            [
                Waiting(cid, s.call["name"], s.args, s.outcome, s.call_hash, s.mismatch)
                for cid, s in slots.items()
                if isinstance(s.outcome, Pending)
            ],
        )
        if not waiting and not any(isinstance(s.outcome, Regrant) for s in slots.values()):
            break
        if not waiting:  # nothing else waits: what HITL approved before a pause is granted again
            again = yield from _regrant(gate, slots, ctx)
            continue
        ids = frozenset(w.pending.approval_id for w in waiting)
        refused += [r for r in again if r["approval_id"] in ids and r not in refused]  # told until decided
        ask = payload(gate, waiting, refused, ctx)
        answer: Answer = yield Ask(ask, ids, shown(waiting), ctx)
        refused = yield from _apply(
            gate, answer, waiting, slots, ctx, resume_identity, ask["signature"], keys, approver_of, defer
        )
    kept = yield from flow.done(restore, gate, ctx, {cid: s.outcome for cid, s in slots.items()})
    return {
        c: Settled(settled(s.outcome), s.edited_args, kept.get(c), s.call, approvals.get(c))
        for c, s in slots.items()
    }


NOT_A_MAPPING = f"the resume value is not a mapping from approval id to decision; {HOW_TO_ANSWER}"
#: Why a deny or edit read back from the answer the checkpoint keeps, not this resume's, is refused.
STORED_ANSWER = (
    "this deny or edit is in the answer the checkpoint keeps for the step and no resume brought it "
    "(a replay, or a write to the checkpoint); only a grant token vouches for itself: nothing was applied"
)


def _apply(
    gate: EffectGate,
    answer: Answer,
    waiting: Sequence[Waiting],
    slots: dict[str, Slot],
    ctx: CallContext,
    resume_identity: str,
    signature: str,
    keys: Mapping[str, frozenset[str]],
    approver_of: ApproverOf,
    defer: bool,
) -> Generator[Any, Any, list[RefusedDecision]]:
    value = answer.value
    if not isinstance(value, Mapping):
        return [{"approval_id": w.pending.approval_id, "reason": NOT_A_MAPPING} for w in waiting]
    hitl = is_hitl(value)
    wrong = answer.unconfirmed if hitl else None
    if hitl and answer.newest:
        # addressed or not, a HITL answer applies only to what its interrupt showed (`_shown`);
        # a newest answer always names its interrupt (`_hitl.provenance`)
        wrong = (
            refusal(gate, answer.interrupt_id, answer.slot, shown(waiting), ctx.session_id)
            if answer.interrupt_id is not None
            else UNCONFIRMED
        )
    if wrong is not None:
        return [{"approval_id": w.pending.approval_id, "reason": wrong} for w in waiting]
    refused: list[RefusedDecision] = []
    try:
        # a replayed HITL answer was applied by the run its resume brought (see `_hitl`)
        pairs = matched(value, waiting) if answer.newest or not hitl else []
    except DecisionRefused as exc:
        return [{"approval_id": w.pending.approval_id, "reason": exc.reason} for w in waiting]
    for key, w, raw in pairs:
        if w is None:
            refused.append({"approval_id": key, "reason": "no approval of this step waits under this id"})
            continue
        slot = slots[w.call_id or ""]
        try:
            decision = read_decision(raw, w, signature, hitl=hitl)
            if not (answer.newest or hitl or isinstance(decision, Approve)):
                raise DecisionRefused(STORED_ANSWER)
            if isinstance(decision, Edit) and keys.get(w.tool):
                dropped = keys[w.tool]
                decision = Edit({k: v for k, v in decision.args.items() if k not in dropped})
            yield from _apply_one(gate, decision, w, slot, ctx, resume_identity, approver_of, defer)
            if not answer.kept and isinstance(g := slot.outcome, Granted) and g.native is None:
                slot.outcome = dataclasses.replace(g, kept=False)  # its token: in no checkpoint
        except DecisionRefused as exc:
            refused.append({"approval_id": key, "reason": exc.reason})
    refused += [
        {"approval_id": w.pending.approval_id, "reason": w.mismatch}
        for w in waiting
        if w.mismatch is not None
        and isinstance(slots[w.call_id or ""].outcome, Pending)
        and not any(r["approval_id"] == w.pending.approval_id for r in refused)
    ]
    return refused


def _apply_one(
    gate: EffectGate,
    decision: Decision,
    w: Waiting,
    slot: Slot,
    ctx: CallContext,
    resume_identity: str,
    approver_of: ApproverOf,
    defer: bool,
) -> Generator[Any, Any, None]:
    call_ctx = dataclasses.replace(ctx, tool_call_id=w.call_id)
    if w.mismatch is not None and not isinstance(decision, Deny | Reject):
        # Said apart from the step's own note on the mismatch, so the reviewer can tell that
        # this answer arrived and was refused.
        kind = "edit" if isinstance(decision, Edit) else "approve"
        raise DecisionRefused(f"{kind} refused, only a deny is accepted for this call: {w.mismatch}")
    # what the payload showed of this call (for a HITL answer, `refusal` checked that the
    # interrupt's record shows exactly this): every approve is bound to it, never to what the
    # store or the checkpoint holds by the time it is applied
    paused = Paused.of(w.pending)
    if isinstance(decision, NativeApprove):
        yield from _native(gate, slot, call_ctx, approver_of(), paused, defer)
        return
    if isinstance(decision, Approve):
        yield from _approved(
            gate, slot, call_ctx, Granted(w.tool, decision.token, dict(w.args)), paused, defer
        )
        return
    if isinstance(decision, Deny | Reject):
        role = w.pending.card.approver_role
        # the application's identity, never the resume value's (`_decisions.read_decision`
        # refuses a deny that names an approver): the native approver when their role may
        # decide the call, else a system identity holding the row's role
        system = HITL_REJECT if isinstance(decision, Reject) else resume_identity
        approver = rejecting_approver(gate, approver_of(), role, system=system)
        try:
            slot.outcome = yield from gate.flows.deny(
                w.pending.approval_id, approver=approver, reason=decision.reason, version=w.pending.version
            )
        except TamperedRecord as exc:
            if exc.foreign_key is not None:  # a keyring that cannot check it: no edit is known
                raise DecisionRefused(f"the denial was refused: {exc}") from exc
            # the reviewer stops a call no decision can settle: refused for the model, recorded
            slot.outcome = yield from flow.done(
                gate.refuse, w.tool, call_ctx, code="tampered", message=str(exc), approval_id=exc.approval_id
            )
        except (ApprovalError, PolicyViolation) as exc:
            yield from _refresh(gate, slot, call_ctx)
            raise DecisionRefused(f"the denial was refused: {exc}") from exc
        return
    if (subject := gate.table[w.tool].subject_of(w.args)) is None:  # the core would propose anew
        raise DecisionRefused(f"{w.tool} names no subject, so its call cannot be edited; deny it instead")
    try:
        changed = gate.table[w.tool].subject_of(decision.args) != subject
    except ArgumentError as exc:  # a subject list holding what JSON cannot carry
        raise DecisionRefused(f"the edited arguments were refused: {exc}") from exc
    if changed:
        raise DecisionRefused(f"an edit cannot change what {w.tool} acts on ({subject}); deny it instead")
    out = yield from gate.flows.edit(w.tool, decision.args, call_ctx, editor=resume_identity)
    if not isinstance(out, Pending):
        raise DecisionRefused(f"the edited call was not accepted: {out.for_model()}")
    if dict(out.card.args) != dict(decision.args):  # the core answered with the approval as it is
        raise DecisionRefused(
            f"approval {out.approval_id} is {out.status} at version {out.version}; an edit needs a "
            "pending approval (deny it, or approve it as it stands)"
        )
    edited = slot_of(gate, slot.call, out, ctx)
    slot.outcome, slot.args, slot.edited_args = out, edited.args, edited.edited_args
    slot.mismatch = edited.mismatch


def _native(
    gate: EffectGate, slot: Slot, ctx: CallContext, approver: Approver | None, shown: Paused, defer: bool
) -> Generator[Any, Any, None]:
    """A HITL approve as the application's `approver` (`_regrant.native_grant`); while more
    distinct approvers are needed, or refused, the call stays paused (the slot shows it again)."""
    try:
        token = yield from native_grant(gate, approver, shown)
    except DecisionRefused:
        if approver is not None:
            yield from _refresh(gate, slot, ctx)
        raise
    if token is None:
        yield from _refresh(gate, slot, ctx)
        return
    granted = Granted(slot.call["name"], token, dict(slot.args), approver)
    yield from _approved(gate, slot, ctx, granted, shown, defer)


def _approved(
    gate: EffectGate, slot: Slot, ctx: CallContext, granted: Granted, shown: Paused, defer: bool
) -> Generator[Any, Any, None]:
    try:
        bind_decision(gate, shown, granted.token)
    except DecisionMismatch as exc:
        raise DecisionRefused(str(exc)) from exc
    try:  # `defer`: spent where the call runs (`_grants`), unless the core refuses the token now
        slot.outcome = yield from (grant if defer else spend)(gate, granted, ctx)
    except TokenError as exc:
        if exc.reason == "tampered":  # recorded (token_refused); not asked again: nothing could settle it
            why = str(exc).removeprefix("tampered: ")
            slot.outcome = Refused(
                code="tampered", message=why, tool=granted.tool, approval_id=shown.approval_id
            )
            return
        yield from _refresh(gate, slot, ctx)
        raise DecisionRefused(f"the token was refused: {exc}") from exc


def _regrant(
    gate: EffectGate, slots: Mapping[str, Slot], ctx: CallContext
) -> Generator[Any, Any, list[RefusedDecision]]:
    """Grant again what a HITL answer approved before an earlier pause of the step, as the
    approver it was applied as; refused, the call is asked for again with the reason."""
    refused: list[RefusedDecision] = []
    for cid, s in slots.items():
        if isinstance(again := s.outcome, Regrant):
            call_ctx = dataclasses.replace(ctx, tool_call_id=cid)
            try:
                yield from _native(gate, s, call_ctx, again.approver, again.shown, True)
            except DecisionRefused as exc:
                refused.append({"approval_id": again.shown.approval_id, "reason": exc.reason})
            if isinstance(s.outcome, Regrant):  # granted, then refused (`_approved`): read again
                yield from _refresh(gate, s, call_ctx)
    return refused


def _refresh(gate: EffectGate, slot: Slot, ctx: CallContext) -> Generator[Any, Any, None]:
    """After the core refused a decision, ask it again where the call stands (a replay); one
    whose row no longer verifies is refused (recorded by the core), as its step's replay is."""
    name = slot.call["name"]
    try:
        slot.outcome = yield from gate.flows.call(name, dict(slot.args), ctx)
    except TamperedRecord as exc:
        if exc.foreign_key is not None:
            raise
        slot.outcome = Refused(code="tampered", message=str(exc), tool=name, approval_id=exc.approval_id)


# -- drivers


def drive(step: StepFlow, gate: EffectGate) -> dict[str, Settled]:
    """Settle a step on this thread; an `Ask` is LangGraph's interrupt (it raises: the pause),
    whose payload the gate's log records (`_shown`). Settled, the answers the step's earlier
    pauses got and this run did not ask for again are taken (`_shown.skip_answered`)."""
    pauses = Pauses()
    try:
        settled = flow.drive(step, other=asker(pauses))
    except GraphInterrupt:
        record(gate, pauses)
        raise
    skip_answered(gate, pauses, _approvals(settled))
    return settled


async def adrive(step: StepFlow, gate: EffectGate) -> dict[str, Settled]:
    """As `drive`: the store work and sync tools run in a worker thread, the pause on the loop."""
    pauses = Pauses()
    try:
        settled = await flow.adrive(step, other=asker(pauses))
    except GraphInterrupt:
        await asyncio.to_thread(record, gate, pauses)
        raise
    await askip_answered(gate, pauses, _approvals(settled))
    return settled


def _approvals(settled: dict[str, Settled]) -> frozenset[str]:
    return frozenset(s.approval_id for s in settled.values() if s.approval_id is not None)
