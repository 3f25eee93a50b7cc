"""A native tool's own artifact, kept for the re-runs of its step.

A tool with `response_format="content_and_artifact"` gives its ToolMessage an artifact the
model never sees (a receipt, raw rows). When an approved call runs while a sibling gated call
of its step still waits, the sibling's interrupt drops that run's output, and the step's next
run answers the call from the store, which keeps the content only. So when a gated call runs,
its artifact (when it has a JSON form) is recorded in the gate's log (`KEPT`), sealed with the
gate's keyring over the run it belongs to (session, approval id, version, idempotency key), and a
replay of that run gets it back only if the seal verifies: an artifact edited or added in the
database is never handed to the graph (the gate's record of the run is the artifact instead).
An artifact with no JSON form, or one erased by `redact`, is not given back either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pydantic_core

from effectgate import CallContext, EffectGate, Executed, Outcome
from effectgate._logging import logger as guarded_logger
from effectgate.adapter import TamperedState, sign_state, verify_state

from ._fidelity import _FLIGHT

logger = guarded_logger(__name__)

#: The event kind of a kept artifact (detail: `approval_id`, `version`, `idempotency_key`,
#: `artifact`, `seal`).
KEPT = "langgraph_tool_artifact"
_PURPOSE = "langgraph.artifact"


def _sealed(session_id: str, detail: Mapping[str, Any]) -> dict[str, Any]:
    """What a kept artifact's seal covers: the run it belongs to, and the artifact itself."""
    fields = ("approval_id", "version", "idempotency_key", "artifact")
    return {"session_id": session_id, **{k: detail.get(k) for k in fields}}


def keep(gate: EffectGate, ctx: CallContext, outcome: Outcome | BaseException) -> None:
    """Record the artifact of the gated call `ctx.tool_call_id` that ran just now as a native
    langchain tool (its ToolMessage is in the flight). A failure to record it is logged: the
    call ran and its outcome is stored; only the artifact is not given back on a replay."""
    flight = _FLIGHT.get()
    ran = flight.messages.get(ctx.tool_call_id or "") if flight is not None else None
    if ran is None or ran.artifact is None or not isinstance(outcome, Executed) or outcome.replay:
        return
    if outcome.approval_id is None:
        return
    try:
        artifact = json.loads(pydantic_core.to_json(ran.artifact))
        detail = {
            "approval_id": outcome.approval_id,
            "version": outcome.version,
            "idempotency_key": outcome.idempotency_key,
            "artifact": artifact,
        }
        seal = sign_state(gate, _PURPOSE, _sealed(ctx.session_id, detail))
        gate.note(KEPT, ctx=ctx, approval_ids=[outcome.approval_id], seal=seal, **detail)
    except Exception:  # no JSON form, or the store refused: the artifact is not kept
        logger.warning("the artifact of %s was not kept for a replay", outcome.tool, exc_info=True)


def restore(gate: EffectGate, ctx: CallContext, outcomes: Mapping[str, object]) -> dict[str, Any]:
    """The kept artifact of each call (by call id) answered from the store by a replay of a
    gated run, when its record's seal verifies."""
    replays = {
        cid: o
        for cid, o in outcomes.items()
        if isinstance(o, Executed) and o.replay and o.approval_id is not None
    }
    if not replays:
        return {}
    found: dict[tuple[object, object, object], Any] = {}
    for event in gate.store.events(kind=KEPT, session_id=ctx.session_id):
        try:
            detail = json.loads(event.detail_json)
            verify_state(gate, _PURPOSE, _sealed(ctx.session_id, detail), detail.get("seal"))
        except (ValueError, TypeError, AttributeError, TamperedState, RecursionError):
            continue  # not JSON, not an object, erased, or not sealed by this keyring
        found[(detail.get("approval_id"), detail.get("version"), detail.get("idempotency_key"))] = detail.get(
            "artifact"
        )
    kept: dict[str, Any] = {}
    for cid, o in replays.items():
        key = (o.approval_id, o.version, o.idempotency_key)
        if key in found:
            kept[cid] = found[key]
    return kept
