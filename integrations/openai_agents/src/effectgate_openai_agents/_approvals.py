"""The SDK's approval flow in effectgate's terms: map a `ToolApprovalItem` to its approval, decide.

    result = await Runner.run(agent, "Please refund order 1042", context=context)
    state = result.to_state()                      # or: await RunState.from_string(agent, stored)
    [paused] = pending_approvals(state)            # approval id, version, args hash, the SDK item
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
its interruption or effectgate's entry. `pending_approvals` only reads the mapping (to show it);
`approve`, `approve_as` and `reject` decide through it only after `_records.verified_approval`:
the identity verifies, the call's record is the sealed one effectgate wrote for that call and
run, the SDK item's tool and arguments are the approval's, and the gate's store shows the
approval belongs to this run (`TamperedState` otherwise; nothing is decided or attached).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents import RunResult, RunState
from agents.items import ToolApprovalItem

from effectgate import Approver, EffectGate, Grant, Refused
from effectgate.adapter import DecisionMismatch, Paused, bind_token
from effectgate.outcomes import Decision

from ._context import TamperedState, adapter_state, has_signed_identity, mark_resumed
from ._reach import agent_gate, tool_gate
from ._records import verified_approval


@dataclass(frozen=True)
class PendingApproval:
    """One paused call: the SDK's item and the effectgate approval it registered."""

    item: ToolApprovalItem
    call_id: str
    tool: str
    approval_id: str | None
    version: int | None
    args_hash: str | None


def _context_of(source: RunResult | RunState[Any, Any]) -> Any:
    # RunState keeps its context privately (0.24); a RunResult exposes it
    wrapper = getattr(source, "_context", None) if isinstance(source, RunState) else source.context_wrapper
    if wrapper is None:
        raise ValueError("this run state has no context (it was not produced by a run)")
    return wrapper.context


def _mark(source: RunResult | RunState[Any, Any]) -> None:
    if isinstance(source, RunState):
        mark_resumed(getattr(source, "_context", None))


def _items(source: RunResult | RunState[Any, Any]) -> list[ToolApprovalItem]:
    return list(source.get_interruptions() if isinstance(source, RunState) else source.interruptions)


def pending_approvals(source: RunResult | RunState[Any, Any]) -> list[PendingApproval]:
    """The paused calls of a result or state, each with its effectgate approval (if any). A state
    is marked as resumed: whatever runs from it must carry the identity effectgate signed."""
    _mark(source)
    records = adapter_state(_context_of(source))["approvals"]
    out = []
    for item in _items(source):
        call_id = str(item.call_id or "")
        record = records.get(call_id)
        record = record if isinstance(record, Mapping) else {}
        out.append(
            PendingApproval(
                item=item,
                call_id=call_id,
                tool=str(item.name or record.get("tool") or ""),
                approval_id=record.get("approval_id"),
                version=record.get("version"),
                args_hash=record.get("args_hash"),
            )
        )
    return out


def approval_of(source: RunResult | RunState[Any, Any], item: ToolApprovalItem) -> PendingApproval:
    """The effectgate approval behind one SDK item (matched by call id, since items compare by
    identity and are copied on restore)."""
    for paused in pending_approvals(source):
        if paused.call_id == item.call_id:
            return paused
    raise LookupError(f"no pending call {item.call_id!r} in this run state")


def _registered(state: RunState[Any, Any], paused: PendingApproval) -> str:
    if paused.approval_id is None:
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
    return paused.approval_id


def _state_item(state: RunState[Any, Any], paused: PendingApproval) -> ToolApprovalItem:
    for item in state.get_interruptions():
        if item.call_id == paused.call_id:
            return item
    raise LookupError(f"call {paused.call_id!r} is not pending in this run state")


def _gate_of(state: RunState[Any, Any], paused: PendingApproval) -> EffectGate:
    """The gate of the paused call's agent (made by `gate_agent`) or of its gated tool."""
    item = _state_item(state, paused)
    agent = getattr(item, "agent", None)
    gate = agent_gate(agent)
    for tool in getattr(agent, "tools", None) or ():
        if gate is None and getattr(tool, "name", None) == item.name:
            gate = tool_gate(tool)
    if gate is None:
        raise LookupError(
            f"call {paused.call_id!r} ({paused.tool}) is not paused on a tool effectgate gated; "
            "pass the gate: approve(state, paused, grant, gate=gate)"
        )
    return gate


def _verified(gate: EffectGate, state: RunState[Any, Any], paused: PendingApproval) -> Mapping[str, Any]:
    """The call's record, verified (`_records.verified_approval`), and `paused` must be its."""
    item = _state_item(state, paused)
    arguments = item.arguments if isinstance(item.arguments, str) else ""
    record, _ = verified_approval(
        gate, _context_of(state), paused.call_id, tool=str(item.name or ""), arguments=arguments
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
    whose identity or record does not verify is refused (`TamperedState`), nothing denied."""
    _mark(state)
    refused: Refused | None = None
    message = f"Refused (denied): {paused.tool} was denied: {reason}"
    if paused.approval_id is not None:
        _verified(gate, state, paused)  # TamperedState: the state was edited, nothing is denied
        row = gate.store.get_approval(paused.approval_id)
        if row is not None and row.status == "denied":
            message = f"Refused (denied): {paused.tool} was denied: {row.reason}"
        else:
            refused = gate.deny(paused.approval_id, approver=approver, reason=reason, version=paused.version)
            message = refused.for_model()
    state.reject(_state_item(state, paused), rejection_message=message)
    return refused
