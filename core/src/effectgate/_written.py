"""A write's idempotency key; what a gated call answers when this very call (its session,
origin message and arguments) already ran as a write: a tool reclassified from write to send,
money or destructive between a run and its replay must not reach an approver a second time; and
what a write answers when this very call was proposed for approval while its row was gated (a
tool reclassified the other way): it never runs a second time, nor without its approval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._answers import unknown_outcome
from ._deps import Events
from ._execution import WRITE_PREFIX, exec_key, stored_replay
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


def call_approval(
    store: Store,
    conn: Any,
    keyring: Keyring,
    spec: ToolSpec,
    args: Mapping[str, Any],
    frozen: str,
    ctx: CallContext,
) -> ApprovalRow | None:
    """The sealed approval of this very call (`args` frozen, `frozen` their hash) proposed while
    its row was gated: the one its intent key names, else (the row's subject definition changed
    since, so the key did) the newest its session's tool had from the same message with the same
    arguments; never a shadow proposal (it never ran, and never can). None when there is none."""
    intent = intent_keys(spec, args, frozen, ctx, spec.subject_of(args))[1]
    keyed, alike = store.call_approvals(
        conn, intent, ctx.session_id, spec.name, ctx.origin_message_id, frozen
    )
    if keyed is not None and (keyed.session_id, keyed.tool) != (ctx.session_id, spec.name):
        keyed = None
    row = keyed or alike  # `alike` is never a shadow card: a newer one would hide the live one
    return row if row is not None and approval_sealed(keyring, row) else None


def proposed_before(
    store: Store,
    conn: Any,
    keyring: Keyring,
    events: Events,
    spec: ToolSpec,
    args: Mapping[str, Any],
    frozen: str,
    ctx: CallContext,
) -> Executed | Refused | ApprovalRow | None:
    """A write's look, in its claim transaction, for this very call proposed for approval while
    its row was gated (`call_approval`): its stored result when that approval ran these arguments
    (a replay, recorded), the gated replay's `needs_reconciliation` when its grant ran with an
    unknown outcome (it may have happened: never "nothing ran"), else the approval, which the write
    refuses (`mismatch`): it never runs a second time, nor with nobody's approval while its card
    waits. None when there is none (or not one the gate sealed: the audit says so)."""
    row = call_approval(store, conn, keyring, spec, args, frozen, ctx)
    if row is None:
        return None
    same_args = row.args_hash == frozen
    # What ran answers (its sealed version's execution record, as `gate.result` reads it), never
    # the status column, which no seal covers: an edit must not tell a paid call "nothing ran".
    record = store.load(conn, exec_key(row))
    answer: Executed | Refused | None = unknown_outcome(row, record)  # whatever its arguments
    if answer is None and same_args and record is not None and record.status == "succeeded":
        answer = stored_replay(row, record.result) if record.payload_hash == row.args_hash else None
    if answer is None:
        return row
    store.append_events(
        conn, [events.event("replay", row=row, ctx=ctx, status=row.status, same_args=same_args)]
    )
    return answer
