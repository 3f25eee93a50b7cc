"""Outcomes as ToolMessages: the text is the core's `for_model()`, never built from model output.

`Executed` is a success; `Refused` and `Invalid` are errors (`status="error"`) whose text says
what happened and, for a denial, why. The artifact (never sent to the model) carries the
outcome's record fields for the application: kind, code, approval id, version, idempotency key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage

from effectgate import Executed, Invalid, Outcome, Pending, Refused
from effectgate.errors import NeedsReconciliation

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


def tool_message(
    outcome: Outcome | NeedsReconciliation,
    call: ToolCall,
    *,
    edited_args: Mapping[str, Any] | None = None,
) -> ToolMessage:
    """The ToolMessage the model receives for one call."""
    if isinstance(outcome, NeedsReconciliation):
        content = (
            f"{call['name']}: the outcome is unknown ({outcome.reason}); a person will reconcile it. "
            "Do not call it again."
        )
        status = "error"
    else:
        content = outcome.for_model()
        status = "success" if isinstance(outcome, Executed) else "error"
        if isinstance(outcome, Executed) and edited_args is not None:
            content = (
                f"A reviewer changed the arguments of this call to "
                f"{json.dumps(dict(edited_args), sort_keys=True)} and it ran with those. Result: {content}"
            )
    return ToolMessage(
        content=content,
        name=call["name"],
        tool_call_id=str(call.get("id") or ""),
        status=status,
        artifact=_artifact(outcome),
    )


def render(
    outcome: Outcome | BaseException, call: ToolCall, edited_args: Mapping[str, Any] | None = None
) -> ToolMessage:
    """A settled gated call as its ToolMessage; a tool's own failure is raised again, so that
    ToolNode's `handle_tool_errors` treats it as it treats any tool's."""
    if isinstance(outcome, BaseException) and not isinstance(outcome, NeedsReconciliation):
        raise outcome
    return tool_message(outcome, call, edited_args=edited_args)
