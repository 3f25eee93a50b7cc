"""Outcomes as ToolMessages, never built from model output.

`Executed` is a success whose content is what ToolNode makes of the result (`content_of`: a
string or content blocks as they are, anything else as JSON with non-ASCII kept); when the tool
ran just now as a native langchain tool, its own ToolMessage is used as it is (status, content,
artifact). `Refused` and `Invalid` are errors (`status="error"`) whose text is the core's
`for_model()`: what happened and, for a denial, why. The artifact (never sent to the model)
carries the outcome's record fields for the application: kind, code, approval id, version,
idempotency key; a tool that returns its own artifact keeps it, and a native tool's read (which
has no record to point at) keeps its own ToolMessage as ToolNode gives it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import msg_content_output

from effectgate import Executed, Invalid, Outcome, Pending, Refused
from effectgate.errors import NeedsReconciliation

from ._fidelity import content_of

ARTIFACT_KEY = "effectgate"


def _artifact(outcome: Outcome | NeedsReconciliation) -> dict[str, Any]:
    if isinstance(outcome, Executed):
        info: dict[str, Any] = {
            "outcome": "executed",
            "replay": outcome.replay,
            "approval_id": outcome.approval_id,
            "version": outcome.version,
            "idempotency_key": outcome.idempotency_key,
        }
    elif isinstance(outcome, Refused):
        info = {"outcome": "refused", "code": outcome.code, "approval_id": outcome.approval_id}
    elif isinstance(outcome, Invalid):
        info = {"outcome": "invalid", "errors": [e.__dict__ for e in outcome.errors]}
    elif isinstance(outcome, Pending):
        info = {"outcome": "pending", "approval_id": outcome.approval_id, "version": outcome.version}
    else:
        info = {"outcome": "needs_reconciliation", "idempotency_key": outcome.key}
    return {ARTIFACT_KEY: info}


def _read(outcome: Executed) -> bool:
    """An executed read: no approval, no idempotency key (nothing the application could look up)."""
    return outcome.approval_id is None and outcome.idempotency_key is None and not outcome.replay


def _edited(content: str | list[Any], edited_args: Mapping[str, Any]) -> str | list[Any]:
    note = (
        f"A reviewer changed the arguments of this call to "
        f"{json.dumps(dict(edited_args), sort_keys=True, ensure_ascii=False)} and it ran with those. Result: "
    )
    if isinstance(content, str):
        return note + content
    return [{"type": "text", "text": note}, *content]


def tool_message(
    outcome: Outcome | NeedsReconciliation,
    call: ToolCall,
    *,
    edited_args: Mapping[str, Any] | None = None,
    ran: ToolMessage | None = None,
    artifact: Any = None,
) -> ToolMessage:
    """The ToolMessage the model receives for one call. `ran`: the tool's own ToolMessage, when
    it ran just now (a native langchain tool): used as it is for an `Executed` outcome.
    `artifact`: the tool's own artifact kept from its run (`_artifacts`), for a replay of it."""
    content: str | list[Any]
    if isinstance(outcome, NeedsReconciliation):
        content = (
            f"{call['name']}: the outcome is unknown ({outcome.reason}); a person will reconcile it. "
            "Do not call it again."
        )
        status = "error"
    elif isinstance(outcome, Executed):
        if ran is not None and not outcome.replay:
            own_content = msg_content_output(ran.content)  # as ToolNode normalizes a tool's message
            content = own_content if edited_args is None else _edited(own_content, edited_args)
            # A read has no record to point at: its message is the tool's own, as under ToolNode
            own = ran.artifact is not None or _read(outcome)
            artifact = ran.artifact if own else _artifact(outcome)
            return ran.model_copy(update={"content": content, "artifact": artifact})
        normalized = msg_content_output(content_of(outcome.result))  # as ToolNode normalizes it
        content = normalized if isinstance(normalized, str) else list(normalized)
        status = "success"
        if edited_args is not None:
            content = _edited(content, edited_args)
    else:
        content = outcome.for_model()
        status = "error"
    return ToolMessage(
        content=content,
        name=call["name"],
        tool_call_id=str(call.get("id") or ""),
        status=status,
        artifact=_artifact(outcome) if artifact is None or not isinstance(outcome, Executed) else artifact,
    )
