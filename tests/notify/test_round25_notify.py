"""Round 25: notifications and the report (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Keyring, ToolContext
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.notify import Notification
from effectgate.notify._message import delivery_id
from effectgate.report import disagreement, figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ..core._bank import Tags
from ..core.test_report_seals import ledger, split


class _SlowTags(Tags):
    """A write whose first run outlives its lease: `recover()` runs while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.during_first_run: Any = None

    def tag(self, ticket_id: str, tags: list[str], tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        if self.during_first_run is not None:
            hook, self.during_first_run = self.during_first_run, None
            hook()
        return super().tag(ticket_id, tags, tool_context)


def test_an_unknown_outcome_reopened_after_it_was_released_is_a_new_page(
    store: SQLStore, clock: FakeClock
) -> None:
    """`recover()` pages the unknown outcome of a write whose lease ran out, reconciles it (not
    found: released), then the run returns: the record needs reconciliation again (`reopen`) and
    is paged again. That second page is a new one (the first was settled), so it must not carry
    the first page's delivery id: a receiver drops an id it has accepted (`SeenDeliveries`)."""
    tags = _SlowTags()
    seen: list[Notification] = []
    gate = EffectGate(tags.table(), store, keyring=Keyring.generate(), clock=clock, notify=seen.append)

    def expire_and_recover() -> None:
        clock.advance(gate.policy.lease_seconds + 1)
        assert len(gate.recover()) == 1
        clock.advance(1)

    tags.during_first_run = expire_and_recover
    try:
        with pytest.raises(LeaseLost):
            gate.call("tag", {"ticket_id": "t1", "tags": ["vip"]}, context("m1"))
    finally:
        gate.close()
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    pages = [n for n in seen if n.kind == "needs_reconciliation"]
    assert len(pages) == 2
    assert delivery_id(pages[0]) != delivery_id(pages[1])


@pytest.mark.parametrize(
    ("which", "status"),
    [
        ("denied", "pending"),  # a sealed denial hidden: the live tool looks cleaner
        ("shadow", "denied"),  # a denial no reviewer made
        ("shadow", "zzz"),  # no status the gate writes, counted as decided
    ],
)
def test_a_status_its_sealed_denial_contradicts_is_unverified(
    store: SQLStore, clock: FakeClock, which: str, status: str
) -> None:
    """The status column carries no seal: given the keyring, the report counts an approval whose
    status contradicts its sealed denial (denied with none, pending with one) or is no status at
    all under mode "unverified", as the audit reports it (`status_tampered`), never shadow or live."""
    keyring = Keyring.generate()
    denied_id, _, _ = ledger(store, keyring, clock)
    [shadow] = [a for a in store.approvals() if a.tool == "pay_shadow"]
    target = denied_id if which == "denied" else shadow.id
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :id"), {"s": status, "id": target}
        )
    after = figures(store, keyring=keyring)
    assert after.unverified == 1
    tool = "pay" if which == "denied" else "pay_shadow"
    calls = {(r.key, r.mode): r.decided + r.undecided for r in after.by_tool if r.key == tool}
    assert calls.pop((tool, "unverified")) == 1
    assert sum(calls.values()) == (1 if which == "denied" else 0)  # only the untouched ones
    assert split(disagreement(store, keyring=keyring)) == split(after.by_tool)
