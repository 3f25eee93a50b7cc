"""The scripted three-day ledger of the report tests (issue 18): its figures are counted by hand in
tests/core/test_report_figures.py, and the HTML report and the inbox's metrics page draw it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from effectgate import Approver, CallContext, EffectGate, Grant, Pending
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import Shop, context
from effectgate.flow import drive
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")
SUPPORT = Approver("sam", "support_lead")
DAY = 86400.0


def on(clock: FakeClock, offset_days: int = 0) -> str:
    return datetime.fromtimestamp(clock.now() + offset_days * DAY, tz=UTC).date().isoformat()


def ctx(message: str, session: str, model: str) -> CallContext:
    return dataclasses.replace(context(message, session_id=session), model_id=model)


def refund(order: str, amount: int = 100) -> dict[str, object]:
    return {"order_id": order, "amount": amount, "currency": "GBP"}


def propose(gate: EffectGate, name: str, args: dict[str, object], c: CallContext) -> Pending:
    out = gate.call(name, args, c)
    assert isinstance(out, Pending), out
    return out


def script(gate: EffectGate, shop: Shop, clock: FakeClock) -> list[str]:
    """Day 0 (model gpt-a, sessions s1 s2 s3): refunds P1 and P2; P1 approved after 120 s and run,
    the provider times out (needs_reconciliation); P2 denied 180 s after it was proposed; P1's
    message sent again (one replay); s3 only reads. Day 1 (model gpt-b, sessions s4 to s7): refunds
    P3 (approved after 600 s, run), P4 (edited by the reviewer at 30 s, version 2 approved at
    60 s), P5 (left pending), and an email (support_lead, approved after 30 s). Day 2: P5 expires,
    an event of session s6. Returns the three days."""
    days = [on(clock, d) for d in range(3)]
    for n in range(1, 6):
        shop.orders.setdefault(f"o{n}", {"user_id": "u1", "total": 10000, "currency": "GBP", "status": "x"})
    p1 = propose(gate, "refund_order", refund("o1"), ctx("m1", "s1", "gpt-a"))
    p2 = propose(gate, "refund_order", refund("o2"), ctx("m2", "s2", "gpt-a"))
    clock.advance(120)
    grant = gate.approve(p1.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    clock.advance(60)
    gate.deny(p2.approval_id, approver=FINANCE, reason="not eligible")
    again = gate.call("refund_order", refund("o1"), ctx("m1", "s1", "gpt-a"))
    assert again.approval_id == p1.approval_id  # type: ignore[union-attr]
    gate.call("get_order", {"order_id": "1042"}, ctx("r1", "s3", "gpt-a"))

    clock.advance(DAY)
    assert on(clock) == days[1]
    p3 = propose(gate, "refund_order", refund("o3"), ctx("m3", "s4", "gpt-b"))
    p4 = propose(gate, "refund_order", refund("o4"), ctx("m4", "s5", "gpt-b"))
    propose(gate, "refund_order", refund("o5"), ctx("m5", "s6", "gpt-b"))
    mail = propose(
        gate, "send_email", {"to": ["a@x"], "subject": "hi", "body": "b"}, ctx("e1", "s7", "gpt-b")
    )
    clock.advance(30)
    drive(gate.flows.edit("refund_order", refund("o4", 50), ctx("m4", "s5", "gpt-b"), editor="fiona"))
    assert isinstance(gate.approve(mail.approval_id, version=1, approver=SUPPORT), Grant)
    clock.advance(30)
    assert isinstance(gate.approve(p4.approval_id, version=2, approver=FINANCE), Grant)
    clock.advance(540)
    done = gate.approve(p3.approval_id, version=1, approver=FINANCE)
    assert isinstance(done, Grant)
    gate.execute(done.token)

    clock.advance(DAY)
    assert on(clock) == days[2]
    gate.expire()
    gate.flush()
    return days
