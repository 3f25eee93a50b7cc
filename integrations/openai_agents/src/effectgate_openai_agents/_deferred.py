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
from collections.abc import Sequence
from typing import Any

from agents import RunResult
from agents.items import ToolCallOutputItem, TResponseInputItem

from effectgate import EffectGate, Executed, Grant, Refused

from ._tools import is_deferred


def deferred_operations(result: RunResult) -> list[dict[str, Any]]:
    """The deferred answers gated tools gave during this run, in order."""
    out = []
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem) and is_deferred(item.output):
            output = item.output
            out.append(dict(json.loads(output) if isinstance(output, str) else output))
    return out


def execute_deferred(gate: EffectGate, operation_id: str, grant: Grant | str | None = None) -> Executed:
    """Run an approved deferred operation once (its stored result if it already ran)."""
    done = gate.result(operation_id)
    if done is not None:
        return done
    if grant is None:
        raise ValueError(f"operation {operation_id} has not run: pass the grant from gate.approve")
    token = grant.token if isinstance(grant, Grant) else grant
    return gate.execute(token)


async def aexecute_deferred(
    gate: EffectGate, operation_id: str, grant: Grant | str | None = None
) -> Executed:
    done = gate.result(operation_id)
    if done is not None:
        return done
    if grant is None:
        raise ValueError(f"operation {operation_id} has not run: pass the grant from gate.approve")
    return await gate.aexecute(grant.token if isinstance(grant, Grant) else grant)


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
