"""What the run context keeps of each paused call, and the checks before any of it decides.

When a gated call pauses, effectgate writes a record under `context["effectgate"]["approvals"]`,
keyed by the SDK's call id: the approval id, version, args hash and tool the gate answered. The
record travels in the `RunState` snapshot, which anyone holding it can edit, so it carries a seal
(the gate's keyring) over those fields, the call id and the run's identity (session, origin
message, user). Whatever approves, denies or settles through the record (`approve`, `approve_as`,
`reject`, the SDK's own `state.approve` / `state.reject`) first calls `verified_approval`:

- the run's identity verifies against the signature effectgate wrote (`_context`);
- the record's seal verifies for this call id and this identity: a record pointed at another
  approval, moved to another call (two records swapped) or carried into another run is refused;
- given the SDK's paused item, its tool and the hash of its arguments are the record's: the call
  the SDK will run is the one the approval was registered for; the SDK's own `state.approve`, whose
  item effectgate never sees, is settled only while the SDK's fingerprint of the call is the one
  the record sealed when it paused (`same_invocation`: an item edited in the snapshot, its unkeyed
  fingerprint recomputed or dropped, approves nothing);
- the approval, as the gate's store has it, belongs to this run: the same session and user, and
  the same origin message or one the gate recorded as registering it (a later message of the
  session that found the same waiting approval); the same tool, and at the recorded version the
  same args hash.

Anything else is `TamperedState`, and nothing is decided. Records from before the seal existed
(an earlier release's snapshots) are refused the same way: re-run the request. A paused call the
resumed SDK asks about again (its paused item dropped from the snapshot) registers nothing unless
it is the call its record sealed (`check_asked_again`): an edited one would amend the approval.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

from effectgate import CallContext, EffectGate, Outcome, Pending, Refused
from effectgate import adapter as _adapter
from effectgate.canonical import args_hash, freeze
from effectgate.stores.records import ApprovalRow

from ._arguments import parse
from ._context import TamperedState, adapter_state, call_context

_PURPOSE = "openai_agents.approval"
_FIELDS = ("approval_id", "version", "args_hash", "tool")


def _sealed(call_id: str, record: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
    sealed = {
        "call_id": call_id,
        **{name: record.get(name) for name in _FIELDS},
        "session_id": ctx.session_id,
        "origin_message_id": ctx.origin_message_id,
        "user_id": ctx.user_id,
    }
    if "invocation" in record:  # sealed when present: removing or adding it breaks the seal
        sealed["invocation"] = record["invocation"]
    return sealed


def invocation_of(wrapper: Any, call_id: str) -> str | None:
    """The SDK's own fingerprint of call `call_id` (its tool and arguments) in the run context
    `wrapper` (0.24 keeps one per call id; None when it has none)."""
    found = getattr(getattr(wrapper, "_tool_invocations", None), "get", lambda _: None)(call_id)
    fingerprint = getattr(found, "fingerprint", None)
    return fingerprint if isinstance(fingerprint, str) else None


#: What the model is told when a native `state.approve(item)` approved an item that is not the call
#: effectgate registered (`same_invocation`).
EDITED_ITEM = (
    "the SDK item approved with state.approve() is not the call effectgate registered (its "
    "arguments were edited in the run state), so nothing was approved"
)


def same_invocation(wrapper: Any, call_id: str, record: Mapping[str, Any]) -> bool:
    """Whether the call the SDK holds for `call_id` now (the item `state.approve` decided) is the
    one the record sealed when it paused: the SDK's fingerprint of its tool and arguments, kept in
    the record, is the context's. A record without one (an earlier release's) cannot tell."""
    sealed = record.get("invocation")
    return sealed is None or invocation_of(wrapper, call_id) == sealed


def paused_record(
    gate: EffectGate, ctx: CallContext, call_id: str, pending: Pending, invocation: str | None = None
) -> dict[str, Any]:
    """The record of one paused call (its approval, version, args hash and tool, and the SDK's
    fingerprint of the paused call, `invocation_of`), sealed with the gate's keyring for this
    call id and the run's identity."""
    record: dict[str, Any] = {
        "approval_id": pending.approval_id,
        "version": pending.version,
        "args_hash": pending.card.args_hash,
        "tool": pending.card.tool,
    }
    if invocation is not None:
        record["invocation"] = invocation
    record["seal"] = _adapter.sign_state(gate, _PURPOSE, _sealed(call_id, record, ctx))
    return record


def hash_of_call(gate: EffectGate, tool: str, arguments: str) -> str | None:
    """The args hash the gate gives `arguments` (the model's JSON) for `tool`; None when the tool
    has no row or the arguments cannot be hashed (the gate would have refused them)."""
    spec = gate.table.get(tool)
    if spec is None:
        return None
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
        return args_hash(tool, freeze(parsed, spec.schema)) if isinstance(parsed, Mapping) else None
    except (ValueError, TypeError):  # JSON errors and the canonical form's ArgumentError
        return None


def for_other_arguments(gate: EffectGate, tool: str, params: Any, outcome: Outcome) -> Outcome:
    """The gate's answer to a call, unless it is its message's decided approval for other
    arguments (`Pending` with `replay`: the intent key finds it, never a second one; a retried
    request's model asked for something else): no decision could bind this call to it, so it
    does not pause on it, and the model is told it has not run (`mismatch`)."""
    if not isinstance(outcome, Pending) or not outcome.replay:
        return outcome
    arguments = json.dumps(params) if isinstance(params, Mapping) else ""
    if hash_of_call(gate, tool, arguments) == outcome.card.args_hash:
        return outcome
    message = (
        f"this request's approval {outcome.approval_id} (version {outcome.version}, "
        f"{outcome.status}) is for other arguments of {tool}; this call was not registered and has not run"
    )
    return Refused(code="mismatch", message=message, tool=tool, approval_id=outcome.approval_id)


#: How many model responses of one run context a `Turn` keeps behind it (`Turn.earlier`).
_KEPT_TURNS = 64


class Turn(dict[str, list[str]]):
    """The calls of one model response as `StepHooks.on_llm_end` recorded them in this process. A
    turn entry read back from a snapshot is a plain dict: unsigned, anyone holding the snapshot
    can edit it, so it never names the calls registered together with one (`step_calls`).
    `earlier` is the response recorded before it in the same run context (never serialized): an
    agent run as a tool (`agent.as_tool`) shares its caller's context and records its own answers
    there while its caller's calls of one response still run."""

    earlier: Turn | None = None
    #: its calls an input guardrail refused before they registered (deferred mode): never registered
    refused: frozenset[str] = frozenset()
    #: its calls whose input guardrails are running (deferred mode, `_guarding`), replaced on change
    checking: Mapping[str, asyncio.Future[None]] = MappingProxyType({})


def record_turn(state: MutableMapping[str, Any], turn: Turn) -> None:
    """Record `turn` as the run context's latest response, `_KEPT_TURNS` responses behind it."""
    previous, node = state.get("turn"), turn
    turn.earlier = previous if isinstance(previous, Turn) else None
    for _ in range(_KEPT_TURNS - 1):
        if node.earlier is None:
            break
        node = node.earlier
    node.earlier = None
    state["turn"] = turn


def step_calls(
    turn: Any, call_id: str, tool: str = "", args: Any = None
) -> tuple[Turn | None, list[tuple[str, str, str]]]:
    """The model response that made call `call_id` (`tool` with `args`), and its calls to register
    together with it: the latest `Turn` recorded in this process (or behind it, `Turn.earlier`)
    naming that call, else the latest naming its id ((None, []): register the call alone, with
    its own arguments). A restored entry is checked (`turn_calls`) and not used."""
    if not isinstance(turn, Turn):
        if isinstance(turn, Mapping) and call_id in turn:
            turn_calls(turn)  # TamperedState when it was edited
        return None, []
    first: Turn | None = None
    node: Turn | None = turn
    while node is not None:
        entry = node.get(call_id)
        made = isinstance(entry, list) and len(entry) == 2 and entry[0] == tool
        if made and isinstance(entry[1], str) and parse(entry[1]) == args:  # type: ignore[index]
            return node, turn_calls(node)
        first = node if first is None and entry is not None else first
        node = node.earlier
    return first, turn_calls(first) if first is not None else []


def turn_calls(turn: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The calls of the model response the `turn` entry records (`StepHooks.on_llm_end`): call id,
    tool and arguments, each a string. The entry travels in the snapshot: anything else in it was
    edited (`TamperedState`, nothing is registered)."""
    calls: list[tuple[str, str, str]] = []
    for call_id, entry in turn.items():
        pair = isinstance(entry, list | tuple) and len(entry) == 2
        if not pair or not all(isinstance(v, str) for v in entry):
            raise TamperedState(
                f"the run state's effectgate turn entry for call {call_id!r} is not a [tool, arguments] "
                "pair of strings as effectgate wrote it: the run state was edited. Nothing was registered"
            )
        calls.append((str(call_id), entry[0], entry[1]))
    return calls


def check_asked_again(
    gate: EffectGate, wrapper: Any, ctx: CallContext, call_id: str, tool: str, params: Any
) -> None:
    """`TamperedState` when the SDK asks whether a call the run paused on needs approval again (a
    restored snapshot whose paused item was dropped) and the call is not the one the record sealed
    for this call id and run: its tool, args hash or the SDK's fingerprint of it (`invocation_of`)
    edited, which would register (amend the approval to) a call no model proposed. A call id that
    a model response of this process names (a `Turn`), or with another run's record, is a new call."""
    state = adapter_state(wrapper.context)
    record, turn = state["approvals"].get(call_id), state.get("turn")
    if not isinstance(record, Mapping) or (isinstance(turn, Turn) and call_id in turn):
        return
    try:
        _adapter.verify_state(gate, _PURPOSE, _sealed(call_id, record, ctx), record.get("seal"))
    except _adapter.TamperedState:
        return  # not this run's record (a context reused for another message): not its paused call
    sealed, current = record.get("invocation"), invocation_of(wrapper, call_id)
    arguments = json.dumps(params) if isinstance(params, Mapping) else ""
    if (
        tool != record.get("tool")
        or hash_of_call(gate, tool, arguments) != record.get("args_hash")
        or (sealed is not None and current is not None and current != sealed)
    ):
        raise TamperedState(
            f"paused call {call_id!r} is not the {record.get('tool')!r} call its approval was "
            "registered for: the run state was edited. Nothing was registered"
        )


def sticky_elsewhere(gate: EffectGate, wrapper: Any, call_id: str, record: Mapping[str, Any]) -> bool:
    """Whether the SDK decided call `call_id` only through a sticky decision of its tool
    (`always_approve` / `always_reject`: no decision names the call) and `record` is not sealed
    for this run (one a context reused for another message carries): the decision is not that
    call's, which is another run's to decide."""
    for sdk in getattr(wrapper, "_approvals", {}).values():
        named = (getattr(sdk, "approved", None), getattr(sdk, "rejected", None))
        if any(isinstance(ids, list) and call_id in ids for ids in named):
            return False
    try:
        ctx = call_context(wrapper.context, agent_id="-")
        _adapter.verify_state(gate, _PURPOSE, _sealed(call_id, record, ctx), record.get("seal"))
    except (_adapter.TamperedState, _adapter.MissingIdentity):
        return True
    return False


def check_owner(gate: EffectGate, row: ApprovalRow, ctx: CallContext) -> None:
    """`TamperedState` unless the stored approval belongs to the run `ctx`: its session, origin
    message and user, or an event the gate recorded for it under exactly that identity (a later
    message of the session that found the same waiting approval, or amended it)."""
    own = (row.session_id, row.origin_message_id, row.user_id)
    identity = (ctx.session_id, ctx.origin_message_id, ctx.user_id)
    if own == identity:
        return
    if own[0] == identity[0] and any(
        (e.session_id, e.origin_message_id, e.user_id) == identity
        for e in gate.store.events(approval_id=row.id)
    ):
        return
    raise TamperedState(
        f"approval {row.id} belongs to another session, message or user than this run; the run "
        "state was edited. Nothing was decided"
    )


def verified_approval(
    gate: EffectGate,
    context: Any,
    call_id: str,
    *,
    tool: str | None = None,
    arguments: str | None = None,
) -> tuple[Mapping[str, Any], ApprovalRow | None]:
    """The record of paused call `call_id` and its approval's stored row (None when the store has
    no such approval), once everything in the module docstring holds; `tool` and `arguments` are
    the SDK's paused item, when the caller has it. Blocking (it reads the store)."""
    ctx = call_context(context, agent_id="-", gate=gate, resumed=True)
    record = adapter_state(context)["approvals"].get(call_id)
    if not isinstance(record, Mapping):
        raise TamperedState(f"the run state carries no effectgate record for call {call_id!r}")
    try:
        _adapter.verify_state(gate, _PURPOSE, _sealed(call_id, record, ctx), record.get("seal"))
    except _adapter.TamperedState as exc:
        raise TamperedState(
            f"effectgate's record of paused call {call_id!r} does not verify for this call and this "
            "run: it was edited, moved from another call or run, or written by an earlier release. "
            "Nothing was decided"
        ) from exc
    recorded_tool = str(record["tool"])
    if tool is not None and tool != recorded_tool:
        raise TamperedState(
            f"paused call {call_id!r} is {tool!r} in the run state, but its approval is for "
            f"{recorded_tool!r}: the run state was edited. Nothing was decided"
        )
    if arguments is not None and hash_of_call(gate, recorded_tool, arguments) != record["args_hash"]:
        raise TamperedState(
            f"the arguments of paused call {call_id!r} are not the ones its approval was registered "
            "for: the run state was edited. Nothing was decided"
        )
    row = gate.store.get_approval(str(record["approval_id"]))
    if row is None:
        return record, None
    check_owner(gate, row, ctx)
    same_version = row.version == record["version"]
    if row.tool != recorded_tool or (same_version and row.args_hash != record["args_hash"]):
        raise TamperedState(
            f"approval {row.id} is not the call effectgate recorded for {call_id!r}; nothing was decided"
        )
    return record, row


__all__ = [
    "EDITED_ITEM",
    "Turn",
    "check_asked_again",
    "check_owner",
    "hash_of_call",
    "invocation_of",
    "paused_record",
    "record_turn",
    "same_invocation",
    "step_calls",
    "sticky_elsewhere",
    "turn_calls",
    "verified_approval",
]
