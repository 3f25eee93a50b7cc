"""A row that declares a subject, called without any of its subject arguments: the call names no
subject, so it is keyed by its arguments (as a row without a subject is), on SQLite and
PostgreSQL. It used to be keyed by the subject {"order_id": null}, one subject shared by every
such call of every session and every tool with that argument name: one user's waiting approval
refused everyone else's calls as subject_busy."""

from __future__ import annotations

from typing import Any

from effectgate import Approver, CallContext, Effect, EffectTable, Pending, Refused, ToolSpec

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")


def _ctx(session: str, message: str = "m1") -> CallContext:
    return CallContext(
        session_id=session, origin_message_id=message, user_id=f"user-{session}", agent_id="desk"
    )


def _table(paid: list[dict[str, Any]]) -> EffectTable:
    def refund(amount: int, order_id: str | None = None) -> dict[str, bool]:
        """Refund an amount (to an order, when one is named)."""
        paid.append({"amount": amount, "order_id": order_id})
        return {"ok": True}

    def credit(amount: int, order_id: str | None = None) -> dict[str, bool]:
        """Credit an amount (against an order, when one is named)."""
        paid.append({"credit": amount, "order_id": order_id})
        return {"ok": True}

    table = EffectTable(
        [
            ToolSpec(
                name="refund", effect=Effect.MONEY, fn=refund, approver_role="finance", subject=("order_id",)
            ),
            ToolSpec(
                name="credit", effect=Effect.MONEY, fn=credit, approver_role="finance", subject=("order_id",)
            ),
        ]
    )
    table.allow("desk", ["refund", "credit"])
    return table


def test_calls_without_their_subject_do_not_block_other_sessions(make_gate: MakeGate) -> None:
    paid: list[dict[str, Any]] = []
    gate = make_gate(_table(paid))
    a = gate.call("refund", {"amount": 5}, _ctx("s-a"))
    b = gate.call("refund", {"amount": 7}, _ctx("s-b"))
    c = gate.call("credit", {"amount": 9}, _ctx("s-c"))
    assert isinstance(a, Pending), a
    assert isinstance(b, Pending), b
    assert isinstance(c, Pending), c
    assert len({a.approval_id, b.approval_id, c.approval_id}) == 3
    for pending in (a, b, c):
        grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
        gate.execute(grant.token)
    assert sorted(p.get("amount", p.get("credit")) for p in paid) == [5, 7, 9]
    assert [r.status for r in gate.store.approvals()].count("executed") == 3


def test_the_same_arguments_from_another_session_are_still_busy(make_gate: MakeGate) -> None:
    """Without a subject the arguments are the key: the same call from two sessions at once is
    still one operation in flight (as for a row without a subject)."""
    paid: list[dict[str, Any]] = []
    gate = make_gate(_table(paid))
    first = gate.call("refund", {"amount": 5}, _ctx("s-a"))
    second = gate.call("refund", {"amount": 5}, _ctx("s-b"))
    assert isinstance(first, Pending)
    assert isinstance(second, Refused)
    assert second.code == "subject_busy"
    assert paid == []


def test_a_named_subject_still_serialises_sessions(make_gate: MakeGate) -> None:
    paid: list[dict[str, Any]] = []
    gate = make_gate(_table(paid))
    first = gate.call("refund", {"amount": 5, "order_id": "o-1"}, _ctx("s-a"))
    other = gate.call("credit", {"amount": 7, "order_id": "o-1"}, _ctx("s-b"))
    assert isinstance(first, Pending)
    assert isinstance(other, Refused)
    assert other.code == "subject_busy"
    assert [r.id for r in gate.store.approvals()] == [first.approval_id]
    assert paid == []
