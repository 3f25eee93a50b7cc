"""Sandbox replay (issue 18): every recorded approval re-run through the current gate and table
against recorders. The same table replays `same`; a reclassified tool, a changed role, a changed
schema and a removed tool are each flagged; nothing real is ever called. On SQLite and
PostgreSQL."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, Effect, EffectGate, EffectTable, Executed, Grant, Keyring, Pending
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")
PIA, PETE = Approver("pia", "privacy"), Approver("pete", "privacy")


def run(
    gate: EffectGate, tool: str, args: dict[str, Any], message: str, *approvers: Approver, **ctx: Any
) -> str:
    out = gate.call(tool, args, context(message, **ctx))
    assert isinstance(out, Pending), out
    for approver in approvers:
        decision = gate.approve(out.approval_id, version=out.version, approver=approver)
    assert isinstance(decision, Grant)
    assert isinstance(gate.execute(decision.token), Executed)
    return out.approval_id


@pytest.fixture
def ledger(store: SQLStore, clock: FakeClock) -> tuple[Shop, list[str]]:
    """Two refunds, an email and a destructive erasure (two approvers), all executed."""
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        ids = [
            run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1", FINANCE),
            run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2", FINANCE),
            run(
                gate,
                "send_email",
                {"to": ["ada@example.com"], "subject": "Refund", "body": "Done."},
                "m3",
                Approver("sam", "support_lead"),
            ),
            run(gate, "delete_customer_data", {"customer_id": "u1"}, "m4", PIA, PETE),
        ]
    return shop, ids


def verdicts(store: SQLStore, table: EffectTable) -> dict[str, tuple[str, str]]:
    return {r.approval_id: (r.verdict, r.detail) for r in replay(store, table, SHOP_POLICY).results}


def test_the_same_table_replays_the_same_and_calls_nothing_real(
    ledger: tuple[Shop, list[str]], store: SQLStore
) -> None:
    shop, ids = ledger
    counts = {kind: shop.receiver.count(kind) for kind in ("refund", "email", "delete")}
    report = replay(store, shop.table(), SHOP_POLICY)
    assert {r.approval_id: r.verdict for r in report.results} == dict.fromkeys(ids, "same")
    assert report.clean
    assert {kind: shop.receiver.count(kind) for kind in counts} == counts  # nothing real ran
    assert sorted(c["amount"] for c in report.calls["refund_order"]) == [500, 1200]
    assert report.calls["delete_customer_data"] == [{"customer_id": "u1"}]


def test_a_reclassified_tool_and_a_changed_role_are_rerouted(
    ledger: tuple[Shop, list[str]], store: SQLStore
) -> None:
    shop, ids = ledger
    table = shop.table()
    as_write = table.replace(
        dataclasses.replace(table["send_email"], effect=Effect.WRITE, approver_role=None)
    )
    lead = as_write.replace(dataclasses.replace(table["refund_order"], approver_role="finance_lead"))
    found = verdicts(store, lead)
    assert found[ids[0]][0] == found[ids[1]][0] == "rerouted"
    assert "finance_lead" in found[ids[0]][1]
    assert found[ids[2]] == ("rerouted", "runs without approval now (its row is write, was send)")
    assert found[ids[3]][0] == "same"


def test_a_changed_schema_and_a_removed_tool_are_refused(
    ledger: tuple[Shop, list[str]], store: SQLStore
) -> None:
    shop, ids = ledger
    table = shop.table()
    refund = table["refund_order"]
    schema = dict(refund.schema or {})
    properties = dict(schema["properties"])
    properties["amount"] = {**properties["amount"], "maximum": 1000}
    capped = table.replace(dataclasses.replace(refund, schema={**schema, "properties": properties}))
    without_email = EffectTable([s for s in capped if s.name != "send_email"])
    for agent in capped.agents():
        without_email.allow(agent, capped.allowlist(agent) - {"send_email"})
    found = verdicts(store, without_email)
    assert found[ids[0]][0] == "refused"
    assert found[ids[0]][1].startswith("invalid:")
    assert found[ids[1]] == ("same", "")  # 500 still fits
    assert found[ids[2]][0] == "refused"
    assert found[ids[2]][1].startswith("unknown_tool")


def test_an_edited_record_is_refused_not_replayed(ledger: tuple[Shop, list[str]], store: SQLStore) -> None:
    shop, ids = ledger
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = REPLACE(args_json, '1200', '9900') WHERE id = :i"),
            {"i": ids[0]},
        )
    report = replay(store, shop.table(), SHOP_POLICY)
    [first] = [r for r in report.results if r.approval_id == ids[0]]
    assert first.verdict == "refused"
    assert first.detail.startswith("tampered")
    assert [c["amount"] for c in report.calls["refund_order"]] == [500]


def test_a_shadow_proposal_replays_the_same_in_shadow_and_rerouted_once_live(
    store: SQLStore, clock: FakeClock
) -> None:
    shop = Shop()
    shadow_table = shop.table().shadowed(["refund_order"])
    with EffectGate(shadow_table, store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert out.approval_id is not None  # type: ignore[union-attr]
        gate.approve(out.approval_id, version=1, approver=FINANCE)  # type: ignore[union-attr]
    assert [(r.verdict, r.detail) for r in replay(store, shadow_table, SHOP_POLICY).results] == [("same", "")]
    [live] = replay(store, shop.table(), SHOP_POLICY).results
    assert live.verdict == "rerouted"
    assert "shadow" in live.detail
    assert shop.receiver.count("refund") == 0
