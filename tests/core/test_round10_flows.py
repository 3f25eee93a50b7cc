"""Round 10: the core approval flows (propose, replay, amend, decide) and their async forms.

Effects are counted at the shop's receiver and records read back from the store; every test runs
on SQLite and PostgreSQL (`shop_gate` is on the parametrized `store`).

- An approver that is not an `Approver` (a name, None, a dict from a request) raised a raw
  AttributeError from deep in the decision; now approve, deny and their async forms raise a
  TypeError naming what was given, before anything is read, and nothing changes.
- A replay of a message (its session and message id) by another user answered with the first
  user's decided approval without a scope check: after it ran, its stored result (a denial's or
  failure's reason too). A new message of that user, or the same message with other arguments,
  was already refused out of scope. Now such a replay is scoped as a new call is: refused and
  recorded as rejected, nothing of the other user's approval in the answer.
- A context that is not a `CallContext` (None, a dict) raised a raw AttributeError from call,
  acall and call_step; a step's call that is not a (name, args[, call_id]) tuple raised IndexError
  or KeyError, or (a text) was read as a call of a tool named by its first letter and recorded.
  Now each is a TypeError before anything is read or recorded.
- An edit (`gate.flows.edit`) whose editor is not a non-blank text was recorded with its repr as
  the editor (an Approver, a number) or, empty, as no edit at all: the reviewer's change read as
  the message's own version in `versions`. Now a TypeError, nothing changed.

Strict xfails need a decision: an `aapprove` cancelled after its grant committed loses the token
(only its hash is stored) and a retry is `AlreadyDecided` until the grant lapses; another user's
replay of a message still waiting gets its card (the LangGraph step relies on finding it).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from effectgate import Approver, Executed, Grant, Pending, Refused
from effectgate.errors import AlreadyDecided
from effectgate.examples.shop import context
from effectgate.flow import drive
from effectgate.outcomes import Decision
from effectgate.stores import SQLStore
from tests.core.conftest import ShopGate

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 1000, "currency": "GBP"}
EMAIL = {"to": ["a@x.example"], "subject": "hello", "body": "first"}


def _propose(shop_gate: ShopGate, message: str = "m1") -> Pending:
    out = shop_gate.gate.call("refund_order", REFUND, context(message))
    assert isinstance(out, Pending), out
    return out


# -- an approver of another type is a TypeError before anything is read


NOT_APPROVERS = [
    pytest.param("fiona", id="str"),
    pytest.param(None, id="None"),
    pytest.param({"id": "fiona", "role": "finance"}, id="dict"),
]


@pytest.mark.parametrize("approver", NOT_APPROVERS)
def test_approve_with_an_approver_that_is_not_one_is_a_type_error(
    shop_gate: ShopGate, store: SQLStore, approver: Any
) -> None:
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    with pytest.raises(TypeError, match="Approver"):
        gate.approve(pending.approval_id, version=1, approver=approver)
    with pytest.raises(TypeError, match="Approver"):
        asyncio.run(gate.aapprove(pending.approval_id, version=1, approver=approver))
    with pytest.raises(TypeError, match="Approver"):
        gate.deny(pending.approval_id, approver=approver, reason="no")
    with pytest.raises(TypeError, match="Approver"):
        asyncio.run(gate.adeny(pending.approval_id, approver=approver, reason="no"))
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("pending", 0)
    with store.reading() as conn:
        assert store.decisions(conn, pending.approval_id, 1) == []
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)  # still decidable
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1


# -- a replay of a message is scoped by its caller


@pytest.mark.xfail(
    strict=True,
    reason=(
        "cross-area decision: the LangGraph step relies on a resume under another user finding the "
        "paused approval (tests/integrations/langgraph/test_hitl_decisions.py::"
        "test_a_mismatched_call_accepts_only_a_reject: only a deny is accepted); scoping this replay "
        "would end that run out of scope and leave the approval pending"
    ),
)
def test_another_users_replay_of_a_waiting_message_does_not_get_its_card(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """u2 (Grace) sending u1's session and message id with the same arguments: out of scope, as
    her own new message is, not u1's pending card with its arguments."""
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    out = gate.call("refund_order", REFUND, context("m1", user_id="u2"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert out.approval_id != pending.approval_id
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.version, row.user_id) == ("pending", 1, "u1")
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_another_users_replay_of_an_executed_message_does_not_get_its_result(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """After u1's refund ran, u2 replaying u1's message is refused out of scope (no stored result
    of u1's refund), and u1's own replay still gets it; the refund ran once."""
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    out = gate.call("refund_order", REFUND, context("m1", user_id="u2"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert out.approval_id != pending.approval_id
    own = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(own, Executed)
    assert own.replay
    assert own.approval_id == pending.approval_id
    assert shop_gate.shop.receiver.count("refund") == 1
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "executed"


# -- an aapprove cancelled after its grant committed


def test_a_cancelled_aapprove_leaves_a_retry_that_gets_a_usable_grant(shop_gate: ShopGate) -> None:
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    minted, release = threading.Event(), threading.Event()
    approve = gate.approve

    def slow_approve(approval_id: str, *, version: int, approver: Approver) -> Decision:
        decision = approve(approval_id, version=version, approver=approver)  # committed
        minted.set()
        release.wait(10)
        return decision

    gate.approve = slow_approve  # type: ignore[method-assign]

    async def cancelled() -> None:
        task = asyncio.ensure_future(gate.aapprove(pending.approval_id, version=1, approver=FINANCE))
        await asyncio.to_thread(minted.wait, 10)
        task.cancel()
        release.set()  # the cancelled call waits for its thread, then voids the grant it minted
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    gate.approve = approve  # type: ignore[method-assign]
    try:
        retry = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    except AlreadyDecided:
        retry = None
    assert isinstance(retry, Grant)
    gate.execute(retry.token)
    assert shop_gate.shop.receiver.count("refund") == 1


# -- a context that is not a CallContext, or a step's call of another shape, is a TypeError


NOT_CONTEXTS = [
    pytest.param(None, id="None"),
    pytest.param({"session_id": "s-ada", "origin_message_id": "m1", "user_id": "u1"}, id="dict"),
]


@pytest.mark.parametrize("ctx", NOT_CONTEXTS)
def test_a_call_whose_context_is_not_a_call_context_is_a_type_error(
    shop_gate: ShopGate, store: SQLStore, ctx: Any
) -> None:
    gate = shop_gate.gate
    with pytest.raises(TypeError, match="CallContext"):
        gate.call("refund_order", REFUND, ctx)
    with pytest.raises(TypeError, match="CallContext"):
        asyncio.run(gate.acall("refund_order", REFUND, ctx))
    with pytest.raises(TypeError, match="CallContext"):
        gate.call_step([("refund_order", REFUND, "call_1")], ctx)
    with pytest.raises(TypeError, match="CallContext"):
        asyncio.run(gate.acall_step([("refund_order", REFUND)], ctx))
    with pytest.raises(TypeError, match="CallContext"):
        gate.call("get_order", {"order_id": "1042"}, ctx)  # a read too
    gate.flush()
    assert store.approvals() == []
    assert list(store.events()) == []


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("refund_order", id="str"),
        pytest.param(("refund_order",), id="1-tuple"),
        pytest.param({"name": "refund_order", "args": REFUND}, id="dict"),
        pytest.param(("refund_order", REFUND, "c", "extra"), id="4-tuple"),
    ],
)
def test_a_step_call_of_another_shape_is_a_type_error(shop_gate: ShopGate, store: SQLStore, bad: Any) -> None:
    gate = shop_gate.gate
    with pytest.raises(TypeError, match="name, args"):
        gate.call_step([("send_email", EMAIL), bad], context("m1"))
    assert store.approvals() == []
    assert list(store.events()) == []


def test_another_users_replay_of_a_denied_message_does_not_get_the_reviewers_reason(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    gate.deny(pending.approval_id, approver=FINANCE, reason="fraud suspected on this account")
    out = gate.call("refund_order", REFUND, context("m1", user_id="u2"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert "fraud" not in out.message
    own = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(own, Refused)
    assert (own.code, own.approval_id) == ("denied", pending.approval_id)


# -- an edit names its editor as text


@pytest.mark.parametrize(
    "editor",
    [
        pytest.param("", id="empty"),
        pytest.param("  ", id="blank"),
        pytest.param(Approver("sam", "finance"), id="Approver"),
        pytest.param(5, id="int"),
    ],
)
def test_an_edit_whose_editor_is_not_a_name_changes_nothing(
    shop_gate: ShopGate, store: SQLStore, editor: Any
) -> None:
    """An editor that is not a non-blank text was recorded as its repr (an Approver, a number), or
    (empty) as no editor at all: the reviewer's edit read as the message's own version."""
    pending = _propose(shop_gate)
    gate = shop_gate.gate
    with pytest.raises((TypeError, ValueError), match="editor"):
        drive(gate.flows.edit("refund_order", {**REFUND, "amount": 900}, context("m1"), editor=editor))
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.version == 1
    assert [v.edited_by for v in gate.versions(pending.approval_id)] == [None]
    assert store.events(kind="amended") == []
