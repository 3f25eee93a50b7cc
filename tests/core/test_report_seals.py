"""The report's shadow/live split rests on each approval's seal: given the ledger's keyring, an
approval whose sealed row fingerprint was edited in the database counts under mode "unverified"
(never shadow or live) and is counted in `Figures.unverified`; without a keyring the report says
its figures are unverified and points to `effectgate audit`. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
)
from effectgate.examples.shop import SHOP_POLICY, Shop
from effectgate.report import disagreement, figures, metrics, render_html
from effectgate.report._verify import set_apart
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from tests._report_ledger import script

FINANCE = Approver("fiona", "finance")


def pay(payee: str, amount: int) -> dict[str, Any]:
    return {"ok": True}


def ledger(store: SQLStore, keyring: Keyring, clock: FakeClock) -> tuple[str, str, str]:
    """Two live payments (one denied, one approved) and one shadow payment: the denied live
    approval's id, its row fingerprint and the shadow tool's row fingerprint."""
    table = EffectTable(
        [
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("payee",)),
            ToolSpec(
                name="pay_shadow",
                effect=Effect.MONEY,
                fn=pay,
                approver_role="finance",
                subject=("payee",),
                shadow=True,
            ),
        ]
    )
    table.allow_all("agent")
    with EffectGate(table, store, keyring=keyring, clock=clock) as gate:
        ids = []
        for n in range(2):
            c = CallContext(session_id=f"s{n}", origin_message_id=f"m{n}", user_id="u1", agent_id="agent")
            out = gate.call("pay", {"payee": f"p{n}", "amount": 5}, c)
            assert isinstance(out, Pending), out
            ids.append(out.approval_id)
        c = CallContext(session_id="s9", origin_message_id="m9", user_id="u1", agent_id="agent")
        gate.call("pay_shadow", {"payee": "q", "amount": 5}, c)
        clock.advance(30)
        gate.deny(ids[0], approver=FINANCE, reason="no")
        assert isinstance(gate.approve(ids[1], version=1, approver=FINANCE), Grant)
        gate.flush()
    [denied] = store.approvals(status="denied")
    [shadow] = [a for a in store.approvals() if a.tool == "pay_shadow"]
    assert denied.id == ids[0]
    assert denied.row_fingerprint != shadow.row_fingerprint
    return denied.id, denied.row_fingerprint, shadow.row_fingerprint


def split(rates: list[Any]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(r.key, r.mode): (r.decided, r.denied) for r in rates}


def test_an_edited_row_fingerprint_counts_as_unverified_never_shadow(
    store: SQLStore, clock: FakeClock
) -> None:
    """A live denied approval whose row fingerprint is set, in the database, to the shadow tool's:
    read as stored it would count as a shadow decision (and make the live tool look cleaner); its
    seal no longer verifies, so it counts under "unverified" by tool and by role, and once in
    `unverified`. The untouched approvals keep their modes."""
    keyring = Keyring.generate()
    approval_id, _live_fp, shadow_fp = ledger(store, keyring, clock)
    before = figures(store, keyring=keyring)
    assert split(before.by_tool) == {("pay", "live"): (2, 1), ("pay_shadow", "shadow"): (0, 0)}
    assert (before.unverified, before.note, before.to_dict()["seals_checked"]) == (0, None, True)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET row_fingerprint = :fp WHERE id = :id"),
            {"fp": shadow_fp, "id": approval_id},
        )
    assert split(figures(store).by_tool)[("pay", "shadow")] == (1, 1)  # the column as stored says shadow

    after = figures(store, keyring=keyring)
    assert split(after.by_tool) == {
        ("pay", "live"): (1, 0),
        ("pay", "unverified"): (1, 1),
        ("pay_shadow", "shadow"): (0, 0),
    }
    assert split(after.by_role) == {
        ("finance", "live"): (1, 0),
        ("finance", "shadow"): (0, 0),
        ("finance", "unverified"): (1, 1),
    }
    assert after.unverified == 1
    assert "effectgate audit" in (after.note or "")
    data = after.to_dict()
    assert (data["unverified"], data["seals_checked"], data["note"]) == (1, True, after.note)
    assert split(disagreement(store, keyring=keyring)) == split(after.by_tool)
    assert split(disagreement(store, by="role", keyring=keyring)) == split(after.by_role)
    [rates] = [t for t in metrics(store, keyring=keyring).decision_rates if t.tool == "pay"]
    assert (rates.settled, rates.denied) == (2, 1)  # every call still counted once, in one mode
    page = render_html(after)
    assert '<p class="missed" data-note="seals">1 approval(s) in this window carry a seal' in page
    # outside the window the edited approval is not counted anywhere
    assert figures(store, keyring=keyring, since=clock.now() + 1).unverified == 0


def test_without_a_keyring_the_report_says_its_figures_are_unverified(
    store: SQLStore, clock: FakeClock
) -> None:
    """No keyring: no seal is checked, the modes are as stored, and the figures, their JSON and the
    page say so, pointing to `effectgate audit`."""
    ledger(store, Keyring.generate(), clock)
    report = figures(store)
    assert (report.unverified, report.seals_checked) == (None, False)
    assert "figures unverified" in (report.note or "")
    assert "effectgate audit" in (report.note or "")
    data = report.to_dict()
    assert (data["seals_checked"], data["unverified"], data["note"]) == (False, None, report.note)
    assert "no keyring was given" in render_html(report)


def test_another_keyring_verifies_nothing(store: SQLStore, clock: FakeClock) -> None:
    """A keyring that did not seal the ledger (the wrong one) verifies no approval: every call
    counts as "unverified", none as shadow or live."""
    ledger(store, Keyring.generate(), clock)
    report = figures(store, keyring=Keyring.generate())
    assert {r.mode for r in report.by_tool} == {"unverified"}
    assert report.unverified == 3


def test_set_apart_moves_each_broken_approval_once_and_never_below_zero() -> None:
    """An approval is taken from the group with its edited flag, or the other flag when an edit
    landed after the aggregate was read; one the aggregate did not count moves nothing."""
    rows = [("t", "r", "fp", "denied", 0, 1, 2), ("t", "r", "fp", "approved", 1, 1, 1)]
    broken = [
        ("a1", "t", "r", "fp", "denied", 1),  # not edited
        ("a2", "t", "r", "fp", "approved", 1),  # counted as edited, not in `edited`: the other flag
        ("a3", "t", "r", "other", "denied", 1),  # not in the aggregate
    ]
    moved = sorted(set_apart(rows, broken, edited=set()), key=str)
    assert moved == sorted(
        [
            ("t", "r", "fp", "denied", 0, 1, 1),
            ("t", "r", None, "denied", 0, 1, 1),
            ("t", "r", None, "approved", 1, 1, 1),
        ],
        key=str,
    )


@pytest.mark.parametrize("since", [None, 0.0])
def test_figures_without_broken_seals_equal_the_unchecked_ones(
    store: SQLStore, clock: FakeClock, since: float | None
) -> None:
    """An intact ledger: checking the seals changes no figure, only what the report says of them."""
    keyring = Keyring.generate()
    ledger(store, keyring, clock)
    checked, unchecked = figures(store, keyring=keyring, since=since), figures(store, since=since)
    assert checked.to_dict() | {"seals_checked": False, "unverified": None, "note": unchecked.note} == (
        unchecked.to_dict()
    )


def test_an_edited_call_whose_seal_breaks_takes_its_edit_along(store: SQLStore, clock: FakeClock) -> None:
    """The scripted ledger's edited refund (P4, approved at version 2) with a sealed field edited in
    the database (its bar lowered to 0 approvers; the row fingerprint left alone): its group is the
    live one's, so the report moves exactly it, edited flag and all, to "unverified"."""
    shop = Shop()
    for n in range(1, 50):
        shop.orders[f"o{n}"] = {"user_id": "u1", "total": 10000, "currency": "GBP", "status": "shipped"}
    keyring = Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        script(gate, shop, clock)
    [edited] = [a for a in store.approvals(status="approved") if a.version == 2]
    before = {(r.key, r.mode): r for r in figures(store, keyring=keyring).by_tool}
    live = before[("refund_order", "live")]
    assert (live.decided, live.edited, live.denied) == (4, 1, 1)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET approvals_required = 0 WHERE id = :id"), {"id": edited.id}
        )
    report = figures(store, keyring=keyring)
    after = {(r.key, r.mode): r for r in report.by_tool}
    live, unverified = after[("refund_order", "live")], after[("refund_order", "unverified")]
    assert (live.decided, live.edited, live.denied, live.approved) == (3, 0, 1, 2)
    assert (unverified.decided, unverified.edited, unverified.approved) == (1, 1, 1)
    assert report.unverified == 1
