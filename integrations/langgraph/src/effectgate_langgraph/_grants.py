"""An approved gated call's grant, spent where its tool runs, not where its step is settled.

GatedToolNode settles a step (decisions, grants) before ToolNode dispatches its calls through the
caller's `wrap_tool_call`; a wrapper may answer a call itself and never call `execute`. So an
approve settles the call as `Granted` (its token checked, not presented), and the grant is
spent (`spent`) in the tool-call path `execute` reaches, and only there: a wrapper that
short-circuits the call leaves the approval approved and its grant unspent. A re-run of the step
(a sibling's pause, a replay) finds the call run (its stored result) or its grant again (a
token answer is applied again; a HITL approve's grant, given back at the pause, is granted
again: `_regrant`), so it runs once.

A token the core would refuse (`usable` is False) is presented while the step is settled, as
before: the core records the refusal and the step asks again.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.types import Command

from effectgate import Approver, CallContext, EffectGate, Outcome, Refused, flow
from effectgate._execution import lapsed
from effectgate.adapter import is_gated
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.tokens import Keyring, token_hash

from ._artifacts import keep
from ._fidelity import error_message
from ._messages import tool_message
from ._tools import may_call


@dataclass(frozen=True)
class Granted:
    """An approved call whose grant is spent when its tool-call path runs (`spent`)."""

    tool: str
    token: str
    args: Mapping[str, Any]
    native: Approver | None = None  # who a HITL approve was applied as: its token is in no checkpoint
    kept: bool = True  # False: its token came from the resume map, which no checkpoint keeps either


@dataclass
class Settled:
    """How one gated call ended: an outcome, or the exception its execution raised, or its grant
    still to spend (`Granted`); `artifact`: the tool's own, kept from its run (`_artifacts`), for
    a run answered from the store; `call`: the model's call as the step settled it;
    `approval_id`: the approval its registration found (None: none, a refusal)."""

    outcome: Outcome | BaseException | Granted
    edited_args: Mapping[str, Any] | None = None
    artifact: Any = None
    call: ToolCall | None = None
    approval_id: str | None = None


def settled_for(settled: Mapping[str, Settled], call: ToolCall) -> Settled | None:
    """How the step settled `call` (by its id), only when it is still the model's call as the step
    settled it (tool and arguments): a call a wrapper renamed or changed under the same id never
    answers from, or spends, the grant of the call it replaced (`unsettled` decides it), and an
    approved call never runs its approved arguments in place of the ones a wrapper asked for."""
    found = settled.get(str(call.get("id") or ""))
    if found is None or found.call is None:
        return None
    same = found.call["name"] == call["name"] and dict(found.call["args"]) == dict(call["args"])
    return found if same else None


def usable(gate: EffectGate, token: str) -> bool:
    """Whether the core would accept `token` now, as far as its approval row tells (no seal is
    trusted here: a False only sends the token to the core now, which refuses and records it)."""
    try:
        claims = Keyring.read(token)
        row = gate.store.get_approval(claims.approval_id)
        if row is None or row.version != claims.version or row.status != "approved":
            return False
        gate.keyring.verify(claims, args_hash=row.args_hash)
    except TokenError:
        return False
    stored = row.token_hash
    if not isinstance(stored, str) or not hmac.compare_digest(token_hash(token), stored):
        return False
    return row.token_used_at is None and not lapsed(claims, row, gate.clock.now())


def grant(
    gate: EffectGate, granted: Granted, ctx: CallContext
) -> flow.Flow[Outcome | BaseException | Granted]:
    """An approve's outcome: `granted`, or (a token the core refuses: it raises `TokenError`)
    what presenting it now gave."""
    if (yield from flow.done(usable, gate, granted.token)):
        return granted
    return (yield from spend(gate, granted, ctx))


def spend(gate: EffectGate, granted: Granted, ctx: CallContext) -> flow.Flow[Outcome | BaseException]:
    """Present the grant now (run inside the call's flight): the outcome, or the exception its
    run raised (`TokenError`, the core's refusal, propagates)."""
    try:
        outcome = yield from gate.flows.execute(granted.token, dict(granted.args))
    except TokenError:
        raise
    except Exception as exc:  # this call's result: NeedsReconciliation, a tool error
        return exc
    yield from flow.done(keep, gate, ctx, outcome)  # its artifact, for a re-run
    return outcome


def spent(gate: EffectGate, ctx: CallContext, settled: Settled) -> Generator[Any, Any, Settled]:
    """`settled` with its grant spent (run inside the call's flight, `ctx.tool_call_id` its id); a
    grant the core refuses by now (it lapsed) is told as a refusal, one spent already (a
    wrapper's retry, another run) as the core answers the call now (its stored result)."""
    if not isinstance(granted := settled.outcome, Granted):
        return settled
    return dataclasses.replace(settled, outcome=(yield from _spent(gate, granted, ctx)))


def _spent(gate: EffectGate, granted: Granted, ctx: CallContext) -> flow.Flow[Outcome | BaseException]:
    try:
        return (yield from spend(gate, granted, ctx))
    except TokenError as exc:
        if exc.reason == "used":  # spent already (a wrapper's retry, another run): as it stands
            return (yield from gate.flows.call(granted.tool, dict(granted.args), ctx))
        code: Any = {"expired": "expired", "revoked": "denied"}.get(exc.reason, "mismatch")
        why = f"the grant was refused when the call was to run: {exc}. Nothing ran"
        approval_id = Keyring.read(granted.token).approval_id
        return Refused(code=code, message=why, tool=granted.tool, approval_id=approval_id)


def answer_settled(
    settled: Settled, call: ToolCall, ran: ToolMessage | None, flag: Any
) -> ToolMessage | Command[Any]:
    """The ToolMessage for a gated call the step settled. Its tool's own failure after approval
    (a definite failure, nothing ran) is handled as ToolNode handles any tool's; an unknown
    outcome is reported for reconciliation."""
    outcome = settled.outcome
    if isinstance(outcome, Exception) and not isinstance(outcome, NeedsReconciliation):
        return error_message(outcome, call, flag)
    if isinstance(outcome, BaseException) and not isinstance(outcome, NeedsReconciliation):
        raise outcome
    if isinstance(outcome, Granted):
        raise RuntimeError("an approved call is answered after its grant is spent (`_grants.spent`)")
    return tool_message(outcome, call, edited_args=settled.edited_args, ran=ran, artifact=settled.artifact)


def unsettled(gate: EffectGate, ctx: CallContext, call: ToolCall) -> ToolMessage | None:
    """GatedToolNode's refusal of a gated call its step did not settle (a wrapper made it, or
    renamed another call into it; None for any other call): the node's calls share one task,
    where a pause of its own would take the answer slots of the step's. Nothing is registered
    (no approval that nothing would run). A tool the agent may not call goes to the gate."""
    if not (is_gated(gate, call["name"]) and may_call(gate, ctx, call["name"])):
        return None
    why = (
        f"this {call['name']} call is not one of the model's step (a wrap_tool_call made, renamed "
        "or changed it), and GatedToolNode settles only those; nothing was registered or ran"
    )
    return tool_message(Refused(code="not_allowed", message=why, tool=call["name"]), call)
