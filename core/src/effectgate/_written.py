"""A write's idempotency key; what a gated call answers when this very call (its session,
origin message and arguments) already ran as a write: a tool reclassified from write to send,
money or destructive between a run and its replay must not reach an approver a second time; and
what a write answers when this very call was proposed for approval while its row was gated (a
tool reclassified the other way): it never runs a second time, nor without its approval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._deps import Events
from ._execution import WRITE_PREFIX, exec_key
from ._intent import intent_keys
from ._seal import approval_sealed
from .canonical import key_of
from .context import CallContext
from .outcomes import Executed, Outcome, RefusalCode, Refused
from .stores.protocol import Store
from .stores.records import ApprovalRow
from .table import ToolSpec
from .tokens import Keyring


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


def proposed_before(
    store: Store,
    conn: Any,
    keyring: Keyring,
    events: Events,
    spec: ToolSpec,
    args: Mapping[str, Any],
    frozen: str,
    ctx: CallContext,
) -> Executed | ApprovalRow | None:
    """A write's look, in its claim transaction, for this very call proposed for approval while
    its row was gated (the same intent key; the approval sealed, of this session and tool): its
    stored result when that approval ran these arguments (a replay, recorded), else the approval,
    which the write refuses (`mismatch`): it never runs a second time, nor with nobody's approval
    while its card waits. None when there is none (or not one the gate sealed: the audit says so)."""
    row = store.approval_for_key(conn, intent_keys(spec, args, frozen, ctx, spec.subject_of(args))[1])
    if row is None or (row.session_id, row.tool) != (ctx.session_id, spec.name):
        return None
    if not approval_sealed(keyring, row):
        return None
    if row.status != "executed" or row.args_hash != frozen:
        return row
    record = store.load(conn, exec_key(row))
    if record is None or record.payload_hash != row.args_hash or record.status != "succeeded":
        return row
    store.append_events(conn, [events.event("replay", row=row, ctx=ctx, status=row.status, same_args=True)])
    return Executed(
        tool=row.tool,
        result=record.result,
        replay=True,
        approval_id=row.id,
        version=row.version,
        idempotency_key=exec_key(row),
    )
