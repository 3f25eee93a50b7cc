"""A HITL approve's grant across its step's next pause: given back, and granted again.

A HITL approve goes through `gate.approve` as the application's `native_approver`; its token
exists only in the run that minted it (the answer carries none, the store keeps its hash, no
checkpoint holds it). With a `wrap_tool_call` the grant is spent where the wrapper calls
`execute` (`_grants`). When the step pauses again before ToolNode dispatches (a sibling still
waits), its run ends before that: the grant is given back (`gate.release`: nothing ran, the
token is void) and who approved it is noted in the gate's log (`NOTE`, sealed with the gate's
keyring over the session, approval, version, count of grants, args hash and approver). The
step's next run finds the approval approved with its grant lapsed and, read back, the note (its
seal verified, naming the approval as it stands): the call is not asked for again, and once
nothing else of the step waits it is granted again through `gate.approve` as that approver (its
role checked against the table, scope and confirm run again; a new round, so a call that needs
two approvers is asked again), for the call's own path to spend or its wrapper to answer. A note
that does not verify, or names another version or grant, is ignored: the call is asked again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from effectgate import Approver, CallContext, EffectGate, Grant, Outcome, Pending, flow
from effectgate._logging import logger as guarded_logger
from effectgate.adapter import Paused, TamperedState, sign_state, verify_state
from effectgate.errors import EffectGateError, TokenError
from effectgate.tokens import Keyring

from ._decisions import DecisionRefused
from ._grants import Granted, Settled, usable
from ._hitl import NO_APPROVER

logger = guarded_logger(__name__)

#: The event kind of a released HITL grant (detail: `approval_id`, `version`, `grants`,
#: `args_hash`, `approver_id`, `approver_role`, `seal`).
NOTE = "langgraph_grant_released"
_PURPOSE = "langgraph.released-grant"
_O = TypeVar("_O")
_FIELDS = ("approval_id", "version", "grants", "args_hash", "approver_id", "approver_role")


#: Why a grant answered from the resume map was given back at its step's next pause.
UNKEPT = (
    "this grant came as Command(resume={approval_id: decision}), which LangGraph keeps in no "
    "checkpoint, and the step paused again (a sibling waits) before a wrap_tool_call could run "
    "the call: it was given back unspent, nothing ran. Approve it again and answer with "
    "effectgate_langgraph.resume(decisions, out.interrupts), whose answer the checkpoint keeps"
)


@dataclass(frozen=True)
class Regrant:
    """A call a HITL answer approved, its grant given back at a pause: granted again as
    `approver` once nothing else of its step waits (the approval as the reviewer was `shown`)."""

    approver: Approver
    shown: Paused


def native_grant(
    gate: EffectGate, approver: Approver | None, shown: Paused
) -> Generator[Any, Any, str | None]:
    """A HITL approve through `gate.approve` as `approver`, for the version and args hash the
    reviewer was `shown` (refused when the approval moved on since): the grant's token, or None
    while more distinct approvers are needed. `DecisionRefused` when refused."""
    if approver is None:
        raise DecisionRefused(NO_APPROVER)
    try:
        card = yield from flow.done(gate.card, shown.approval_id)
        if (card.version, card.args_hash) != (shown.version, shown.args_hash):
            raise DecisionRefused(
                f"approval {shown.approval_id} is at version {card.version} now, with other "
                f"arguments than version {shown.version} the reviewer was shown: no decision was "
                "applied; decide the new payload"
            )
        decided = yield from flow.done(
            gate.approve, shown.approval_id, version=shown.version, approver=approver
        )
    except EffectGateError as exc:
        raise DecisionRefused(f"approve as {approver.id} ({approver.role}) was refused: {exc}") from exc
    return decided.token if isinstance(decided, Grant) else None


def settled(outcome: Outcome | BaseException | Granted | Regrant) -> Outcome | BaseException | Granted:
    """`outcome` once its step settled, when a HITL grant given back was granted again."""
    if isinstance(outcome, Regrant):  # pragma: no cover - the step settles each before it ends
        raise RuntimeError("a HITL grant given back at a pause is granted again before its step settles")
    return outcome


def _sealed(session_id: str, detail: Mapping[str, Any]) -> dict[str, Any]:
    return {"session_id": session_id, **{k: detail.get(k) for k in _FIELDS}}


def give_back(gate: EffectGate, ctx: CallContext, outcome: _O) -> _O | Regrant | Outcome:
    """Before its step pauses again: `outcome`, or (a HITL grant) its `Regrant`, the grant
    released and who approved it noted; the call as the core answers it now when the grant
    could not be given back or noted, or is a token no checkpoint keeps (`UNKEPT`): it is
    asked for again."""
    if not isinstance(granted := outcome, Granted) or (granted.native is None and granted.kept):
        return outcome
    row = gate.store.get_approval(Keyring.read(granted.token).approval_id)
    try:
        gate.release(granted.token)
    except TokenError:  # lapsed or spent by now: the approval is read again
        return gate.call(granted.tool, dict(granted.args), ctx)
    if row is None or granted.native is None:  # the resume map's token: nothing to grant again as
        return gate.call(granted.tool, dict(granted.args), ctx)
    shown = Paused(row.id, row.version, row.args_hash)
    detail = {**shown.to_dict(), "grants": row.grants}
    detail |= {"approver_id": granted.native.id, "approver_role": granted.native.role}
    try:
        gate.note(
            NOTE,
            ctx=ctx,
            approval_ids=[row.id],
            seal=sign_state(gate, _PURPOSE, _sealed(ctx.session_id, detail)),
            **detail,
        )
    except Exception:  # the grant lapsed, no note: the call is asked for again
        logger.warning("the released grant of approval %s was not noted", row.id, exc_info=True)
        return gate.call(granted.tool, dict(granted.args), ctx)
    return Regrant(granted.native, shown)


def _unspent(gate: EffectGate, ctx: CallContext, steps: Mapping[str, Settled]) -> None:
    """Never raises: the dispatch's own exception (a pause) is what propagates."""
    try:
        for cid, s in steps.items():
            if isinstance(g := s.outcome, Granted) and g.native is not None and usable(gate, g.token):
                give_back(gate, dataclasses.replace(ctx, tool_call_id=cid), g)
    except Exception:  # the store unreachable: the grant lapses unused, the call is asked again
        logger.warning("a HITL grant of the step was not given back", exc_info=True)


@contextmanager
def given_back(gate: EffectGate, ctx: CallContext, steps: Mapping[str, Settled]) -> Iterator[None]:
    """GatedToolNode's dispatch of its settled `steps`. Should it raise (a caller's
    `wrap_tool_call` that asks its own `interrupt()` before it calls `execute`, or fails), each
    HITL grant of the step still unspent is given back and noted (`give_back`), as at a pause of
    the step: its next run grants it again as that approver (`noted`) without asking anyone, so
    the wrapper's answer reaches the wrapper (its token was in no checkpoint: kept, it was lost,
    and the step asked again for an approval that stood approved). A grant spent is left alone."""
    try:
        yield
    except Exception:
        _unspent(gate, ctx, steps)
        raise


@asynccontextmanager
async def agiven_back(
    gate: EffectGate, ctx: CallContext, steps: Mapping[str, Settled]
) -> AsyncIterator[None]:
    """`given_back`, the store work in a worker thread."""
    try:
        yield
    except Exception:
        await asyncio.to_thread(_unspent, gate, ctx, steps)
        raise


def noted(gate: EffectGate, ctx: CallContext, outcomes: Mapping[str, object]) -> dict[str, Regrant]:
    """The `Regrant` of each call (by call id) whose approval stands approved with the grant a
    verified note of this session released (same version, args hash and count of grants)."""
    approved = {cid: o for cid, o in outcomes.items() if isinstance(o, Pending) and o.status == "approved"}
    if not approved:
        return {}
    notes: dict[tuple[object, ...], Approver] = {}
    for event in gate.store.events(kind=NOTE, session_id=ctx.session_id):
        try:
            detail = json.loads(event.detail_json)
            verify_state(gate, _PURPOSE, _sealed(ctx.session_id, detail), detail.get("seal"))
            key = tuple(detail[k] for k in _FIELDS[:4])
            notes[key] = Approver(detail["approver_id"], detail["approver_role"])
        except (ValueError, TypeError, AttributeError, KeyError, TamperedState, RecursionError):
            continue  # not JSON, not an object, or not sealed by this keyring
    found: dict[str, Regrant] = {}
    for cid, pending in approved.items():
        row = gate.store.get_approval(pending.approval_id)
        if row is None or row.token_used_at is not None:
            continue
        key = (row.id, pending.version, row.grants, pending.card.args_hash)
        if key in notes and row.version == pending.version:
            found[cid] = Regrant(notes[key], Paused.of(pending))
    return found
