"""Shadow mode (issue 18): gated calls recorded with their cards and decided as usual, but never
paused for and never executed; a switch to live never runs what was proposed in shadow; the
disagreement report computed on a scripted ledger against hand-counted figures. On SQLite and
PostgreSQL (the `store` fixture)."""

from __future__ import annotations

import json

import pytest

from effectgate import (
    Approver,
    EffectGate,
    Grant,
    Keyring,
    Pending,
    Recorded,
    Refused,
)
from effectgate.audit import audit
from effectgate.errors import AlreadyDecided, PolicyViolation, TableError
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.flow import drive
from effectgate.report import disagreement
from effectgate.stores import SQLStore
from effectgate.table import ToolSpec
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")
PIA, PETE = Approver("pia", "privacy"), Approver("pete", "privacy")


def refund_args(amount: int, order: str = "1042") -> dict[str, object]:
    return {"order_id": order, "amount": amount, "currency": "GBP"}


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.generate()


@pytest.fixture
def shop() -> Shop:
    return Shop()


def gate_on(store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock, *, shadow: bool) -> EffectGate:
    table = shop.table()
    if shadow:
        table = table.shadowed(["refund_order", "send_email", "delete_customer_data"])
    return EffectGate(table, store, policy=SHOP_POLICY, keyring=keyring, clock=clock)


def refused_shadow(out: object) -> Refused:
    assert isinstance(out, Refused), out
    assert out.code == "shadow", out
    assert out.approval_id is not None
    return out


def test_a_shadow_call_is_recorded_with_its_card_never_paused_never_run(
    store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock
) -> None:
    with gate_on(store, shop, keyring, clock, shadow=True) as gate:
        out = refused_shadow(gate.call("refund_order", refund_args(1200), context("m1")))
        assert "recorded for review" in out.for_model()
        [row] = store.approvals()
        assert (row.id, row.status, row.tool, row.approver_role) == (
            out.approval_id,
            "pending",
            "refund_order",
            "finance",
        )
        card = gate.card(row.id)
        assert json.loads(row.args_json)["amount"] == 1200
        assert card.args["amount"] == 1200
        assert any("shadow mode" in note for note in card.notes)
        # a replay of the same message finds the same record: no second approval
        again = refused_shadow(gate.call("refund_order", refund_args(1200), context("m1")))
        assert again.approval_id == out.approval_id
        assert len(store.approvals()) == 1
        # decided as usual: approving records the decision and mints nothing
        decision = gate.approve(row.id, version=1, approver=FINANCE)
        assert isinstance(decision, Recorded)
        assert (decision.approvals, decision.required, decision.complete) == (1, 1, True)
        approved = store.get_approval(row.id)
        assert approved is not None
        assert (approved.status, approved.token_hash, approved.grants) == ("approved", None, 0)
        assert [(d.approver_id, d.decision) for d in store.all_decisions()] == [("fiona", "approve")]
        with pytest.raises(AlreadyDecided):
            gate.approve(row.id, version=1, approver=Approver("frank", "finance"))
        # the agent is still told the same, after the decision
        refused_shadow(gate.call("refund_order", refund_args(1200), context("m1")))
    assert shop.receiver.count("refund") == 0
    assert store.executions() == []


def test_a_shadow_destructive_call_records_two_distinct_approvers(
    store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock
) -> None:
    ctx = context("m9", user_id="c-77")
    with gate_on(store, shop, keyring, clock, shadow=True) as gate:
        out = refused_shadow(gate.call("delete_customer_data", {"customer_id": "c-77"}, ctx))
        assert out.approval_id is not None
        first = gate.approve(out.approval_id, version=1, approver=PIA)
        assert isinstance(first, Recorded)
        assert not first.complete
        second = gate.approve(out.approval_id, version=1, approver=PETE)
        assert isinstance(second, Recorded)
        assert second.complete
    assert shop.receiver.count("delete") == 0


def test_switching_to_live_never_runs_what_was_proposed_in_shadow(
    store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock
) -> None:
    """Two shadow proposals (one approved, one pending), then the row goes live: neither can be
    approved or run; the same user message again is a new, live proposal that runs once."""
    with gate_on(store, shop, keyring, clock, shadow=True) as shadow:
        approved = refused_shadow(shadow.call("refund_order", refund_args(1200), context("m1")))
        assert approved.approval_id is not None
        assert isinstance(shadow.approve(approved.approval_id, version=1, approver=FINANCE), Recorded)
        waiting = refused_shadow(shadow.call("refund_order", refund_args(500, "1043"), context("m2")))
        assert waiting.approval_id is not None
    with gate_on(store, shop, keyring, clock, shadow=False) as live:
        with pytest.raises(PolicyViolation) as raised:
            live.approve(waiting.approval_id, version=1, approver=FINANCE)
        assert raised.value.code == "reclassified"
        replay = live.call("refund_order", refund_args(1200), context("m1"))
        assert isinstance(replay, Pending)
        assert replay.approval_id not in (approved.approval_id, waiting.approval_id)
        grant = live.approve(replay.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        live.execute(grant.token)
    assert shop.receiver.count("refund") == 1
    executed = [e.approval_id for e in store.executions()]
    assert executed == [replay.approval_id]
    # the approved shadow proposal is no reclassification finding after the switch: no grant exists
    assert audit(store, keyring=keyring).clean
    assert audit(store, shop.table(), keyring=keyring).clean


def test_a_shadow_call_never_holds_a_live_subject(
    store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock
) -> None:
    """A shadow proposal for order 1042 in one session does not make the order busy for a live
    proposal from another session (shadow and live never share a subject)."""
    with gate_on(store, shop, keyring, clock, shadow=True) as shadow:
        refused_shadow(shadow.call("refund_order", refund_args(1200), context("m1")))
    with gate_on(store, shop, keyring, clock, shadow=False) as live:
        out = live.call("refund_order", refund_args(300), context("m5", session_id="s-bea", user_id="u1"))
        assert isinstance(out, Pending), out


def test_shadow_is_only_for_gated_rows(shop: Shop) -> None:
    [read] = [s for s in shop.table() if s.name == "get_order"]
    with pytest.raises(TableError, match="shadow"):
        ToolSpec(name="x", effect=read.effect, fn=read.fn, shadow=True)
    with pytest.raises(TableError):
        shop.table().shadowed(["no_such_tool"])
    table = shop.table().shadowed()
    assert {s.name for s in table if s.shadow} == {
        "refund_order",
        "send_email",
        "cancel_subscription",
        "delete_customer_data",
    }
    assert table["refund_order"].fingerprint != shop.table()["refund_order"].fingerprint
    assert (
        table.shadowed(shadow=False)["refund_order"].fingerprint == shop.table()["refund_order"].fingerprint
    )


def test_the_disagreement_report_matches_a_hand_counted_ledger(
    store: SQLStore, shop: Shop, keyring: Keyring, clock: FakeClock
) -> None:
    """Shadow refunds: 5 proposed. 2 approved as proposed, 1 edited then approved, 1 denied, 1
    left pending. Disagreement = (denied 1 + edited 1) / decided 4 = 0.5. Emails (shadow): 1
    approved. A live refund approved and run counts under mode live, apart."""
    with gate_on(store, shop, keyring, clock, shadow=True) as gate:
        ids = []
        for n in range(5):
            shop.orders[f"o{n}"] = {"user_id": "u1", "total": 10000, "currency": "GBP", "status": "x"}
            ctx = context(f"m{n}", session_id=f"s{n}")
            out = refused_shadow(gate.call("refund_order", refund_args(100 + n, f"o{n}"), ctx))
            ids.append(out.approval_id)
        for approval_id in ids[:2]:
            assert isinstance(gate.approve(approval_id, version=1, approver=FINANCE), Recorded)
        fix, ctx = refund_args(50, "o2"), context("m2", session_id="s2")
        edited = drive(gate.flows.edit("refund_order", fix, ctx, editor="fiona"))
        assert isinstance(edited, Refused)
        assert edited.approval_id == ids[2]
        assert isinstance(gate.approve(ids[2], version=2, approver=FINANCE), Recorded)
        gate.deny(ids[3], approver=FINANCE, reason="not eligible")
        mail = refused_shadow(
            gate.call("send_email", {"to": ["a@x"], "subject": "hi", "body": "b"}, context("e1"))
        )
        assert mail.approval_id is not None
        assert isinstance(
            gate.approve(mail.approval_id, version=1, approver=Approver("sam", "support_lead")), Recorded
        )
    with gate_on(store, shop, keyring, clock, shadow=False) as live:
        out = live.call("refund_order", refund_args(70, "1043"), context("m9"))
        assert isinstance(out, Pending)
        grant = live.approve(out.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        live.execute(grant.token)
    by_tool = {(r.key, r.mode): r for r in disagreement(store, by="tool")}
    refunds = by_tool[("refund_order", "shadow")]
    assert (refunds.decided, refunds.approved, refunds.denied, refunds.edited, refunds.undecided) == (
        4,
        3,
        1,
        1,
        1,
    )
    assert refunds.disagreement == 0.5
    assert by_tool[("send_email", "shadow")].disagreement == 0.0
    live_refunds = by_tool[("refund_order", "live")]
    assert (live_refunds.decided, live_refunds.approved, live_refunds.disagreement) == (1, 1, 0.0)
    by_role = {(r.key, r.mode): r for r in disagreement(store, by="role")}
    assert by_role[("finance", "shadow")].decided == 4
    assert by_role[("support_lead", "shadow")].decided == 1
    # a window that excludes everything
    assert disagreement(store, since=clock.now() + 1) == []
