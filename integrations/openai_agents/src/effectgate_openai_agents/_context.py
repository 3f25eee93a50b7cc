"""Who is calling, from the run context the backend passes to `Runner.run` (never model output).

The run context is a plain dict (a `Mapping`), because the SDK serializes only mappings into
`RunState` (anything else is silently replaced by `{}`), and the gate's keys must survive a
snapshot that is resumed in another process:

    context = {"session_id": "s-ada", "origin_message_id": "m3", "user_id": "u1"}
    result = await Runner.run(agent, "Please refund order 1042", context=context)

`session_id`, `origin_message_id` and `user_id` are required; `run_id` is optional (audit only).
The agent id is fixed when the tools are wrapped (`gate_tools(..., agent_id=...)`), never read
from the context. The SDK's tool-call id is kept for the audit and never used as a key.

effectgate keeps its own small state in the same dict under the reserved key `"effectgate"`:
which approval each paused call registered (so a `ToolApprovalItem` maps to its approval id in any
process), the grant tokens the application attached with `approve()` until they are spent, and a
signature (the gate's keyring) over the identity above, written when a new run first reaches
effectgate (its first model answer with `gate_agent`, else its first tool call). A new run whose
context carries another identity's entry (`{**paused_context, "origin_message_id": ...}` shares
it) signs into a copy of its own, so the run that entry belongs to can still be decided.

A `RunState` snapshot is JSON anyone holding it can edit. A resumed run is refused
(`TamperedState`, nothing runs, the SDK ends the run) unless its identity still verifies, so an
edited `user_id` cannot read another customer's order. A run counts as resumed when the SDK
carries approval decisions for it, or when its state went through `pending_approvals`,
`approval_of`, `approve`, `approve_as` or `reject` in this process: a snapshot edited to drop its
decisions, its interruption or the whole `"effectgate"` entry still has to verify. A restored
state that the application runs without any of those calls and without any decision cannot be
told from a new run inside the SDK: inspect every restored state with `pending_approvals` first.
"""

from __future__ import annotations

import copy
import re
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any, NotRequired, TypedDict

from agents.exceptions import ModelBehaviorError, UserError

from effectgate import CallContext, EffectGate
from effectgate import adapter as _adapter

STATE_KEY = "effectgate"
_IDENTITY = "openai_agents.identity"
_SIGNED_FOR = "identity_signed_for"
#: Run context wrappers of restored states the application inspected or decided in this process.
_RESUMED: weakref.WeakSet[Any] = weakref.WeakSet()


class EffectGateContext(TypedDict):
    """The run context effectgate reads (a TypedDict: pass a plain dict with these keys)."""

    session_id: str
    origin_message_id: str
    user_id: str
    run_id: NotRequired[str]


class MissingIdentity(_adapter.MissingIdentity, UserError):
    """`effectgate.adapter.MissingIdentity`, also a `UserError`: the SDK ends the run with a
    `UserError` instead of treating it as a tool failure the model is told about."""


class TamperedState(_adapter.TamperedState, UserError):
    """`effectgate.adapter.TamperedState`, also a `UserError` (the run ends, nothing runs)."""


_REQUIRED = ("session_id", "origin_message_id", "user_id")
#: The one line that gives a run its identity (named in every MissingIdentity).
HOW = "Runner.run(agent, input, context={'session_id': ..., 'origin_message_id': ..., 'user_id': ...})"


def _names(names: tuple[str, ...]) -> str:
    quoted = [f"'{n}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _mapping(context: Any) -> Mapping[str, Any]:
    if type(context) is dict:  # the common case, without the ABC checks below
        return context
    if context is None:
        raise MissingIdentity(
            f"missing {_names(_REQUIRED)}: the run was given no context. Pass a dict: {HOW}. "
            "origin_message_id is the id of the user message this run answers."
        )
    if not isinstance(context, Mapping):
        raise MissingIdentity(
            f"effectgate needs the run context to be a dict with {_names(_REQUIRED)}: {HOW}; got "
            f"{type(context).__name__}. The SDK serializes only mappings into RunState, so the keys "
            "would not survive a resume."
        )
    return context


def call_context(
    context: Any,
    *,
    agent_id: str,
    tool_call_id: str | None = None,
    gate: EffectGate | None = None,
    resumed: bool = False,
) -> CallContext:
    """The CallContext of one call; MissingIdentity when the backend left something out. With
    `gate`, the identity is signed into the context, and on a `resumed` run it must verify."""
    ctx = _mapping(context)
    if tool_call_id is not None:
        check_call_id(tool_call_id)
    values = {name: ctx.get(name) for name in _REQUIRED}
    missing = tuple(name for name, value in values.items() if not isinstance(value, str) or not value)
    if missing:
        raise MissingIdentity(
            f"missing {_names(missing)} in the run context (each a non-empty string): {HOW}. "
            "origin_message_id is the id of the user message this run answers: a replay of that "
            "message finds the same approval."
        )
    run_id, model_id = ctx.get("run_id"), ctx.get("model_id")
    made = CallContext(
        session_id=str(values["session_id"]),
        origin_message_id=str(values["origin_message_id"]),
        user_id=str(values["user_id"]),
        agent_id=agent_id,
        run_id=run_id if isinstance(run_id, str) else "",
        tool_call_id=tool_call_id,
        model_id=model_id if isinstance(model_id, str) else "",  # recorded, never deciding
    )
    if gate is not None:
        _check_identity(gate, context, made, resumed=resumed)
    return made


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_call_id(call_id: Any) -> None:
    """`ModelBehaviorError` (as the SDK's for a reused call id) when the model's tool call id is not
    text a database or snapshot can keep (a lone surrogate): raised before anything registers."""
    if not isinstance(call_id, str) or _SURROGATE.search(call_id):
        raise ModelBehaviorError(
            f"the model's tool call id {call_id!r} is not valid Unicode text; effectgate registered "
            "no call of this model response"
        )


def _check_identity(gate: EffectGate, context: Any, made: CallContext, *, resumed: bool) -> None:
    # the agent id is fixed when tools are wrapped, not read from the context: a run that hands
    # off between gated agents keeps one signed identity; the model id is recorded, not identity
    # (a run resumed on another model is the same caller)
    unsigned = ("tool_call_id", "agent_id", "model_id")
    identity = {k: v for k, v in made.as_record().items() if k not in unsigned}
    state = adapter_state(context)
    if not resumed:  # the application's own context for a new run: sign it (once per identity)
        values = tuple(identity.values())
        if state.get("identity") is None or state.get(_SIGNED_FOR) != list(values):
            if state.get("identity") is not None:
                # another run's entry, shared by a context copied from it (`{**paused, ...}`): this
                # run gets its own copy, so that run's signature and records stay as it left them
                state = context[STATE_KEY] = copy.deepcopy(dict(state))
            state["identity"] = _adapter.sign_state(gate, _IDENTITY, identity)
            state[_SIGNED_FOR] = list(values)  # what was signed: a changed identity is signed again
        return
    try:
        _adapter.verify_state(gate, _IDENTITY, identity, state.get("identity"))
    except _adapter.TamperedState as exc:
        raise TamperedState(
            "the resumed run's identity (session, message, user) is not the one effectgate signed "
            f"when the run paused: {exc}"
        ) from exc


def verify_identity(gate: EffectGate, context: Any) -> None:
    """Raise `TamperedState` unless the paused run's context still carries the identity effectgate
    signed for it (`MissingIdentity` when a key is gone). The agent id is not part of it."""
    call_context(context, agent_id="-", gate=gate, resumed=True)


def has_signed_identity(context: Any) -> bool:
    """Whether effectgate ever signed this context's identity (true of every run that paused on a
    gated call)."""
    if not isinstance(context, Mapping):
        return False
    state = context.get(STATE_KEY)
    return isinstance(state, Mapping) and isinstance(state.get("identity"), str)


def mark_resumed(wrapper: Any) -> None:
    """Remember that `wrapper` (a restored state's run context) belongs to a paused run: every
    call of the run it continues verifies the signed identity, whatever the snapshot says."""
    if wrapper is not None:
        _RESUMED.add(wrapper)


def resumed(wrapper: Any) -> bool:
    """Whether this run continues a paused one: the SDK carries approval decisions for it, or the
    application inspected or decided its state (`mark_resumed`). A tool's context shares the SDK's
    decision table with the run's context, which is how it is matched to a marked state."""
    approvals = getattr(wrapper, "_approvals", None)
    if approvals:
        return True
    if not _RESUMED:
        return False
    for marked in list(_RESUMED):
        if marked is wrapper or (approvals is not None and getattr(marked, "_approvals", None) is approvals):
            return True
    return False


def adapter_state(context: Any) -> MutableMapping[str, Any]:
    """effectgate's own entry in the run context, created on first use."""
    if type(context) is dict:  # the common case, every part in place: no ABC checks
        state = context.get(STATE_KEY)
        if type(state) is dict and type(state.get("approvals")) is dict and type(state.get("grants")) is dict:
            return state
    ctx = _mapping(context)
    if not isinstance(ctx, MutableMapping):
        raise MissingIdentity("the run context must be a mutable dict (effectgate records approvals in it)")
    state = ctx.get(STATE_KEY)
    if not isinstance(state, MutableMapping):
        state = ctx[STATE_KEY] = {}
    for key in ("approvals", "grants"):
        if not isinstance(state.get(key), MutableMapping):
            state[key] = {}
    return state
