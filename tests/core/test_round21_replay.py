"""Round 21 review of the sandbox replay and the report: what they read back from rows anyone with
write access to the database can add or edit (redaction entries, decisions, status columns) and
what they make of it. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.redact import redact
from effectgate.replay import replay
from effectgate.report import disagreement, figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")


def _run(gate: EffectGate, tool: str, args: dict[str, Any], message: str) -> str:
    out = gate.call(tool, args, context(message))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=out.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    return out.approval_id


def test_an_unsealed_redaction_entry_added_after_a_sealed_one_does_not_hide_it(
    store: SQLStore, clock: FakeClock
) -> None:
    """A genuine redaction writes one sealed `eg_redacted` entry per value. An entry inserted in
    the database afterwards for the same value (no seal) took its place: replay read only the
    last entry per value, so a genuinely erased approval was reported `refused` (tampered). Given
    the keyring, only entries whose seal verifies count: it is listed as erased, nothing changed."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        erased = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
    redact(store, keyring, user_id="u1", by="dpo", reason="erasure request 77")
    with store.transaction() as conn:
        [entry] = [e for e in store.redacted(conn) if e.row_key == erased and e.column_name == "args_json"]
        fields = entry.model_dump(exclude={"id"})
        conn.execute(
            sa.text(
                "INSERT INTO eg_redacted (redaction_id, table_name, row_key, column_name, commitment, "
                "args_hash, kept_json, at, seal) VALUES (:redaction_id, :table_name, :row_key, "
                ":column_name, :commitment, :args_hash, :kept_json, :at, :seal)"
            ),
            {**fields, "redaction_id": "r-inserted", "seal": "forged"},
        )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert report.redacted == (erased,)
    assert report.results == ()
    assert report.clean


def test_an_erased_approval_whose_seal_does_not_verify_is_refused_not_listed_as_erased(
    store: SQLStore, clock: FakeClock
) -> None:
    """An erased approval whose sealed fields were edited afterwards (its approver role, so it
    reads as approved by whoever holds it) was listed as erased, the report clean, because only
    its redaction entry was checked. Given the keyring its seal is checked first, as for every
    other approval: `refused` (tampered), not listed as erased."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        erased = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
    redact(store, keyring, user_id="u1", by="dpo", reason="erasure request 77")
    assert replay(store, shop.table(), SHOP_POLICY, keyring=keyring).redacted == (erased,)
    with store.transaction() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET approver_role = 'intern' WHERE id = :i"), {"i": erased})
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert report.redacted == ()
    assert [(r.approval_id, r.verdict) for r in report.results] == [(erased, "refused")]
    assert report.results[0].detail.startswith("tampered")


def test_a_denial_edited_into_an_approval_is_not_counted_approved_as_verified(
    store: SQLStore, clock: FakeClock
) -> None:
    """The report's decided, approved and denied counts come from the status column, which no seal
    covers: a denial edited into `approved` was counted approved, with every seal verified and no
    note on the page. Its sealed count of grants (none minted) contradicts the status: it is set
    apart under mode "unverified" and the report says so."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Pending)
        gate.deny(out.approval_id, approver=FINANCE, reason="not this one")
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'approved' WHERE id = :i"), {"i": out.approval_id}
        )
    report = figures(store, keyring=keyring)
    live = [r for r in report.by_tool if r.mode == "live"]
    assert sum(r.approved for r in live) == 0  # counted "unverified", or as the denial it was
    assert report.note is not None


@pytest.mark.parametrize("status", ["pending", "expired", "denied"])
def test_a_granted_intent_whose_status_is_edited_is_reported_not_dropped(
    store: SQLStore, clock: FakeClock, status: str
) -> None:
    """Replay picks the intents to re-run by the status column (no seal covers it): an approved
    refund whose grant was minted and not yet presented, its status edited to pending, expired or
    denied (no denial recorded), was left out of the replay, whose report read clean. Its sealed
    count of grants says it was granted: it is reported `refused` (tampered), not dropped."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Pending)
        assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Grant)
        revoked = gate.call(
            "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, context("m2")
        )
        assert isinstance(revoked, Pending)
        assert isinstance(gate.approve(revoked.approval_id, version=1, approver=FINANCE), Grant)
        gate.deny(revoked.approval_id, approver=FINANCE, reason="revoked before it ran")
    assert [r.verdict for r in replay(store, shop.table(), SHOP_POLICY, keyring=keyring).results] == ["same"]
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :i"), {"s": status, "i": out.approval_id}
        )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert [(r.approval_id, r.verdict) for r in report.results] == [(out.approval_id, "refused")]
    assert report.results[0].detail.startswith("tampered")


@pytest.mark.parametrize("bound", [float("nan"), float("inf"), "2026-12-01", True])
def test_a_report_window_that_is_no_time_is_refused_before_anything_is_read(
    store: SQLStore, bound: Any
) -> None:
    """`figures(since=...)` and `disagreement(until=...)` took any value: NaN compared with nothing
    (an empty report that read as a quiet week), text or a bool failed on PostgreSQL with the
    driver's raw error. A bound is None or a finite number of seconds, as `effectgate report
    --since` takes it (ValueError, as a latency target is refused)."""
    with pytest.raises(ValueError, match="since"):
        figures(store, since=bound)
    with pytest.raises(ValueError, match="until"):
        disagreement(store, until=bound)


def test_a_report_window_bound_past_64_bits_is_a_time_not_an_overflow(store: SQLStore) -> None:
    """An integer bound past 64 bits failed on SQLite with OverflowError; it is a time (far away)."""
    report = figures(store, until=10**30)
    assert report.until == 10**30
    assert report.metrics.proposals == 0


def test_an_edited_decision_time_does_not_turn_a_missed_target_into_a_met_one(
    store: SQLStore, clock: FakeClock
) -> None:
    """A refund decided 600 s after its proposal misses finance's 300 s target; its decided_at
    edited to 5 s after it still misses it (round 29: the p95 reads the append-only records)."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Pending)
        clock.advance(600)
        assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Grant)
    assert figures(store, keyring=keyring, targets={"finance": 300}).metrics.latency_met("finance") is False
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET decided_at = created_at + 5 WHERE id = :i"),
            {"i": out.approval_id},
        )
    report = figures(store, keyring=keyring, targets={"finance": 300})
    assert report.metrics.latency_met("finance") is False or report.note is not None
