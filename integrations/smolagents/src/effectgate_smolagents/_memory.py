"""Save a gated agent's memory and restore it in another process, signed for the identity it
belongs to, so a blob that was changed, or is presented for anyone else, is refused.

smolagents has no memory serializer; its steps pickle and unpickle correctly. Pickle runs code
on load, so the blob carries an HMAC from the keyring (with its key id), and nothing is
unpickled until the MAC checks out. Keep the blob server-side all the same.

The memory is one user's conversation (their task, the tool results the model was shown), so
the MAC covers, with the pickled steps, who it was saved for: the session, the user, the gated
agent's `agent_id` and, for a paused run, the `AwaitingApproval` it paused at (its run identity
and paused calls). `restore_memory` recomputes that binding from what the caller says it is
restoring for (never from the blob) and verifies the MAC over it: a blob of another user,
session, agent or pause is refused like an edited one (`TokenError`, the memory unchanged).
A pause blob restored again for its own pause is a replay of that resume: the gate serves each
decided call's stored outcome, so nothing runs twice. Blobs of format 1, signed with no
identity, are refused.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import pickle
from typing import Any

from smolagents.agents import MultiStepAgent
from smolagents.utils import AgentError

from effectgate import CallContext, EffectGate, Keyring
from effectgate.adapter import DecisionMismatch, missing_identity, verify_state
from effectgate.canonical import canonical_json
from effectgate.errors import TokenError

from ._managed import _members, owner_of
from ._outcomes import AWAITING, AwaitingApproval
from ._plain import agent_error

_MAGIC = b"effectgate-smolagents-memory/2\n"
_PURPOSE = "smolagents-memory/2"  # not format 1's purpose: its MACs verify nothing here
_UNBOUND = b"effectgate-smolagents-memory/1\n"
_HOW = "save_memory(gated.agent, keyring, session_id=..., user_id=..., awaiting=out)"


def save_memory(
    agent: MultiStepAgent,
    keyring: Keyring,
    *,
    session_id: str,
    user_id: str,
    awaiting: AwaitingApproval | None = None,
) -> bytes:
    """The memory steps of a gated agent as a blob signed for this session, user and agent and,
    when the run paused, for `awaiting` (the `AwaitingApproval` it returned)."""
    binding = _binding(agent, session_id=session_id, user_id=user_id, awaiting=awaiting)
    data = pickle.dumps([_savable(step) for step in agent.memory.steps], protocol=pickle.HIGHEST_PROTOCOL)
    header = canonical_json(binding)
    return _MAGIC + keyring.sign(_PURPOSE, header + b"\n" + data).encode() + b"\n" + header + b"\n" + data


def restore_memory(
    agent: MultiStepAgent,
    blob: bytes,
    keyring: Keyring,
    *,
    session_id: str,
    user_id: str,
    awaiting: AwaitingApproval | None = None,
) -> None:
    """Replace the gated agent's memory steps with the blob's, for this session and user (the
    application's, not the blob's) and, for a paused run, the `AwaitingApproval` being resumed.

    `TokenError` (and the memory unchanged) when the blob was changed, signed with another
    keyring, or saved for another session, user, agent or pause (or for a pause and restored
    without its record, or the other way round); nothing is unpickled before that check."""
    binding = _binding(agent, session_id=session_id, user_id=user_id, awaiting=awaiting)
    if not isinstance(blob, bytes):
        raise TypeError(f"a memory blob is the bytes save_memory returned, not {type(blob).__name__}")
    if blob.startswith(_UNBOUND):
        raise TokenError(
            "malformed",
            "this memory blob has the old format, signed for no session, user or pause: refused. "
            "Resume without it (the continuation tells the model how each call ended), or save it "
            f"again with {_HOW}",
        )
    if not blob.startswith(_MAGIC):
        raise TokenError("malformed", "not an effectgate smolagents memory blob")
    signature, sep, rest = blob[len(_MAGIC) :].partition(b"\n")
    header, sep2, data = rest.partition(b"\n")
    if not sep or not sep2:
        raise TokenError("malformed", "the memory blob has no signature or identity line")
    expected = canonical_json(binding)
    try:
        keyring.verify_signature(_PURPOSE, expected + b"\n" + data, signature.decode("ascii", "replace"))
    except TokenError as exc:
        others = _differs(header, binding)
        if others:
            raise TokenError(
                "forged",
                f"this memory blob was saved for another {_listed(others)}: refused, the "
                "memory is unchanged. Restore a blob only for the session, user, agent and pause "
                "it was saved for",
            ) from exc
        raise
    steps = _Steps(io.BytesIO(data)).load()  # verified above: save_memory wrote it, for this binding
    if not isinstance(steps, list):
        raise TokenError("malformed", "the memory blob does not hold a list of steps")
    owner = owner_of(agent)
    assert owner is not None  # `_binding` refused an agent no GatedAgent wraps
    held = owner._memory_of
    if held is not None and (held[0], held[1]) != (session_id, user_id):
        _clear_kept(agent)  # the last run's code variables are another user's
    agent.memory.steps = steps
    owner._memory_of = (session_id, user_id, steps)  # judged as a run's memory is (`check_resumable`)


def _savable(step: Any) -> Any:
    """`step`, or a copy whose `action_output` is text when that value does not pickle and load
    back. smolagents keeps there what a CodeAgent's code block ended on (a function the model
    defined, a generator, a queue; an `AgentImage` pickles but does not load); the model is never
    shown it, so the conversation the blob carries is the same."""
    value = getattr(step, "action_output", None)
    if value is None or isinstance(value, str | int | float | bool):
        return step
    try:
        _Steps(io.BytesIO(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))).load()
    except Exception:
        step = copy.copy(step)
        step.action_output = f"{type(value).__name__}, not saved (it cannot be pickled): {value!r}"
    return step


class _Steps(pickle.Unpickler):
    """The steps' unpickler. smolagents' `AgentError` (a step's `error`: a bad tool call, a code
    block that failed) takes a logger its pickle does not carry, so `pickle.loads` of such a
    step raised TypeError and the blob could never be restored: it is rebuilt from its message."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if isinstance(found, type) and issubclass(found, AgentError):
            return functools.partial(agent_error, found)
        return found


def check_resumable(
    gate: EffectGate, agent: MultiStepAgent, held: tuple[str, str, list[Any]] | None, out: AwaitingApproval
) -> None:
    """`DecisionMismatch` (nothing decided, nothing run) when the agent's memory holds what its
    GatedAgent last ran or restored for another session or user than the paused run `out`:
    continuing in it would show that conversation to the model acting for this user. `held` is
    (session, user, steps) of that run or `restore_memory`; memory replaced since otherwise (a
    reset) is not judged."""
    if held is None or held[2] is not agent.memory.steps or not held[2]:
        return
    if (held[0], held[1]) != (out.session_id, out.user_id):
        verify_state(gate, AWAITING, out.signed_fields(), out.signature)  # a changed record: TamperedState
        raise DecisionMismatch(
            out.paused[0].approval_id if out.paused else "",
            "this agent's memory holds another session's or user's conversation, not the paused "
            "run's: nothing was decided. Restore the paused run's memory first (restore_memory(agent, "
            "blob, keyring, ..., awaiting=out)), or resume with an agent of its own",
        )


def forget_others(
    agent: MultiStepAgent, held: tuple[str, str, list[Any]] | None, ctx: CallContext, *, reset: bool
) -> None:
    """Clear what a CodeAgent's executor (and the agent's `state`) kept from the last run when it
    was for another session or user than this one (`held`: that run's session, user, steps).
    smolagents keeps the executor's variables and functions across runs, even reset ones: the
    next user's code could read the last one's (their order, a tool result) with no tool call.
    A run that continues (`reset` False) in memory holding that other conversation is refused
    (ValueError, nothing changed): the model acting for this user would read it."""
    if held is not None and (held[0], held[1]) != (ctx.session_id, ctx.user_id):
        if not reset and held[2] and held[2] is agent.memory.steps:
            raise ValueError(
                "this agent's memory holds another session's or user's conversation: nothing ran. "
                "Run with reset=True, restore this conversation's memory first (restore_memory), or "
                "use an agent of its own"
            )
        _clear_kept(agent)
    _forget_team(agent, ctx)


def _forget_team(agent: MultiStepAgent, ctx: CallContext) -> None:
    """A CodeAgent manager's code is handed its managed agents (at every depth) and can read what
    each kept of its last run (memory, task, state, code variables): when that run was for another
    session or user than `ctx`, it is cleared before this run starts."""
    todo, seen = [agent], {id(agent)}
    while todo:
        for _, member in _members(todo.pop()):
            owner = owner_of(member)
            if id(member) in seen or owner is None:
                continue
            seen.add(id(member))
            todo.append(member)
            held = owner._memory_of
            if held is not None and (held[0], held[1]) != (ctx.session_id, ctx.user_id):
                member.memory.reset()
                member.task = None
                _clear_kept(member)
                owner._memory_of = None


def _clear_kept(agent: MultiStepAgent) -> None:
    """Clear the agent's `state` and its CodeAgent executor's variables and functions."""
    agent.state.clear()
    executor = getattr(agent, "python_executor", None)
    for name, fresh in (("state", {"__name__": "__main__"}), ("custom_tools", {})):
        kept = getattr(executor, name, None)
        if isinstance(kept, dict):
            kept.clear()
            kept.update(fresh)


def _binding(
    agent: MultiStepAgent, *, session_id: str, user_id: str, awaiting: AwaitingApproval | None
) -> dict[str, Any]:
    """Who the memory belongs to: what the MAC covers besides the steps."""
    owner = owner_of(agent)
    if owner is None:
        raise TypeError(f"save_memory and restore_memory take the agent a GatedAgent wraps: {_HOW}")
    given = {"session_id": session_id, "user_id": user_id}
    missing = [name for name, value in given.items() if not isinstance(value, str) or not value.strip()]
    if missing:
        raise missing_identity(" and ".join(missing), f"the memory is bound to them: {_HOW}")
    pause = None
    if awaiting is not None and not isinstance(awaiting, AwaitingApproval):
        raise TypeError(
            f"awaiting takes the AwaitingApproval a paused run returned, not {type(awaiting).__name__} "
            "(a run that finished did not pause: leave awaiting out)"
        )
    if awaiting is not None:
        if (awaiting.session_id, awaiting.user_id) != (session_id, user_id):
            raise TokenError(
                "forged",
                "the AwaitingApproval record is for another session or user than the one given: "
                "refused, the memory is unchanged",
            )
        if awaiting.agent_id and awaiting.agent_id != owner.agent_id:
            raise TokenError(
                "forged",
                f"the AwaitingApproval record is for another agent than {owner.agent_id!r}: refused, "
                "the memory is unchanged",
            )
        pause = awaiting.signed_fields()
    return {"session_id": session_id, "user_id": user_id, "agent_id": owner.agent_id, "pause": pause}


def _differs(header: bytes, binding: dict[str, Any]) -> list[str]:
    """What the blob's (unverified) identity line names differently: for the message only, by
    field name (never the other identity's values)."""
    try:
        claimed = json.loads(header)
    except ValueError:
        return []
    if not isinstance(claimed, dict):
        return []
    names = {"session_id": "session", "user_id": "user", "agent_id": "agent", "pause": "pause"}
    out = [label for key, label in names.items() if claimed.get(key) != binding[key]]
    if binding["pause"] is None and claimed.get("pause") is not None:
        out = [*(o for o in out if o != "pause"), "pause (restore it with its AwaitingApproval)"]
    elif binding["pause"] is not None and claimed.get("pause") is None:
        out = [*(o for o in out if o != "pause"), "run that did not pause"]
    return out


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
