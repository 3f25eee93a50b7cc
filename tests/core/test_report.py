"""The rollout figures of `effectgate report` (issue 18) against a scripted ledger whose figures
are counted by hand: p95 latency per role against a target, replays absorbed, gated proposals per
day against that day's sessions, the reconciliation backlog. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

from effectgate import Approver, EffectGate, Grant, Keyring, Pending
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.report import disagreement, metrics
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")


def test_the_figures_match_a_hand_counted_ledger(store: SQLStore, clock: FakeClock) -> None:
    """Three refunds in three sessions, decided after 60 s (approved), 600 s (approved) and 30 s
    (denied): p95 of [30, 60, 600] is 600 s, over a 300 s target. The first message sent again is
    one replay absorbed. A read in a fourth session counts as a session of the day."""
    shop = Shop()
    day = datetime.fromtimestamp(clock.now(), tz=UTC).date().isoformat()
    start = clock.now()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        pending = []
        for n, order in enumerate(("1042", "1043", "1042")):
            ctx = context(f"m{n}", session_id=f"s{n}")
            out = gate.call("refund_order", {"order_id": order, "amount": 100, "currency": "GBP"}, ctx)
            assert isinstance(out, Pending), out
            pending.append(out)
            if n == 1:  # the third refund of 1042 waits until the first has run (subject busy)
                clock.advance(60)
                first = gate.approve(pending[0].approval_id, version=1, approver=FINANCE)
                assert isinstance(first, Grant)
                gate.execute(first.token)
                clock.advance(540)
                assert isinstance(gate.approve(pending[1].approval_id, version=1, approver=FINANCE), Grant)
        clock.advance(30)
        gate.deny(pending[2].approval_id, approver=FINANCE, reason="duplicate")
        again = gate.call(
            "refund_order",
            {"order_id": "1042", "amount": 100, "currency": "GBP"},
            context("m0", session_id="s0"),
        )
        assert again.approval_id == pending[0].approval_id  # type: ignore[union-attr]
        gate.call("get_order", {"order_id": "1042"}, context("r1", session_id="s9"))
        gate.flush()
    figures = metrics(store, targets={"finance": 300})
    assert figures.latency_p95_s == {"finance": 600.0}
    assert figures.latency_met("finance") is False
    assert (figures.proposals, figures.replays_absorbed) == (3, 1)
    assert figures.replay_rate == 0.25
    assert figures.gated_by_day == [(day, 3, 4)]
    assert figures.needs_reconciliation == 0
    assert metrics(store, since=start + 3600).proposals == 0
    [refunds] = disagreement(store)
    assert (refunds.decided, refunds.approved, refunds.denied, refunds.disagreement) == (3, 2, 1, 1 / 3)
    data = figures.to_dict()
    assert data["gated_by_day"] == [{"day": day, "proposals": 3, "sessions": 4, "per_1000_sessions": 750.0}]
    assert data["latency_met"] == {"finance": False}
