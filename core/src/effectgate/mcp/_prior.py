"""A read call an MCP server's table lets run now that was proposed for approval before: the
proxy's upstream claimed a stricter class then (`destructiveHint`, `readOnlyHint: false`) and no
longer does, or the configuration (`mcp serve`: the application's table) gated it.

A hint only ever raises a row, but a hint dropped in a later listing lowers the row back to the
table's class. The client re-issues a call as the same request (its origin is the call itself,
`_common.origin_for`). A write looks for its call's approval itself (`_written.proposed_before`,
in its claim transaction); a read does not (reads touch no table as they run), so before a read
runs here, the server looks for the approval of this very call (the intent key the gate filed it
under, `_intent.intent_keys`; its seal checked): one that ran answers with its stored result; any
other is refused (`mismatch`, recorded) and nothing runs: an approved call never runs a second
time, nor a waiting one with nobody's approval while its card still waits in the inbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from .._intent import intent_keys
from .._seal import approval_sealed
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
        intent = intent_keys(spec, frozen, hashed, ctx, spec.subject_of(frozen))[1]  # as the gate keys it
    except (EffectGateError, TypeError, ValueError):
        return None  # arguments the gate refuses (Invalid) before anything is keyed
    with gate.store.reading() as conn:
        row = gate.store.approval_for_key(conn, intent)
    if row is None or (row.session_id, row.tool) != (ctx.session_id, spec.name):
        return None
    if not approval_sealed(gate.keyring, row):
        return None  # not a record the gate sealed: nothing is answered or refused on it
    ran = gate.result(row.id) if row.args_hash == hashed else None
    if ran is not None:
        return ran
    message = (
        f"{spec.name}: this call was proposed for approval as a {row.effect} call (approval {row.id}, "
        f"{row.status}); its tool changed since (upstream or in the configuration) and it does not "
        f"run as a {spec.effect} call. Nothing ran; this request cannot run as it is."
    )
    return gate.refuse(spec.name, ctx, code="mismatch", message=message, approval_id=row.id)


__all__ = ["call_once"]
