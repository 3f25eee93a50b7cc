"""The SDK's approval flow in effectgate's terms: map a `ToolApprovalItem` to its approval, decide.

    result = await Runner.run(agent, "Please refund order 1042", context=context)
    state = result.to_state()                      # or: await RunState.from_string(agent, stored)
    [paused] = pending_approvals(state)            # verified: approval id, version, args hash
    grant = gate.approve(paused.approval_id, version=paused.version, approver=fiona)
    approve(state, paused, grant)                  # the token rides in the run context; SDK approves
    result = await Runner.run(agent, state)        # the refund runs once, through the gate

`approve_as(gate, state, paused, approver)` does the two middle steps at once; `reject(...)` denies
in effectgate and rejects in the SDK, so the model is told the reason and the call never runs.

The mapping from call id to approval lives in the run context (serialized with the state), so a
snapshot restored in another process maps the same way. An interruption effectgate registered
nothing for (its arguments did not parse, so the SDK forced approval without asking the gate) has
`approval_id=None`: reject it; approving it in the SDK alone runs nothing either.

Every function here that is given a `RunState` marks it as a paused run being resumed: when it
runs, its identity must verify against the signature effectgate wrote when it paused
(`TamperedState` otherwise, nothing runs), even if the snapshot was edited to drop its decisions,
its interruption or effectgate's entry. Nothing read from the mapping is shown or decided on
before `_records.verified_approval` holds: the identity verifies, the call's record is the sealed
one effectgate wrote for that call and run, the SDK item's tool and arguments are the approval's,
and the gate's store shows the approval belongs to this run. `pending_approvals` lists a call
whose record does not verify (or that no gate could check) with `verified=False`, the reason in
`problem`, and no approval id, version or args hash, so a reviewer is never shown an edited
record's details as effectgate's; `approve`, `approve_as` and `reject` raise `TamperedState`
instead (nothing is decided, attached or denied).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents import RunResult, RunState
from agents.items import ToolApprovalItem

from effectgate import Approver, EffectGate, Grant, Refused
from effectgate import adapter as _adapter
from effectgate._display import card_status
from effectgate.adapter import DecisionMismatch, Paused, bind_token
from effectgate.errors import AlreadyDecided, ApprovalExpired, StaleApproval
from effectgate.outcomes import Decision

from ._context import TamperedState, adapter_state, has_signed_identity, mark_resumed
from ._native_decisions import ran_first
from ._reach import agent_gate, tool_gate
from ._records import verified_approval
from ._restored import observe
from ._spent import spent_answer


@dataclass(frozen=True)
class PendingApproval:
    """One paused call: the SDK's item and the effectgate approval it registered.

    `approval_id`, `version` and `args_hash` are set only when `verified`: the call's record in
    the run state is the one effectgate sealed for this call and run, the SDK item's tool and
    arguments are the approval's, and the gate's store shows the approval is this run's. When
    it is not, they are None and `problem` says why (the state was edited, no gate to check it
    with, or effectgate registered no approval for the call). `tool` is the SDK item's."""

    item: ToolApprovalItem
    call_id: str
    tool: str
    approval_id: str | None
    version: int | None
    args_hash: str | None
    verified: bool = False
    problem: str | None = None


def _context_of(source: RunResult | RunState[Any, Any]) -> Any:
    # RunState keeps its context privately (0.24); a RunResult exposes it
    wrapper = getattr(source, "_context", None) if isinstance(source, RunState) else source.context_wrapper
    if wrapper is None:
        raise ValueError("this run state has no context (it was not produced by a run)")
    return wrapper.context


def _mark(source: RunResult | RunState[Any, Any]) -> None:
    """A state is a paused run being resumed, and effectgate has now seen it: the SDK approvals
    it carried without effectgate's grant are dropped (`_restored`), and `state.approve` from
    here on is a decision made in this process."""
    if isinstance(source, RunState):
        mark_resumed(getattr(source, "_context", None))
        observe(getattr(source, "_context", None))


def _items(source: RunResult | RunState[Any, Any]) -> list[ToolApprovalItem]:
    return list(source.get_interruptions() if isinstance(source, RunState) else source.interruptions)


def _arguments(item: ToolApprovalItem) -> str:
    return item.arguments if isinstance(item.arguments, str) else ""


def _item_gate(item: ToolApprovalItem) -> EffectGate | None:
    """The gate of the item's agent (made by `gate_agent`) or of its gated tool, if any."""
    agent = getattr(item, "agent", None)
    gate = agent_gate(agent)
    for tool in getattr(agent, "tools", None) or ():
        if gate is None and getattr(tool, "name", None) == item.name:
            gate = tool_gate(tool)
    return gate


def _listed(
    gate: EffectGate | None, context: Any, item: ToolApprovalItem, has_record: bool
) -> PendingApproval:
    call_id, tool = str(item.call_id or ""), str(item.name or "")

    def unverified(problem: str) -> PendingApproval:
        return PendingApproval(item, call_id, tool, None, None, None, verified=False, problem=problem)

    if not has_record:
        return unverified(f"effectgate registered no approval for call {call_id!r} ({tool}); reject it")
    if gate is None:
        return unverified(
            f"call {call_id!r} ({tool}) is not paused on a tool effectgate gated, so its record "
            "was not verified: pass the gate, pending_approvals(source, gate=gate)"
        )
    try:
        record, row = verified_approval(gate, context, call_id, tool=tool, arguments=_arguments(item))
    except (_adapter.TamperedState, _adapter.MissingIdentity) as exc:
        return unverified(str(exc))
    if row is None:
        return unverified(
            f"the gate's store has no approval for call {call_id!r} ({tool}): is this the gate "
            "(and database) the run paused on?"
        )
    return PendingApproval(
        item,
        call_id,
        tool,
        str(record["approval_id"]),
        int(record["version"]),
        str(record["args_hash"]),
        verified=True,
    )


def pending_approvals(
    source: RunResult | RunState[Any, Any], *, gate: EffectGate | None = None
) -> list[PendingApproval]:
    """The paused calls of a result or state, each with its effectgate approval once verified.

    Each call's record is verified before it is listed (`_records.verified_approval`, with the
    gate's keyring and store): only then does its entry carry the approval id, version and args
    hash, with `verified=True`. An entry whose record does not verify (the state was edited:
    a record pointed at another approval, two records swapped, an edited identity, arguments or
    tool; or the gate's store has no such approval) is listed with `verified=False`, its reason
    in `problem`, and None for all three, so
    what a reviewer is shown is always effectgate's own. `gate` defaults to the gate of each
    paused call's agent or gated tool; a call with neither is listed unverified. Blocking (it
    reads the store). A state is marked as resumed: whatever runs from it must carry the
    identity effectgate signed."""
    _mark(source)
    context = _context_of(source)
    records = adapter_state(context)["approvals"]
    out = []
    for item in _items(source):
        has_record = isinstance(records.get(str(item.call_id or "")), Mapping)
        out.append(_listed(gate if gate is not None else _item_gate(item), context, item, has_record))
    return out


def approval_of(
    source: RunResult | RunState[Any, Any], item: ToolApprovalItem, *, gate: EffectGate | None = None
) -> PendingApproval:
    """The effectgate approval behind one SDK item (matched by call id, since items compare by
    identity and are copied on restore), verified as `pending_approvals` verifies it."""
    for paused in pending_approvals(source, gate=gate):
        if paused.call_id == item.call_id:
            return paused
    raise LookupError(f"no pending call {item.call_id!r} in this run state")


def _has_record(state: RunState[Any, Any], paused: PendingApproval) -> bool:
    return isinstance(adapter_state(_context_of(state))["approvals"].get(paused.call_id), Mapping)


def _registered(state: RunState[Any, Any], paused: PendingApproval) -> None:
    """Whether there is an approval to decide: a call listed without one while the state holds a
    record for it (an unverified entry) goes on to `_verified`, which refuses it."""
    if paused.approval_id is None and not _has_record(state, paused):
        if not has_signed_identity(_context_of(state)):
            raise TamperedState(
                f"the run state carries no effectgate record for call {paused.call_id!r} "
                f"({paused.tool}) and no signed identity: it was edited after it was saved (or "
                "never paused through effectgate). Nothing was approved; reject it"
            )
        raise LookupError(
            f"effectgate registered no approval for call {paused.call_id!r} ({paused.tool}): its "
            f"arguments did not reach the gate; reject it"
        )


def _state_item(state: RunState[Any, Any], paused: PendingApproval) -> ToolApprovalItem:
    for item in state.get_interruptions():
        if item.call_id == paused.call_id:
            return item
    raise LookupError(f"call {paused.call_id!r} is not pending in this run state")


def _gate_of(state: RunState[Any, Any], paused: PendingApproval) -> EffectGate:
    """The gate of the paused call's agent (made by `gate_agent`) or of its gated tool."""
    gate = _item_gate(_state_item(state, paused))
    if gate is None:
        raise LookupError(
            f"call {paused.call_id!r} ({paused.tool}) is not paused on a tool effectgate gated; "
            "pass the gate: approve(state, paused, grant, gate=gate)"
        )
    return gate


def _verified(gate: EffectGate, state: RunState[Any, Any], paused: PendingApproval) -> Mapping[str, Any]:
    """The call's record, verified (`_records.verified_approval`), and `paused` must be its."""
    item = _state_item(state, paused)
    record, _ = verified_approval(
        gate, _context_of(state), paused.call_id, tool=str(item.name or ""), arguments=_arguments(item)
    )
    if paused.approval_id is None:
        raise DecisionMismatch(
            str(record["approval_id"]),
            f"call {paused.call_id!r} was listed unverified ({paused.problem}); list it again "
            "with pending_approvals(state, gate=gate) and decide the verified entry",
        )
    if (paused.approval_id, paused.version) != (record["approval_id"], record["version"]):
        raise DecisionMismatch(
            str(record["approval_id"]),
            f"call {paused.call_id!r} paused on approval {record['approval_id']} (version "
            f"{record['version']}), not on the {paused.approval_id} (version {paused.version}) given",
        )
    return record


def _attach(
    state: RunState[Any, Any], paused: PendingApproval, record: Mapping[str, Any], token: str
) -> None:
    approval_id = str(record["approval_id"])
    bind_token(Paused(approval_id, int(record["version"]), str(record["args_hash"])), token)
    adapter_state(_context_of(state))["grants"][approval_id] = token
    state.approve(_state_item(state, paused))


def approve(
    state: RunState[Any, Any], paused: PendingApproval, grant: Grant | str, *, gate: EffectGate | None = None
) -> None:
    """Attach the grant token (from `gate.approve` or `effectgate approve`) and approve in the SDK.

    The call's record is verified first (`TamperedState`: the state was edited, nothing is
    attached); `gate` defaults to the gate of the paused call's agent or tool. The grant must be
    for this call's approval, at the version the run paused on (`DecisionMismatch` otherwise, and
    the SDK item stays pending); the gate checks the token again against its record, version and
    args hash when the call runs."""
    _mark(state)
    _registered(state, paused)
    record = _verified(gate if gate is not None else _gate_of(state, paused), state, paused)
    _attach(state, paused, record, grant.token if isinstance(grant, Grant) else grant)


def approve_as(
    gate: EffectGate, state: RunState[Any, Any], paused: PendingApproval, approver: Approver
) -> Decision:
    """Approve through the gate as `approver`; when that mints a grant, approve in the SDK too.

    A destructive call returns `PartialApproval` after its first approver: the SDK item stays
    pending until a second, distinct approver grants it. A state whose identity or record does
    not verify, or whose approval is not this run's call, is refused (`TamperedState`) before
    the gate is asked."""
    _mark(state)
    _registered(state, paused)
    record = _verified(gate, state, paused)
    decision = gate.approve(str(record["approval_id"]), version=int(record["version"]), approver=approver)
    if isinstance(decision, Grant):
        _attach(state, paused, record, decision.token)
    return decision


def reject(
    gate: EffectGate,
    state: RunState[Any, Any],
    paused: PendingApproval,
    *,
    approver: Approver,
    reason: str,
) -> Refused | None:
    """Deny in effectgate (when it registered the call) and reject in the SDK with the reason, so
    the model is told why and the call never runs. Returns the core's refusal, if any. A state
    whose identity or record does not verify is refused (`TamperedState`), nothing denied. A call
    that already ran (another copy of this state was approved and resumed first) is not denied:
    the model is told its stored result, or, when that run's outcome is unknown or it still runs
    there, so ("Outcome unknown", never a denial of a call that may have happened). A call whose
    approval a later call of its message amended since is rejected in the SDK only: the newer
    version, which no one decided, stays pending; so is one whose approval expired. One already
    denied (a sealed denial: a status column edited to 'denied' is none) is not denied again."""
    _mark(state)
    refused: Refused | None = None
    message = f"Refused (denied): {paused.tool} was denied: {reason}"
    if paused.approval_id is not None or _has_record(state, paused):
        record = _verified(gate, state, paused)  # TamperedState: the state was edited, nothing denied
        approval_id, version = str(record["approval_id"]), int(record["version"])
        row = gate.store.get_approval(approval_id)
        done = gate.result(approval_id) if row is not None and row.status == "executed" else None
        said = card_status(gate, approval_id) if row is not None and row.status == "denied" else None
        if said is not None and said[1] == "denied":  # a sealed denial: the column alone is none
            message = f"Refused (denied): {paused.tool} was denied: {row.reason if row else reason}"
        elif done is not None:  # it ran first (another copy of this state was approved and resumed)
            message = ran_first(paused.tool, approval_id, done)
        else:
            try:
                refused = gate.deny(approval_id, approver=approver, reason=reason, version=version)
                message = refused.for_model()
            except StaleApproval as exc:  # a retried request amended it since: that version is
                if not exc.given < exc.current:  # undecided, and no decision on this one decides it
                    raise
                message = f"Refused (stale): {paused.tool} was rejected ({reason}); it has not run. {exc}"
            except (ApprovalExpired, AlreadyDecided) as exc:
                status = exc.status if isinstance(exc, AlreadyDecided) else "expired"
                if status == "expired":  # nothing runs it: the SDK call is rejected all the same
                    message = (
                        f"Refused (expired): {paused.tool} was rejected ({reason}); it has not run. {exc}"
                    )
                elif status == "denied":  # a sealed denial (another copy's): the column alone is none
                    now = gate.store.get_approval(approval_id)
                    message = f"Refused (denied): {paused.tool} was denied: {(now and now.reason) or reason}"
                elif status != "executing":
                    raise
                else:  # its grant was presented by another copy: not denied
                    done = gate.result(approval_id)
                    spent = spent_answer(gate, paused.tool, approval_id)  # unknown outcome, or running
                    message = ran_first(paused.tool, approval_id, done) if done is not None else spent
    state.reject(_state_item(state, paused), rejection_message=message)
    return refused
