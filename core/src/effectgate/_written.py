"""A write's idempotency key, and what a gated call answers when this very call (its session,
origin message and arguments) already ran as a write: a tool reclassified from write to send,
money or destructive between a run and its replay must not reach an approver a second time."""

from __future__ import annotations

from typing import Any

from ._deps import Events
from ._execution import WRITE_PREFIX
from .canonical import key_of
from .context import CallContext
from .outcomes import Executed, Outcome, RefusalCode, Refused
from .stores.protocol import Store
from .table import ToolSpec


def write_key(tool: str, ctx: CallContext, args_hash: str) -> str:
    """A write's idempotency key, passed downstream: one per (session, tool, origin message, args)."""
    return f"{WRITE_PREFIX}{tool}_" + key_of("write", ctx.session_id, tool, ctx.origin_message_id, args_hash)


def ran_as_write(
    store: Store, conn: Any, events: Events, spec: ToolSpec, args_hash: str, ctx: CallContext
) -> Outcome | None:
    """What a gated call with no approval of its own answers when this very call (message and
    arguments) ran as a write before its row was reclassified: the stored result (a replay),
    or a refusal while that run is in flight or its outcome is unknown; never a second proposal
    an approver could grant. None when it did not run (or failed definitely), or in shadow mode."""
    if spec.shadow:  # recorded for review, never run: nothing to answer for it
        return None
    tool = spec.name
    key = write_key(tool, ctx, args_hash)
    record = store.load(conn, key)
    if record is None or record.payload_hash != args_hash or record.status == "failed":
        return None
    store.append_events(conn, [events.event("replay", spec=spec, ctx=ctx, args_hash_=args_hash, key=key)])
    if record.status == "succeeded":
        return Executed(tool=tool, result=record.result, replay=True, idempotency_key=key)
    code: RefusalCode = "in_progress" if record.status == "in_progress" else "needs_reconciliation"
    message = f"{tool}: this call ran as a write (key {key}) and its outcome is {record.status}"
    return Refused(code=code, message=message, tool=tool)
