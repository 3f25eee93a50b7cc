"""Notifications from the gate: a new approval, an approval about to lapse, needs_reconciliation;
each built from the stored record, each sent once, and a failing hook never breaks a call."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Keyring, Pending, ReconciliationNotice
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import Notification, message
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
DAY = 24 * 3600.0


class Hook:
    """Collects notices; a test may make it raise."""

    def __init__(self) -> None:
        self.seen: list[Notification] = []
        self.fail = False

    def __call__(self, notice: Notification) -> None:
        self.seen.append(notice)
        if self.fail:
            raise RuntimeError("pager is down")

    def kinds(self) -> list[tuple[str, str | None, int | None]]:
        return [(n.kind, n.approval_id, n.version) for n in self.seen]


@pytest.fixture
def hook() -> Hook:
    return Hook()


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, shop: Shop, hook: Hook) -> Iterator[EffectGate]:
    g = app(store, keyring=Keyring.generate(), clock=clock, shop=shop, notify=hook)
    yield g
    g.close()


def propose(gate: EffectGate, args: dict[str, Any] = REFUND, message: str = "m3") -> Pending:
    out = gate.call("refund_order", args, context(message))
    assert isinstance(out, Pending), out
    return out


def test_new_approval_notifies_once_with_the_stored_card(gate: EffectGate, hook: Hook) -> None:
    """A new pending approval sends one notice whose card is the stored record; a replay sends none."""
    out = propose(gate)
    propose(gate)  # the same message again: a replay
    [notice] = hook.seen
    assert (notice.kind, notice.approval_id, notice.version) == ("pending", out.approval_id, 1)
    assert notice.approver_role == "finance"
    assert notice.card == gate.card(out.approval_id)
    assert notice.card is not None
    assert notice.card.args == REFUND


def test_amendment_notifies_its_new_version(gate: EffectGate, hook: Hook) -> None:
    """A later message that amends the arguments is a new version to decide: one more notice."""
    first = propose(gate, message="m3")
    second = propose(gate, {**REFUND, "amount": 6000}, message="m5")
    assert hook.kinds() == [("pending", first.approval_id, 1), ("pending", first.approval_id, 2)]
    assert second.version == 2


def test_reads_writes_and_refusals_notify_nobody(gate: EffectGate, hook: Hook, shop: Shop) -> None:
    """Only decisions page people: a read, a write, an unknown tool and a bad argument send nothing."""
    gate.call("get_order", {"order_id": "1042"}, context("m1"))
    gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["refund"]}, context("m2"))
    gate.call("drop_tables", {}, context("m3"))
    gate.call("refund_order", {"order_id": "1042"}, context("m4"))
    assert shop.receiver.count("ticket_tags") == 1
    assert hook.seen == []


def test_failing_hook_is_recorded_and_the_call_stands(gate: EffectGate, hook: Hook, store: SQLStore) -> None:
    """A hook that raises is recorded as notify_failed; the call still returns Pending, stored as such."""
    hook.fail = True
    out = propose(gate)
    [event] = store.events(kind="notify_failed")
    assert (event.approval_id, event.version) == (out.approval_id, 1)
    assert "pager is down" in json.loads(event.detail_json)["error"]
    row = store.get_approval(out.approval_id)
    assert row is not None
    assert row.status == "pending"


def test_every_hook_of_a_sequence_is_called(store: SQLStore, clock: FakeClock) -> None:
    """`notify=[a, b]` calls both, and one raising does not keep the other from its notice."""
    first, second = Hook(), Hook()
    first.fail = True
    gate = app(store, keyring=Keyring.generate(), clock=clock, notify=[first, second])
    try:
        propose(gate)
    finally:
        gate.close()
    assert [n.kind for n in first.seen] == [n.kind for n in second.seen] == ["pending"]


def test_record_appends_an_event_about_the_notice(gate: EffectGate, hook: Hook, store: SQLStore) -> None:
    """`notice.record(kind, detail)` logs an event bound to the notice's approval and version."""
    out = propose(gate)
    hook.seen[0].record("webhook_delivered", {"attempts": 1})
    [event] = store.events(kind="webhook_delivered")
    assert (event.approval_id, event.version, event.tool) == (out.approval_id, 1, "refund_order")
    assert json.loads(event.detail_json)["attempts"] == 1


# -- approvals about to expire


def test_expiry_warning_is_sent_once_inside_the_window(
    gate: EffectGate, hook: Hook, clock: FakeClock, store: SQLStore
) -> None:
    """warn_expiring sends nothing early, one notice inside the window, and nothing on a second scan."""
    out = propose(gate)
    hook.seen.clear()
    assert gate.warn_expiring(within=900) == []
    clock.advance(DAY - 600)
    [card] = gate.warn_expiring(within=900)
    assert card.approval_id == out.approval_id
    assert gate.warn_expiring(within=900) == []
    assert hook.kinds() == [("expiring", out.approval_id, 1)]
    [event] = store.events(kind="expiry_warning")
    assert json.loads(event.detail_json)["seconds_left"] == 600


def test_expiry_warning_skips_decided_and_lapsed_approvals(
    gate: EffectGate, hook: Hook, clock: FakeClock
) -> None:
    """An approved approval and one already past its deadline get no warning."""
    approved = propose(gate, message="m3")
    grant = gate.approve(approved.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    lapsed = gate.call("refund_order", {**REFUND, "order_id": "1043", "amount": 3500}, context("m9"))
    assert isinstance(lapsed, Pending)
    hook.seen.clear()
    clock.advance(DAY + 1)
    assert gate.warn_expiring(within=900) == []
    assert hook.seen == []
    assert gate.card(lapsed.approval_id).status == "expired"


def test_amended_version_gets_its_own_warning(gate: EffectGate, hook: Hook, clock: FakeClock) -> None:
    """A warning is per version: the amendment, with its new deadline, is warned about again."""
    out = propose(gate, message="m3")
    clock.advance(DAY - 600)
    gate.warn_expiring(within=900)
    propose(gate, {**REFUND, "amount": 6000}, message="m5")  # version 2, a fresh deadline
    assert gate.warn_expiring(within=900) == []
    clock.advance(DAY - 600)
    [card] = gate.warn_expiring(within=900)
    assert card.version == 2
    assert [k for k in hook.kinds() if k[0] == "expiring"] == [
        ("expiring", out.approval_id, 1),
        ("expiring", out.approval_id, 2),
    ]


def test_racing_scans_warn_once(store: SQLStore, clock: FakeClock) -> None:
    """Four gates on one database scanning at once record and send exactly one warning."""
    hooks = [Hook() for _ in range(4)]
    gates = [app(store, keyring=Keyring.generate(), clock=clock, notify=h) for h in hooks]
    try:
        propose(gates[0])
        clock.advance(DAY - 600)
        barrier = threading.Barrier(len(gates))
        errors: list[BaseException] = []

        def scan(g: EffectGate) -> None:
            try:
                barrier.wait()
                g.warn_expiring(within=900)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=scan, args=(g,)) for g in gates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
    finally:
        for g in gates:
            g.close()
    assert sum(1 for h in hooks for n in h.seen if n.kind == "expiring") == 1
    assert len(store.events(kind="expiry_warning")) == 1


def test_warn_expiring_needs_a_positive_window(gate: EffectGate) -> None:
    """A zero or negative window is a caller error, not an empty scan."""
    with pytest.raises(ValueError, match="positive"):
        gate.warn_expiring(within=0)


# -- needs_reconciliation


@pytest.fixture
def older() -> list[ReconciliationNotice]:
    """What the older `on_needs_reconciliation` hook of `paging` received."""
    return []


@pytest.fixture
def paging(
    store: SQLStore, clock: FakeClock, shop: Shop, hook: Hook, older: list[ReconciliationNotice]
) -> Iterator[EffectGate]:
    """A gate that pages through `hook` and, as well, the older hook (into `older`)."""
    gate = app(
        store,
        keyring=Keyring.generate(),
        clock=clock,
        shop=shop,
        notify=hook,
        on_needs_reconciliation=older.append,
    )
    yield gate
    gate.close()


def test_needs_reconciliation_pages_the_approver_role(
    paging: EffectGate, shop: Shop, hook: Hook, older: list[ReconciliationNotice]
) -> None:
    """A provider timeout sends a needs_reconciliation notice to finance with the key and provider ref,
    and the older on_needs_reconciliation hook still gets its notice."""
    out = propose(paging)
    grant = paging.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paging.execute(grant.token)
    notice = hook.seen[-1]
    assert (notice.kind, notice.approval_id, notice.version) == ("needs_reconciliation", out.approval_id, 1)
    assert (notice.approver_role, notice.key, notice.provider_ref) == (
        "finance",
        f"eg_{out.approval_id}_v1",
        "re_1",
    )
    assert [n.key for n in older] == [notice.key]
    assert shop.receiver.count("refund") == 1


def crashed_email(gate: EffectGate, store: SQLStore, clock: FakeClock) -> str:
    """An approved email whose worker claimed the key and died (no reconcile hook): its approval id."""
    out = gate.call("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead"))
    assert isinstance(grant, Grant)
    row = store.get_approval(out.approval_id)
    assert row is not None
    store.claim(f"eg_{out.approval_id}_v1", row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    return out.approval_id


def recovered_notice(gate: EffectGate, hook: Hook, older: list[ReconciliationNotice]) -> Notification:
    """The needs_reconciliation notice `recover` sent (the older hook got one too)."""
    assert len(gate.recover()) == 1
    notice = hook.seen[-1]
    assert notice.kind == "needs_reconciliation"
    assert [n.approval_id for n in older] == [notice.approval_id]
    return notice


def test_a_recovered_intact_record_is_announced_as_intact(
    paging: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook, older: list[ReconciliationNotice]
) -> None:
    """recover() verifies the approval row it read back: an untouched one is announced intact,
    under the usual needs-reconciliation headline."""
    crashed_email(paging, store, clock)
    notice = recovered_notice(paging, hook, older)
    body = message(notice, inbox_url=None, now=clock.now())
    assert body["metadata"]["event_payload"]["intact"] is True
    assert "Needs reconciliation" in body["blocks"][0]["text"]["text"]
    assert notice.intact is True
    assert older[0].intact is True


def test_a_recovered_tampered_record_is_announced_as_unverified(
    paging: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook, older: list[ReconciliationNotice]
) -> None:
    """An approval row edited in the database (its sealed role changed) while its execution was in
    flight is announced by recover() as a record that does not verify: `intact` false and the
    fixed headline, with no name from the record in it."""
    approval_id = crashed_email(paging, store, clock)
    with store.transaction() as conn:  # behind effectgate's back
        conn.execute(
            sa.text("UPDATE eg_approvals SET approver_role = 'intern' WHERE id = :id"),
            {"id": approval_id},
        )
    notice = recovered_notice(paging, hook, older)
    body = message(notice, inbox_url=None, now=clock.now())
    assert body["metadata"]["event_payload"]["intact"] is False
    headline = body["blocks"][0]["text"]["text"]
    assert "does not verify; do not act on it" in headline
    for name in ("intern", "send_email"):
        assert name not in headline
        assert name not in body["text"]
    assert notice.intact is False
    assert older[0].intact is False
