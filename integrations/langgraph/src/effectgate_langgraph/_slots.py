"""One gated call of a step as `_step` settles it (`Slot`), and how a call in the checkpoint is
matched to its approval (`slot_of`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolCall

from effectgate import CallContext, EffectGate, Executed, Outcome, Pending, Refused

from ._decisions import edited
from ._grants import Granted
from ._identity import call_hash
from ._regrant import Regrant


@dataclass
class Slot:
    call: ToolCall
    outcome: Outcome | BaseException | Granted | Regrant
    args: Mapping[str, Any]
    edited_args: Mapping[str, Any] | None = None
    call_hash: str = ""
    mismatch: str | None = None


def slot_of(gate: EffectGate, call: ToolCall, outcome: Outcome | BaseException, ctx: CallContext) -> Slot:
    """A waiting call stands for its approval's frozen arguments. When those differ from the call
    in the checkpoint, the difference must be a reviewer's edit: the checkpoint's arguments are an
    earlier version of this approval proposed by this same user message, and every later version
    came from that message too (an edit). Anything else (the call changed in the checkpoint after
    the pause or after it ran, a later message amended the approval) is a mismatch: nothing runs.

    The identity is re-supplied by the application on every resume, so it is compared too: a
    waiting approval proposed for another user or session than the one this run is for (the
    thread resumed under another `user_id`) is a mismatch."""
    slot = Slot(
        call=call, outcome=outcome, args=call["args"], call_hash=call_hash(gate, call["name"], call["args"])
    )
    if isinstance(outcome, Executed) and outcome.approval_id:
        # ran earlier (a sibling waited, a replay, a fork): an edit is told, other arguments did not run
        history, ran = gate.versions(outcome.approval_id), outcome.version or 1
        if any(v.version == ran and v.args_hash != slot.call_hash for v in history):
            if edited(history, slot.call_hash, ran, ctx):
                slot.edited_args = dict(gate.card(outcome.approval_id).args)
            else:
                slot.outcome = _ran_other(gate, outcome)
        return slot
    if not isinstance(outcome, Pending):
        return slot
    card = outcome.card
    if (card.user_id, card.session_id) != (ctx.user_id, ctx.session_id):
        slot.args = dict(card.args)
        slot.mismatch = (
            f"approval {outcome.approval_id} was proposed for user {card.user_id!r} in session "
            f"{card.session_id!r}; this run resumes for user {ctx.user_id!r} in session "
            f"{ctx.session_id!r}. Nothing ran; deny it, or resume as the user it was proposed for"
        )
        return slot
    if card.args_hash == slot.call_hash:
        return slot
    if edited(gate.versions(outcome.approval_id), slot.call_hash, outcome.version, ctx):
        slot.args = slot.edited_args = dict(outcome.card.args)
        return slot
    slot.args = dict(outcome.card.args)
    slot.mismatch = (
        f"the paused {call['name']} call no longer matches approval {outcome.approval_id} "
        f"(version {outcome.version}): its arguments in the conversation are not the ones approved "
        "or edited by a reviewer. Nothing ran; deny it, and the model can propose again"
    )
    return slot


def _ran_other(gate: EffectGate, ran: Executed) -> Refused:
    """A call answered by an approval that ran other arguments (not a reviewer's edit of it)."""
    args = json.dumps(dict(gate.card(str(ran.approval_id)).args), sort_keys=True, ensure_ascii=False)
    why = f"approval {ran.approval_id} ran {ran.tool} once, with {args}; these arguments did not run"
    return Refused(code="mismatch", message=why, tool=ran.tool, approval_id=ran.approval_id)
