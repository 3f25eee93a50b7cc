"""The report's figures (issue 18), computed by the database, against a scripted three-day ledger
whose every figure is counted by hand: decision rates per tool, p95 latency per role, replays per
day, gated proposals per 1,000 sessions per model per day, the reconciliation backlog. On SQLite and
PostgreSQL; the clock is injected, nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from effectgate import EffectGate, Grant, Keyring
from effectgate.examples.shop import SHOP_POLICY, Shop
from effectgate.report import disagreement, figures, metrics, p95, p95_rank
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from tests._report_ledger import DAY, FINANCE, ctx, propose, refund, script


@pytest.fixture
def shop() -> Shop:
    shop = Shop()
    for n in range(1, 50):
        shop.orders[f"o{n}"] = {"user_id": "u1", "total": 10000, "currency": "GBP", "status": "shipped"}
    return shop


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, shop: Shop) -> Iterator[EffectGate]:
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as g:
        yield g


def test_every_figure_matches_the_hand_counted_ledger(
    gate: EffectGate, shop: Shop, store: SQLStore, clock: FakeClock
) -> None:
    """Finance latencies 120, 180, 600 and 60 s: p95 (nearest rank of 4) is 600 s, over a 300 s
    target; support_lead's one 30 s meets 60 s. Refunds settled 5: approved 3 (P1, P3, P4), denied
    1, edited 1 (P4), expired 1. Six proposals and one replay: 1/7. Per 1,000 sessions: gpt-a 2 of
    3 sessions on day 0, gpt-b 4 of 4 on day 1 (the step); day 2 has one session, no proposal. One
    record awaits reconciliation, since day 0."""
    d0, d1, d2 = script(gate, shop, clock)
    report = figures(store, targets={"finance": 300, "support_lead": 60})
    m = report.metrics
    assert m.latency_p95_s == {"finance": 600.0, "support_lead": 30.0}
    assert (m.latency_met("finance"), m.latency_met("support_lead")) == (False, True)
    rates = {t.tool: t for t in m.decision_rates}
    refunds = rates["refund_order"]
    assert (refunds.settled, refunds.approved, refunds.denied, refunds.edited, refunds.expired) == (
        5,
        3,
        1,
        1,
        1,
    )
    assert (refunds.rate("approved"), refunds.rate("denied"), refunds.rate("edited")) == (0.6, 0.2, 0.2)
    assert (refunds.rate("expired"), refunds.pending) == (0.2, 0)
    assert (rates["send_email"].settled, rates["send_email"].rate("approved")) == (1, 1.0)
    assert (m.proposals, m.replays_absorbed, m.replay_rate) == (6, 1, 1 / 7)
    assert m.replays_by_day == [(d0, 1)]
    assert m.gated_by_day == [(d0, 2, 3), (d1, 4, 4), (d2, 0, 1)]
    assert m.gated_by_model == [(d0, "gpt-a", 2, 3), (d1, "gpt-b", 4, 4)]
    assert (m.needs_reconciliation, m.backlog_by_day) == (1, [(d0, 1)])
    data = m.to_dict()
    per_model = [(r["model_id"], r["per_1000_sessions"]) for r in data["gated_by_model"]]
    assert per_model == [("gpt-a", 2000 / 3), ("gpt-b", 1000.0)]
    assert data["decision_rates"][0]["rates"] == {
        "approved": 0.6,
        "denied": 0.2,
        "edited": 0.2,
        "expired": 0.2,
    }
    [by_tool] = [r for r in report.by_tool if r.key == "refund_order"]
    assert (by_tool.decided, by_tool.disagreed, by_tool.disagreement) == (4, 2, 0.5)
    assert report.to_dict()["by_role"] == [r.to_dict() for r in disagreement(store, by="role")]


def test_the_window_bounds_every_figure(
    gate: EffectGate, shop: Shop, store: SQLStore, clock: FakeClock
) -> None:
    """Day 1 alone: gpt-b's four proposals over its four sessions, no replay, finance p95 600 s
    (P3 600, P4 60; P5 expired is not a decision); the backlog is now, whatever the window."""
    d0, d1, _ = script(gate, shop, clock)
    start = datetime.fromisoformat(d1).replace(tzinfo=UTC).timestamp()
    m = metrics(store, since=start, until=start + DAY)
    assert (m.proposals, m.replays_absorbed, m.replay_rate) == (4, 0, 0.0)
    assert m.gated_by_day == [(d1, 4, 4)]
    assert m.gated_by_model == [(d1, "gpt-b", 4, 4)]
    assert m.latency_p95_s == {"finance": 600.0, "support_lead": 30.0}
    assert m.needs_reconciliation == 1
    before = metrics(store, until=start)
    assert (before.proposals, before.latency_p95_s, before.gated_by_day) == (
        2,
        {"finance": 180.0},
        [(d0, 2, 3)],
    )


def test_the_sql_p95_is_the_nearest_rank_of_report_p95(
    gate: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    """Forty refunds decided after 1, 2, ..., 40 s (in a shuffled order): the database's p95 is the
    value at rank ceil(0.95 * 40) - 1 = 37, 38 s, exactly what `report.p95` gives for the list."""
    latencies = [float((7 * n) % 40 + 1) for n in range(40)]  # 1..40, shuffled
    pending = [
        propose(gate, "refund_order", refund(f"o{n + 1}"), ctx(f"m{n}", f"s{n}", "gpt-a")) for n in range(40)
    ]
    waited = 0.0
    for p, latency in sorted(zip(pending, latencies, strict=True), key=lambda pl: pl[1]):
        clock.advance(latency - waited)
        waited = latency
        if latency % 2:
            assert isinstance(gate.approve(p.approval_id, version=1, approver=FINANCE), Grant)
        else:
            gate.deny(p.approval_id, approver=FINANCE, reason="no")
    assert p95_rank(40) == 37
    assert p95(latencies) == 38.0
    assert metrics(store).latency_p95_s == {"finance": 38.0}
    assert metrics(store, until=clock.now() + 1).latency_p95_s == {"finance": 38.0}


def test_an_empty_ledger_has_no_figures(store: SQLStore) -> None:
    """No calls: no roles, no rates, no days, nothing awaiting reconciliation."""
    m = figures(store).metrics
    assert (m.latency_p95_s, m.decision_rates, m.gated_by_day, m.gated_by_model) == ({}, [], [], [])
    assert (m.proposals, m.replays_absorbed, m.replay_rate, m.needs_reconciliation) == (0, 0, None, 0)


def test_two_models_sharing_a_day_each_get_their_own_sessions(
    gate: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    """gpt-a proposes one refund in s1; gpt-b one in s2 and reads in s3: gpt-a's rate is 1 of its
    1 session (1,000), gpt-b's 1 of its 2 (500); the day's total is 2 of 3 sessions."""
    propose(gate, "refund_order", refund("o1"), ctx("m1", "s1", "gpt-a"))
    propose(gate, "refund_order", refund("o2"), ctx("m2", "s2", "gpt-b"))
    gate.call("get_order", {"order_id": "1042"}, ctx("r1", "s3", "gpt-b"))
    gate.flush()
    day = datetime.fromtimestamp(clock.now(), tz=UTC).date().isoformat()
    m = figures(store).metrics
    assert m.gated_by_model == [(day, "gpt-a", 1, 1), (day, "gpt-b", 1, 2)]
    assert m.gated_by_day == [(day, 2, 3)]
