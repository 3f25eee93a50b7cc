"""A read call an MCP server's table lets run now that was proposed for approval before: the
proxy's upstream claimed a stricter class then (`destructiveHint`, `readOnlyHint: false`) and no
longer does, or the configuration (`mcp serve`: the application's table) gated it.

A hint only ever raises a row, but a hint dropped in a later listing lowers the row back to the
table's class. The client re-issues a call as the same request (its origin is the call itself,
`_common.origin_for`). A write looks for its call's approval itself (`_written.proposed_before`,
in its claim transaction); a read does not (reads touch no table as they run), so before a read
runs here, the server looks for the approval of this very call as a write does (the intent key
the gate filed it under, or the same message and arguments where the row's subject definition
changed: `_written.call_approval`; its seal checked): one that ran answers with its stored
result, one whose grant ran with an unknown outcome `needs_reconciliation`; any other is refused
(`mismatch`, recorded) and nothing runs: an approved call never runs a second time, nor a
waiting one with nobody's approval while its card still waits in the inbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from .._answers import unknown_outcome
from .._execution import exec_key
from .._intent import reclassified_since
from .._written import call_approval
from ..canonical import args_hash, freeze
from ..context import CallContext
from ..effects import Effect
from ..errors import EffectGateError
from ..gate import EffectGate
from ..outcomes import Outcome
from ..table import ToolSpec


async def call_once(
    gate: EffectGate, name: str, spec: ToolSpec | None, args: Mapping[str, Any], ctx: CallContext
) -> Outcome:
    """`gate.acall`, unless this read call was proposed for approval before (see the module
    docstring): then its stored result, or a refusal. A write's or a gated row's call goes to the
    gate as it is (the gate finds its approval itself)."""
    read = spec is not None and spec.effect is Effect.READ and not gate.policy.gates(spec.effect)
    if read and spec is not None and gate.table.allowed(ctx.agent_id, name):
        earlier = await asyncio.to_thread(_answer, gate, spec, args, ctx)
        if earlier is not None:
            return earlier
    return await gate.acall(name, args, ctx)


def _answer(gate: EffectGate, spec: ToolSpec, args: Mapping[str, Any], ctx: CallContext) -> Outcome | None:
    try:
        frozen = freeze(args, spec.schema)
        hashed = args_hash(spec.name, frozen)
        spec.subject_of(frozen)  # as the gate keys it (`call_approval`)
    except (EffectGateError, TypeError, ValueError):
        return None  # arguments the gate refuses (Invalid) before anything is keyed
    with gate.store.reading() as conn:  # None: no approval the gate sealed (nothing answered)
        row = call_approval(gate.store, conn, gate.keyring, spec, frozen, hashed, ctx)
        # what ran answers (its version's record), not the status column (no seal covers it)
        record = gate.store.load(conn, exec_key(row)) if row is not None else None
    if row is None:
        return None
    ran = gate.result(row.id) if row.args_hash == hashed else None
    if ran is not None:
        return ran
    if unknown_outcome(row, record) is not None:  # its grant ran, its outcome unknown: it may have
        message = f"{spec.name} needs reconciliation: its outcome is unknown (approval {row.id}), so "
        message += "it may have happened; a person will reconcile it. Do not call it again."
        return gate.refuse(spec.name, ctx, code="needs_reconciliation", message=message, approval_id=row.id)
    message = reclassified_since(spec.name, row, spec.effect)
    return gate.refuse(spec.name, ctx, code="mismatch", message=message, approval_id=row.id)


__all__ = ["call_once"]
