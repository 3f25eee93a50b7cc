"""Round 19 review of `_regrant` / `_step` (a HITL grant given back at a pause, noted sealed in
the gate's log, granted again on the step's next run as the noted approver).

- A note is bound to its session, approval, version, count of grants and args hash: copied to
  another session or approval it grants nothing; once the approval was granted again (a new
  count of grants), the old note grants nothing either; an approved call is never amended (other
  arguments are answered with the approval as it stands), so its note's version stays its own.
- A destructive call whose second approver was the HITL answer's: given back at a sibling's
  pause, its regrant as that approver is a new round (one of two): the step asks again, the same
  approver cannot be the second, and it runs once only after a second, distinct approver.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from effectgate import Approver, CallContext, Grant, PartialApproval, Pending
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import Script, call, say, step
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph._grants import Granted
from effectgate_langgraph._regrant import NOTE, Regrant, give_back, noted
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate

from ._graph import LangGraphHarness

BILL = Approver("bill", "billing")
PIA, PAT = Approver("pia", "privacy"), Approver("pat", "privacy")


def _ctx(session: str = "s-ada", message: str = "m9") -> CallContext:
    return CallContext(session_id=session, user_id="u1", origin_message_id=message, agent_id=SUPPORT_AGENT)


def _given_back(shop_gate: ShopGate, ctx: CallContext, args: dict[str, Any]) -> Pending:
    """A refund HITL-approved as fiona, its grant given back and noted (as `_step` does at a
    pause): the approval as the step's next run finds it."""
    gate = shop_gate.gate
    pending = gate.call("refund_order", args, ctx)
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    call_ctx = dataclasses.replace(ctx, tool_call_id="c1")
    back = give_back(gate, call_ctx, Granted("refund_order", grant.token, dict(args), FINANCE))
    assert isinstance(back, Regrant)
    again = gate.call("refund_order", args, ctx)
    assert isinstance(again, Pending)
    assert again.status == "approved"
    return again


def _copy_note(shop_gate: ShopGate, ctx: CallContext, **changes: Any) -> None:
    """Append the log's note again (its seal as it is), some detail changed, as `ctx`."""
    [event] = shop_gate.store.events(kind=NOTE)[:1]
    detail = json.loads(event.detail_json)
    detail = {k: v for k, v in detail.items() if k not in ("session_id", "tool_call_id")} | changes
    shop_gate.gate.note(NOTE, ctx=ctx, **detail)


def test_a_note_binds_its_session_and_approval(shop_gate: ShopGate) -> None:
    ours = _given_back(shop_gate, _ctx(), REFUND)
    assert set(noted(shop_gate.gate, _ctx(), {"c1": ours})) == {"c1"}  # the note is found
    # another session's approval of the same refund, approved and given back with no note
    other_ctx = _ctx("s-2")
    other = shop_gate.gate.call("refund_order", {**REFUND, "order_id": "1043", "amount": 100}, other_ctx)
    assert isinstance(other, Pending)
    grant = shop_gate.gate.approve(other.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop_gate.gate.release(grant.token)
    theirs = shop_gate.gate.call("refund_order", {**REFUND, "order_id": "1043", "amount": 100}, other_ctx)
    assert isinstance(theirs, Pending)
    assert theirs.status == "approved"
    _copy_note(shop_gate, other_ctx)  # the note copied into the other session
    _copy_note(shop_gate, other_ctx, approval_id=theirs.approval_id, args_hash=theirs.card.args_hash)
    _copy_note(shop_gate, _ctx(), approval_id=theirs.approval_id, args_hash=theirs.card.args_hash)
    assert noted(shop_gate.gate, other_ctx, {"c1": theirs}) == {}
    assert noted(shop_gate.gate, _ctx(), {"c1": theirs}) == {}


def test_a_note_grants_nothing_once_the_approval_was_granted_again(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    pending = _given_back(shop_gate, _ctx(), REFUND)
    again = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(again, Grant)
    gate.release(again.token)  # lapsed again, with no note of its own: the old note is spent
    now = gate.call("refund_order", REFUND, _ctx())
    assert isinstance(now, Pending)
    assert now.status == "approved"
    assert noted(gate, _ctx(), {"c1": now}) == {}
    assert shop_gate.shop.receiver.count("refund") == 0


def test_an_approved_call_is_not_amended_so_its_note_names_what_was_approved(shop_gate: ShopGate) -> None:
    """Other arguments for the approved call are answered with the approval as it stands (no new
    version: an edit needs a pending approval), so the note's version and args hash still name
    what fiona approved; a step whose call differs from it is a mismatch and never `noted`."""
    gate = shop_gate.gate
    _given_back(shop_gate, _ctx(), REFUND)
    other = gate.call("refund_order", {**REFUND, "amount": 6000}, _ctx())
    assert isinstance(other, Pending)
    assert (other.version, dict(other.card.args)) == (1, REFUND)
    assert shop_gate.shop.receiver.count("refund") == 0


def _passing(request: Any, execute: Callable[[Any], Any]) -> Any:
    return execute(request)


def test_a_destructive_regrant_is_a_new_round_of_two(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    gate = shop_gate.gate
    both = step(
        call("delete_customer_data", customer_id="u1"), call("cancel_subscription", subscription_id="sub_u1")
    )
    node = GatedToolNode(gate, agent_id=SUPPORT_AGENT, native_approver=PAT, wrap_tool_call=_passing)
    model = ScriptedChatModel(script=Script([both, say("Both done.")]))
    h = LangGraphHarness(gate, model, checkpointer, node=node)
    delete, cancel = h.send("Delete my data and cancel", message_id="m3").paused
    assert delete.tool == "delete_customer_data"
    assert isinstance(gate.approve(delete.approval_id, version=1, approver=PIA), PartialApproval)
    second = h.invoke(Command(resume={"decisions": [{"type": "approve"}] * 2}))  # pat: 2 of 2
    assert [p.tool for p in second.paused] == ["cancel_subscription"]  # billing's: pat may not
    assert h.last is not None
    token = gate.approve(cancel.approval_id, version=1, approver=BILL)
    assert isinstance(token, Grant)
    third = h.invoke(resume({cancel.approval_id: approve(token.token)}, h.last.interrupts))
    # granted again as pat: a new round, one of two; asked again, nothing ran
    assert [p.tool for p in third.paused] == ["delete_customer_data"]
    assert shop_gate.shop.receiver.count("delete") == 0
    assert shop_gate.shop.receiver.count("cancel") == 0
    # pat again is not a second approver: still paused, nothing ran
    fourth = h.invoke(Command(resume={"decisions": [{"type": "approve"}]}))
    assert [p.tool for p in fourth.paused] == ["delete_customer_data"]
    assert shop_gate.shop.receiver.count("delete") == 0
    grant = gate.approve(delete.approval_id, version=1, approver=PIA)
    assert isinstance(grant, Grant)
    assert h.last is not None
    done = h.invoke(resume({delete.approval_id: approve(grant.token)}, h.last.interrupts))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("delete") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    with shop_gate.store.reading() as conn:
        decided = [
            (d.grant_round, d.approver_id)
            for d in shop_gate.store.decisions(conn, delete.approval_id)
            if d.decision == "approve"
        ]
    assert sorted(decided) == [(0, "pat"), (0, "pia"), (1, "pat"), (1, "pia")]
    assert gate.audit().clean
