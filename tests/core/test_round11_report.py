"""Round 11: the report (`effectgate.report`, `effectgate report`) against rows edited in the
database and model text. Each store test runs on SQLite and PostgreSQL (`shop_gate`); the clock
is injected, nothing sleeps."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Pending
from effectgate.audit import audit
from effectgate.examples.shop import context
from effectgate.report import figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def decided_after(gate: EffectGate, clock: FakeClock, waits: tuple[int, ...]) -> list[str]:
    """One refund per wait, approved by finance that many seconds after it was proposed."""
    ids = []
    for i, wait in enumerate(waits):
        pending = gate.call("refund_order", {**REFUND, "amount": 100 + i}, context(f"m{i}"))
        assert isinstance(pending, Pending)
        clock.advance(wait)
        assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
        ids.append(pending.approval_id)
    return ids


def edit(gate: EffectGate, column: str, value: object, approval_id: str) -> None:
    assert isinstance(gate.store, SQLStore)
    with gate.store.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE eg_approvals SET {column} = :v WHERE id = :id"), {"v": value, "id": approval_id}
        )


@pytest.mark.parametrize(
    ("column", "edited"), [("decided_at", math.nan), ("decided_at", math.inf), ("created_at", -math.inf)]
)
def test_a_decision_time_no_clock_gives_does_not_skew_the_reports_latency(
    shop_gate: ShopGate, clock: FakeClock, column: str, edited: float
) -> None:
    """Three refunds decided after 1 s, 100 s and 5 s: the p95 latency is 100 s, as the audit
    says (round 10). A fourth approval's decided_at edited to NaN (PostgreSQL keeps it) or
    infinity, or its created_at to minus infinity (still in an open window), is a time no clock
    gives: the report must leave it out as the audit does, not sort it last and give it as the
    p95 (infinity, or NaN: "MISSED" against any target)."""
    _, gate = shop_gate
    *_, last = decided_after(gate, clock, (1, 100, 5, 7))
    edit(gate, column, edited, last)
    report = figures(gate.store, targets={"finance": 300}, keyring=gate.keyring)
    assert report.metrics.latency_p95_s == {"finance": 100.0}
    assert report.metrics.latency_met("finance") is True
    audited = audit(gate.store, keyring=gate.keyring).metrics
    assert audited is not None
    assert audited.approval_latency_p95_s == 100.0  # the audit's figure
    # its seal broken too: still set apart as "unverified" (the seal check flags it as the
    # database's aggregate does, not as decided with a latency)
    edit(gate, "session_id", "forged", last)
    report = figures(gate.store, targets={"finance": 300}, keyring=gate.keyring)
    assert report.unverified == 1
    assert [(r.mode, r.decided) for r in report.by_tool] == [("live", 3), ("unverified", 1)]
    assert report.metrics.latency_p95_s == {"finance": 100.0}


@pytest.mark.xfail(
    strict=True,
    reason="design decision: the p95 is one SQL value per role (`Store.latency_p95`); leaving out "
    "the approvals whose seal does not verify needs their ids in that query (an IN list as long as the "
    "broken rows, past PostgreSQL's bind limit when many are) or reading a role's top 5% of latencies",
)
def test_an_approval_whose_seal_does_not_verify_is_not_in_its_edited_roles_latency(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """The README: `effectgate report` checks every approval's seal and counts one that fails as
    `unverified`. A finance refund decided after 100 s whose sealed approver role is edited to
    support_lead is counted under mode "unverified" in the rates; the p95 latency per role must
    not count it under the role the edit gave it (support_lead shows a p95 it never had)."""
    _, gate = shop_gate
    first, _ = decided_after(gate, clock, (100, 5))
    edit(gate, "approver_role", "support_lead", first)
    report = figures(gate.store, targets={"support_lead": 60}, keyring=gate.keyring)
    assert report.unverified == 1
    assert report.metrics.latency_p95_s.get("support_lead") is None
    assert report.metrics.latency_p95_s == {"finance": 5.0}


def test_a_denial_whose_status_is_edited_to_approved_still_counts_as_denied(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """The README: a denial is final, "the sealed deny decision, not the status column, says that a
    version was denied". A team reads the disagreement rate to decide when a class may leave
    shadow mode; a denied refund whose status is edited to approved in the database must not
    lower it (and the report, given the keyring, must not count it as a verified approval)."""
    _, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending)
    clock.advance(30)
    gate.deny(pending.approval_id, approver=FINANCE, reason="not eligible")
    edit(gate, "status", "approved", pending.approval_id)
    report = figures(gate.store, keyring=gate.keyring)
    [rate] = report.by_tool
    assert (rate.denied, rate.disagreement) == (1, 1.0) or (rate.mode, report.unverified) == ("unverified", 1)
