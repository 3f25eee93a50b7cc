"""Deferred results: a gated call answers "deferred", the run ends, a later run carries the result.

    agent = gate_agent(support, gate, mode="deferred")
    result = await Runner.run(agent, "Please refund order 1042", context=context)
    [op] = deferred_operations(result)             # {"status": "deferred", "operation_id": ...}
    # ... the application shows a confirmation card for op["operation_id"] (gate.card(...)) ...
    grant = gate.approve(op["operation_id"], version=op["version"], approver=fiona)
    done = execute_deferred(gate, op["operation_id"], grant)       # runs once, through the gate
    result = await Runner.run(agent, with_outcome(result, done), context=next_context)

A replay of the same user message answers deferred with the same operation id, before and after
the operation ran; `execute_deferred` on an operation that already ran returns its stored result
and runs nothing.

Deferred is never read from text. A gated tool that defers records its payload in the run
context (`context["effectgate"]["deferred"]`, by call id) and answers that very object; the run
ends only on such an answer (`own_deferred`), and `deferred_operations` lists only recorded
payloads whose operation the gate's store shows belongs to the run (its session and user, and
its origin message or one the gate recorded as registering it) and to the tool that answered.
A tool whose output merely reads like `{"status": "deferred", ...}` (a ticket body a customer
wrote, say) is an ordinary output: the run goes on and nothing is listed. `execute_deferred`
checks the same ownership for an operation `deferred_operations` listed (in this process) and
against the identity in its `context=` when that names one; an operation id alone is bound to
its grant only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from agents.items import ToolCallOutputItem, TResponseInputItem
from agents.result import RunResultBase
from agents.tool import FunctionToolResult
from agents.tool_context import ToolContext

from effectgate import CallContext, EffectGate, Executed, Grant, Pending, Refused
from effectgate.adapter import Paused, bind_decision

from ._context import STATE_KEY, TamperedState, adapter_state, call_context
from ._native import calling, outside_run
from ._reach import agent_gate, tool_gate
from ._records import check_owner

_DEFERRED = "deferred"
_IDENTITY = ("session_id", "origin_message_id", "user_id")


def deferred_payload(outcome: Pending | Executed) -> dict[str, Any]:
    """What a gated tool answers in deferred mode: the operation id is the approval id."""
    status = "executed" if isinstance(outcome, Executed) else outcome.status
    tool = outcome.tool if isinstance(outcome, Executed) else outcome.card.tool
    body: dict[str, Any] = {
        "status": "deferred",
        "operation_id": outcome.approval_id,
        "tool": tool,
        "approval_status": status,
    }
    if isinstance(outcome, Pending):
        body["version"] = outcome.version
        body["args_hash"] = outcome.card.args_hash
        body["approver_role"] = outcome.card.approver_role
        body["message"] = (
            f"{tool} is waiting for approval by {outcome.card.approver_role}; it has not run. "
            f"Tell the user it is pending review."
            if outcome.status == "pending"
            else f"{tool} is {outcome.status} and has not run yet; its result will follow."
        )
    else:
        body["message"] = f"{tool} has already run for this request; its result is on record."
    return body


def is_deferred(output: Any) -> bool:
    """Whether `output` has the shape of a deferred payload. The shape proves nothing (any tool can
    answer it): the adapter decides on its own records (`own_deferred`, `deferred_operations`)."""
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except ValueError:
            return False
    return isinstance(output, Mapping) and output.get("status") == "deferred" and "operation_id" in output


def _recorded(context: Any) -> Mapping[str, Any]:
    state = context.get(STATE_KEY) if isinstance(context, Mapping) else None
    records = state.get(_DEFERRED) if isinstance(state, Mapping) else None
    return records if isinstance(records, Mapping) else {}


def remember_deferred(context: Any, call_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Record the payload a gated tool answers for call `call_id` in this run; returns it."""
    state = adapter_state(context)
    records = state.get(_DEFERRED)
    if not isinstance(records, MutableMapping):
        records = state[_DEFERRED] = {}
    records[call_id] = payload
    return payload


def _call_id(item: Any) -> str | None:
    raw = getattr(item, "raw_item", None)
    call_id = raw.get("call_id") if isinstance(raw, Mapping) else getattr(raw, "call_id", None)
    return call_id if isinstance(call_id, str) else None


def own_deferred(context: Any, result: FunctionToolResult) -> bool:
    """Whether a tool result of this turn is a deferred answer: the very payload a gated tool
    recorded for its call (`remember_deferred`), never an output that only parses as one."""
    record = _recorded(context).get(_call_id(result.run_item) or "")
    return (
        record is not None
        and result.output is record
        and tool_gate(result.tool) is not None
        and result.tool.name == record.get("tool")
    )


class _Operation(dict[str, Any]):
    """A deferred payload as `deferred_operations` lists it, with the identity of the run it was
    checked for (`execute_deferred` checks it again)."""

    identity: CallContext


def _owned(gate: EffectGate, operation_id: str, tool: str, ctx: CallContext) -> None:
    row = gate.store.get_approval(operation_id)
    if row is None or row.tool != tool:
        raise TamperedState(f"operation {operation_id} is not a {tool} operation on this gate's record")
    check_owner(gate, row, ctx)


def deferred_operations(result: RunResultBase, *, gate: EffectGate | None = None) -> list[dict[str, Any]]:
    """The deferred answers the gated tools gave during this run, in order: each one's payload as
    the tool answered it, once the gate's store shows the operation belongs to this run's identity
    and to that tool (`TamperedState` otherwise). `gate` defaults to the gate of the agent the run
    ended on."""
    context = result.context_wrapper.context
    records = _recorded(context)
    if not records:
        return []
    gate = gate if gate is not None else agent_gate(result.last_agent)
    if gate is None:
        raise ValueError(
            "the run did not end on an agent gate_agent made: pass deferred_operations(result, gate=...)"
        )
    ctx = call_context(context, agent_id="-")
    out: list[dict[str, Any]] = []
    for item in result.new_items:
        record = records.get(_call_id(item) or "") if isinstance(item, ToolCallOutputItem) else None
        if not isinstance(record, Mapping) or item.output != record:
            continue
        op = _Operation(record)
        _owned(gate, _stored(op)[0], str(op.get("tool")), ctx)  # an edited payload: TamperedState
        op.identity = ctx
        out.append(op)
    return out


Operation = str | Mapping[str, Any]


def _check_run(gate: EffectGate, operation: Operation, operation_id: str, context: Any) -> None:
    """An operation `deferred_operations` listed must still belong to the run it was listed for,
    and any operation to the session and user `context` names, and to its message when it names
    all three (`TamperedState` otherwise)."""
    if isinstance(operation, _Operation):
        _owned(gate, operation_id, str(operation.get("tool")), operation.identity)
    given = context if isinstance(context, Mapping) else {}
    named = {k: given[k] for k in _IDENTITY if isinstance(given.get(k), str) and given[k]}
    row = gate.store.get_approval(operation_id) if named else None
    if row is None:
        return
    if len(named) == len(_IDENTITY):
        check_owner(gate, row, CallContext(**named, agent_id="-"))
        return
    # as `check_owner`: the row's (latest version's) identity, or one the gate recorded for it
    # (the user of an earlier version, which another user of the session amended)
    wanted = {k: v for k, v in named.items() if k != "origin_message_id"}
    if all(getattr(row, k) == v for k, v in wanted.items()):
        return
    if row.session_id != named.get("session_id", row.session_id) or not any(
        all(getattr(e, k) == v for k, v in wanted.items()) for e in gate.store.events(approval_id=row.id)
    ):
        raise TamperedState(f"operation {operation_id} belongs to another session or user than this context")


def _stored(operation: Mapping[str, Any]) -> tuple[str, int | None, Any]:
    """The operation id, version (None if absent) and args hash of a stored deferred payload;
    `TamperedState` when it has no operation id or a version that is not a number."""
    operation_id, version = operation.get("operation_id"), operation.get("version")
    if not isinstance(operation_id, str) or not operation_id:
        raise TamperedState(
            "the deferred operation carries no operation_id (a non-empty string): it is not a payload "
            "a gated tool answered. Nothing ran"
        )
    try:
        version = None if version is None else int(version)
    except (TypeError, ValueError, OverflowError):
        raise TamperedState(
            f"the deferred operation {operation_id} carries version {version!r}, not a number: it is "
            "not the payload a gated tool answered. Nothing ran"
        ) from None
    return operation_id, version, operation.get("args_hash")


def _bound(
    gate: EffectGate, operation: Operation, grant: Grant | str | None, context: Any = None
) -> tuple[str, str | None]:
    """The operation id, and the grant's token once it is bound to that operation: a grant for
    another operation, or for a version the operation moved past, is `DecisionMismatch`; an
    operation that is not the run's is `TamperedState` (`_check_run`)."""
    if isinstance(operation, Mapping):
        operation_id, version, hash_ = _stored(operation)
    else:
        operation_id, version, hash_ = operation, None, None
    _check_run(gate, operation, operation_id, context)
    if grant is None:
        return operation_id, None
    token = grant.token if isinstance(grant, Grant) else grant
    if version is None or hash_ is None:
        card = gate.card(operation_id)
        version, hash_ = card.version, card.args_hash
    bind_decision(gate, Paused(operation_id, version, str(hash_)), token)
    return operation_id, token


def _outside_run(gate: EffectGate, operation_id: str, context: Any) -> ToolContext[Any]:
    card = gate.card(operation_id)
    return outside_run(card.tool, operation_id, card.args, context)


def execute_deferred(
    gate: EffectGate, operation: Operation, grant: Grant | str | None = None, *, context: Any = None
) -> Executed:
    """Run an approved deferred operation once (its stored result if it already ran).

    `operation` is the operation id or the deferred payload (`deferred_operations(result)[i]`,
    whose version and args hash the grant must then match). The grant must be for that
    operation: a grant for another one raises `DecisionMismatch` and runs nothing. An operation
    `deferred_operations` listed must still belong to that run, and any operation to the
    session, user and message `context` names (`TamperedState` otherwise). A tool of
    `gate_agent(..., effects=...)` runs outside any SDK run: a `RunContextWrapper` parameter sees
    `context` (default `{}`) and the operation id as its call id."""
    operation_id, token = _bound(gate, operation, grant, context)
    done = gate.result(operation_id)
    if done is not None:
        return done
    if token is None:
        raise ValueError(f"operation {operation_id} has not run: pass the grant from gate.approve")
    with calling(_outside_run(gate, operation_id, context)):
        return gate.execute(token)


async def aexecute_deferred(
    gate: EffectGate, operation: Operation, grant: Grant | str | None = None, *, context: Any = None
) -> Executed:
    """`execute_deferred` on the event loop (an async tool is awaited on it)."""
    operation_id, token = _bound(gate, operation, grant, context)
    done = gate.result(operation_id)
    if done is not None:
        return done
    if token is None:
        raise ValueError(f"operation {operation_id} has not run: pass the grant from gate.approve")
    with calling(_outside_run(gate, operation_id, context)):
        return await gate.aexecute(token)


def outcome_message(outcome: Executed | Refused) -> list[TResponseInputItem]:
    """The input items that tell the model how a deferred operation ended: effectgate's status line
    as a developer message and, for an executed operation, its result as tool output (a
    `function_call` of the tool, call id `eg-<operation id>` (at most 40 characters), and its
    `function_call_output`; so is a refusal that quotes the tool's error: it ran and failed, or its
    outcome is unknown). The result is text the tool's far side may control (a provider's reply,
    an email body): it never reaches the model with developer authority."""
    ran = {"failed": "ran and failed", "needs_reconciliation": "ran; its outcome is unknown"}
    if isinstance(outcome, Refused) and outcome.code not in ran:
        text = (
            f"effectgate: operation {outcome.approval_id} ({outcome.tool}) was not executed. "
            f"{outcome.for_model()}"
        )
        return [{"role": "developer", "content": text}]
    # what it ran gave: its result, or a refusal quoting the tool's error (a provider's text too)
    # at most 40 characters: Chat Completions refuses a longer tool call id (a 400, the next run fails)
    call_id = f"eg-{outcome.approval_id}"
    if len(call_id) > 40:
        call_id = f"eg-{hashlib.sha256(str(outcome.approval_id).encode()).hexdigest()[:37]}"
    what = ran[outcome.code] if isinstance(outcome, Refused) else "was approved and executed"
    text = (
        f"effectgate: operation {outcome.approval_id} ({outcome.tool}) {what}. "
        f"What it gave is the output of tool call {call_id}."
    )
    return [
        {"role": "developer", "content": text},
        {"type": "function_call", "call_id": call_id, "name": outcome.tool, "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": outcome.for_model()},
    ]


def with_outcome(
    history: RunResultBase | Sequence[TResponseInputItem], outcome: Executed | Refused
) -> list[TResponseInputItem]:
    """The history of the previous run (a `Runner.run` or `Runner.run_streamed` result, or its
    input items) with the operation's outcome appended: the next run's input."""
    items: list[TResponseInputItem] = (
        history.to_input_list() if isinstance(history, RunResultBase) else [dict(i) for i in history]  # type: ignore[misc]
    )
    return [*items, *outcome_message(outcome)]
