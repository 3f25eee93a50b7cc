"""Round 6: the core proposal path (intent keys, replays, amendments, edits).

Effects are counted at the shop's receiver; records are read back from the store. Every test
runs on SQLite and PostgreSQL (`shop_gate` is on the parametrized `store`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid

import pytest
import sqlalchemy as sa

from effectgate import Approver, CallContext, Effect, EffectTable, Executed, Grant, Keyring, Pending, ToolSpec
from effectgate.errors import TamperedRecord
from effectgate.flow import drive
from tests.core.conftest import MakeGate, ShopGate

LEAD = Approver("lee", "support_lead")
FINANCE = Approver("fiona", "finance")
EMAIL = {"to": ["a@x.example"], "subject": "hello", "body": "first"}


def ctx(message: str, user: str = "u1", session: str = "s1") -> CallContext:
    return CallContext(session_id=session, origin_message_id=message, user_id=user, agent_id="support")


def _args(shop_gate: ShopGate, approval_id: str) -> tuple[int, dict[str, object]]:
    row = shop_gate.gate.store.get_approval(approval_id)
    assert row is not None
    return row.version, json.loads(row.args_json)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known (tests/integrations/langgraph/test_review_round3.py strict xfail): a second edit with "
        "the call's own context is answered as a superseded replay (the intent key keeps version 1); "
        "letting it amend is one condition in _proposals (`not edited_by`), but the LangGraph step "
        "then offers and takes second edits, which its tests pin as refused: a cross-area decision"
    ),
)
def test_a_reviewers_second_edit_is_applied_not_dropped(shop_gate: ShopGate) -> None:
    """Two edits of one waiting call (the call's own context both times): each is a new version.
    The second is answered as a replay of a message a later one had amended (the intent key keeps
    the version it was first recorded at): the reviewer's edit is dropped (xfail, see reason)."""
    gate = shop_gate.gate
    first = gate.call("send_email", EMAIL, ctx("m1"))
    assert isinstance(first, Pending)
    once = drive(gate.flows.edit("send_email", {**EMAIL, "body": "second"}, ctx("m1"), editor="sam"))
    assert isinstance(once, Pending)
    assert once.version == 2
    twice = drive(gate.flows.edit("send_email", {**EMAIL, "body": "third"}, ctx("m1"), editor="sam"))
    assert isinstance(twice, Pending)
    assert _args(shop_gate, first.approval_id) == (3, {**EMAIL, "body": "third"})
    assert twice.version == 3
    assert not twice.replay
    grant = gate.approve(first.approval_id, version=3, approver=LEAD)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("email") == 1


def test_a_later_messages_amendment_still_wins_over_a_replay_of_the_first(shop_gate: ShopGate) -> None:
    """The guard the fix keeps: m2 amended m1's approval; replaying m1 (other arguments) answers
    with m2's version, it does not roll the amendment back."""
    gate = shop_gate.gate
    first = gate.call("send_email", EMAIL, ctx("m1"))
    assert isinstance(first, Pending)
    drive(gate.flows.edit("send_email", {**EMAIL, "body": "m1 edit"}, ctx("m1"), editor="sam"))
    second = gate.call("send_email", {**EMAIL, "body": "m2"}, ctx("m2"))
    assert isinstance(second, Pending)
    assert second.version == 3
    again = gate.call("send_email", {**EMAIL, "body": "m1 again"}, ctx("m1"))
    assert isinstance(again, Pending)
    assert again.replay
    assert _args(shop_gate, first.approval_id) == (3, {**EMAIL, "body": "m2"})


# -- an intent key read back from the database is checked against the call before it decides


def _redirect_key(shop_gate: ShopGate, from_id: str, to_id: str) -> None:
    with shop_gate.gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text("UPDATE eg_intent_keys SET approval_id = :to WHERE approval_id = :f"),
            {"to": to_id, "f": from_id},
        )
        assert done.rowcount >= 1


REFUND_A = {"order_id": "1042", "amount": 1000, "currency": "GBP"}
REFUND_B = {"order_id": "2001", "amount": 500, "currency": "GBP"}


def test_a_replay_never_amends_an_approval_an_edited_intent_key_points_to(shop_gate: ShopGate) -> None:
    """u1's message m1 waits on a refund of 1042; u2's session waits on a refund of 2001. With
    m1's intent key edited in the database to name u2's approval, a replay of m1 with other
    arguments (a retry that came out differently) must not amend u2's approval (a version of
    another session, subject and user, its business check run on the wrong subject's history)."""
    gate = shop_gate.gate
    a = gate.call("refund_order", REFUND_A, ctx("m1", "u1", "s-a"))
    b = gate.call("refund_order", REFUND_B, ctx("mb", "u2", "s-b"))
    assert isinstance(a, Pending)
    assert isinstance(b, Pending)
    _redirect_key(shop_gate, a.approval_id, b.approval_id)
    with pytest.raises(TamperedRecord):
        gate.call("refund_order", {**REFUND_A, "amount": 900}, ctx("m1", "u1", "s-a"))
    assert _args(shop_gate, b.approval_id) == (1, REFUND_B)
    grant = gate.approve(b.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("refund", order_id="2001", amount=500) == 1


def test_a_replay_never_answers_with_another_sessions_result(shop_gate: ShopGate) -> None:
    """u2's refund ran; m1's intent key edited to name it: a replay of m1 must not be answered
    with u2's result (another customer's refund, shown to u1's model) nor count as run."""
    gate = shop_gate.gate
    a = gate.call("refund_order", REFUND_A, ctx("m1", "u1", "s-a"))
    b = gate.call("refund_order", REFUND_B, ctx("mb", "u2", "s-b"))
    assert isinstance(a, Pending)
    assert isinstance(b, Pending)
    gate.execute(gate.approve(b.approval_id, version=1, approver=FINANCE).token)
    _redirect_key(shop_gate, a.approval_id, b.approval_id)
    outcome: object = None
    with pytest.raises(TamperedRecord):
        outcome = gate.call("refund_order", REFUND_A, ctx("m1", "u1", "s-a"))
    assert not isinstance(outcome, Executed)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_a_replay_across_a_table_change_that_names_a_subject_still_finds_its_approval(
    make_gate: MakeGate,
) -> None:
    """Not tampering: a tool that named no subject now names one (its only argument), so the
    intent key of a waiting call is the same and its approval's subject key the old one. The
    replay finds it (as before the check above) and is not called tampered."""
    ran: list[str] = []

    def cancel(subscription_id: str) -> str:
        ran.append(subscription_id)
        return "cancelled"

    def table(subject: tuple[str, ...]) -> EffectTable:
        spec = ToolSpec(
            name="cancel", effect=Effect.MONEY, fn=cancel, approver_role="billing", subject=subject
        )
        made = EffectTable([spec])
        made.allow_all("support")
        return made

    keyring = Keyring.generate()
    old = make_gate(table(()), keyring=keyring)
    first = old.call("cancel", {"subscription_id": "sub_1"}, ctx("m1"))
    assert isinstance(first, Pending)
    new = make_gate(table(("subscription_id",)), keyring=keyring)
    again = new.call("cancel", {"subscription_id": "sub_1"}, ctx("m1"))
    assert isinstance(again, Pending)
    assert again.approval_id == first.approval_id  # (its approval then needs a fresh proposal)
    assert ran == []


# -- CallContext: every field a record stores is checked where the context is built


@pytest.mark.parametrize(("field", "value"), [("run_id", None), ("tool_call_id", uuid.UUID(int=7))])
def test_a_context_field_that_is_not_text_is_refused_before_anything_runs(
    shop_gate: ShopGate, field: str, value: object
) -> None:
    """`run_id` and `tool_call_id` are text. A context with run_id None was accepted, and a write
    ran its effect before its execution record failed (NOT NULL: no record of an effect that
    happened); one with a UUID call id let a read run and then raised TypeError encoding its
    record. The context is refused where it is built, before any tool runs."""
    gate = shop_gate.gate

    def calls() -> None:
        bad = CallContext(
            session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support", **{field: value}
        )
        gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["x"]}, bad)
        gate.call("get_order", {"order_id": "1042"}, bad)

    with pytest.raises(ValueError, match=f"CallContext.{field}"):
        calls()
    assert shop_gate.shop.receiver.count("ticket_tags") == 0
    assert gate.store.executions() == []


def _random_id(size: int) -> str:
    """`size` characters of hex that PostgreSQL's compression does not shrink."""
    return "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(size // 64 + 1))[:size]


def test_a_session_id_postgresql_cannot_index_is_refused_before_an_approval_is_stored(
    shop_gate: ShopGate,
) -> None:
    """PostgreSQL indexes an approval's session id (eg_approvals_session), and a btree entry holds
    at most 2704 bytes: a longer session id (a token used as one) made every gated call of the
    session fail inside the store with a raw ProgramLimitExceeded, while SQLite took it. Ids up
    to 2048 bytes (UTF-8) are taken on both backends; a gated call with a longer one is refused, by
    name, before anything is stored (a read stores no approval: it runs)."""
    gate = shop_gate.gate

    def ctx_of(session_id: str) -> CallContext:
        return CallContext(session_id=session_id, origin_message_id="m1", user_id="u1", agent_id="support")

    assert isinstance(gate.call("send_email", EMAIL, ctx_of(_random_id(2048))), Pending)
    with pytest.raises(ValueError, match=r"CallContext\.session_id"):
        gate.call("send_email", {**EMAIL, "to": ["b@x.example"]}, ctx_of(_random_id(6000)))
    with pytest.raises(ValueError, match=r"CallContext\.session_id"):
        gate.call("send_email", {**EMAIL, "to": ["c@x.example"]}, ctx_of("é" * 1025))  # 2050 bytes
    assert isinstance(gate.call("get_order", {"order_id": "1042"}, ctx_of(_random_id(6000))), Executed)
    assert len(gate.pending()) == 1


# -- a scope check written as a coroutine function decides nothing: it denies


@pytest.mark.parametrize("via", ["call", "acall"])
def test_an_async_scope_check_is_never_taken_for_allowed(make_gate: MakeGate, via: str) -> None:
    """`scope=` given an async function (an application whose checks query its database
    asynchronously): calling it returns a coroutine, which is truthy, so every caller was in
    scope. u2 read u1's order and proposed a refund of it. A check that returns an awaitable
    cannot decide (the gate never awaits it): the call is out of scope, as for one that raises."""
    orders = {"1042": "u1"}
    reads: list[str] = []
    refunds: list[str] = []

    async def owns(args: object, ctx: CallContext) -> bool:
        return orders.get(args["order_id"]) == ctx.user_id  # type: ignore[index]

    def get_order(order_id: str) -> str:
        reads.append(order_id)
        return "shipped"

    def refund(order_id: str, amount: int) -> str:
        refunds.append(order_id)
        return "refunded"

    table = EffectTable(
        [
            ToolSpec(name="get_order", effect=Effect.READ, fn=get_order, subject="order_id", scope=owns),
            ToolSpec(
                name="refund",
                effect=Effect.MONEY,
                fn=refund,
                approver_role="finance",
                subject="order_id",
                scope=owns,
            ),
        ]
    )
    table.allow_all("support")
    gate = make_gate(table)
    u2 = ctx("m1", "u2")

    def call(name: str, args: dict[str, object]) -> object:
        return gate.call(name, args, u2) if via == "call" else asyncio.run(gate.acall(name, args, u2))

    read = call("get_order", {"order_id": "1042"})
    proposed = call("refund", {"order_id": "1042", "amount": 100})
    assert reads == []
    assert getattr(read, "code", None) == "out_of_scope"
    assert getattr(proposed, "code", None) == "out_of_scope"
    assert gate.pending() == []
    assert refunds == []
