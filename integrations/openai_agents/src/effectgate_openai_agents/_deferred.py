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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents import RunResult
from agents.items import ToolCallOutputItem, TResponseInputItem
from agents.tool_context import ToolContext

from effectgate import EffectGate, Executed, Grant, Pending, Refused
from effectgate.adapter import Paused, bind_decision

from ._native import calling, outside_run


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
        )
    else:
        body["message"] = f"{tool} has already run for this request; its result is on record."
    return body


def is_deferred(output: Any) -> bool:
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except ValueError:
            return False
    return isinstance(output, Mapping) and output.get("status") == "deferred" and "operation_id" in output


def deferred_operations(result: RunResult) -> list[dict[str, Any]]:
    """The deferred answers gated tools gave during this run, in order."""
    out = []
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem) and is_deferred(item.output):
            output = item.output
            out.append(dict(json.loads(output) if isinstance(output, str) else output))
    return out


Operation = str | Mapping[str, Any]


def _bound(gate: EffectGate, operation: Operation, grant: Grant | str | None) -> tuple[str, str | None]:
    """The operation id, and the grant's token once it is bound to that operation: a grant for
    another operation, or for a version the operation moved past, is `DecisionMismatch`."""
    if isinstance(operation, Mapping):
        operation_id = str(operation["operation_id"])
        version, hash_ = operation.get("version"), operation.get("args_hash")
    else:
        operation_id, version, hash_ = operation, None, None
    if grant is None:
        return operation_id, None
    token = grant.token if isinstance(grant, Grant) else grant
    if version is None or hash_ is None:
        card = gate.card(operation_id)
        version, hash_ = card.version, card.args_hash
    bind_decision(gate, Paused(operation_id, int(version), str(hash_)), token)
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
    operation: a grant for another one raises `DecisionMismatch` and runs nothing. A tool of
    `gate_agent(..., effects=...)` runs outside any SDK run: a `RunContextWrapper` parameter sees
    `context` (default `{}`) and the operation id as its call id."""
    operation_id, token = _bound(gate, operation, grant)
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
    operation_id, token = _bound(gate, operation, grant)
    done = gate.result(operation_id)
    if done is not None:
        return done
    if token is None:
        raise ValueError(f"operation {operation_id} has not run: pass the grant from gate.approve")
    with calling(_outside_run(gate, operation_id, context)):
        return await gate.aexecute(token)


def outcome_message(outcome: Executed | Refused) -> TResponseInputItem:
    """The input item that tells the model how a deferred operation ended."""
    if isinstance(outcome, Executed):
        text = (
            f"effectgate: operation {outcome.approval_id} ({outcome.tool}) was approved and executed. "
            f"Result: {outcome.for_model()}"
        )
    else:
        text = (
            f"effectgate: operation {outcome.approval_id} ({outcome.tool}) was not executed. "
            f"{outcome.for_model()}"
        )
    return {"role": "developer", "content": text}


def with_outcome(
    history: RunResult | Sequence[TResponseInputItem], outcome: Executed | Refused
) -> list[TResponseInputItem]:
    """The history of the previous run with the operation's outcome appended: the next run's input."""
    items: list[TResponseInputItem] = (
        history.to_input_list() if isinstance(history, RunResult) else [dict(i) for i in history]  # type: ignore[misc]
    )
    return [*items, outcome_message(outcome)]
