"""Round 18: notifications (`effectgate.notify`, the gate's notices) and the report
(`effectgate.report`) against rows edited in the database. Each store test runs on SQLite and
PostgreSQL (`shop_gate` on `store`); the clock is injected, nothing sleeps."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import respx
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Keyring, Pending
from effectgate.audit import audit
from effectgate.examples.shop import app, context
from effectgate.notify import Notification, WebhookNotifier, message
from effectgate.report import figures, render_html
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_round11_report import decided_after, edit


def sqlite_only(gate: EffectGate) -> None:
    assert isinstance(gate.store, SQLStore)
    if gate.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a value of another type in a float column")


@pytest.mark.parametrize("edited", ["soon", b"\xff"])
def test_a_decision_time_kept_as_text_is_no_latency_in_the_report(
    shop_gate: ShopGate, clock: FakeClock, edited: object
) -> None:
    """A refund decided after 5 s. SQLite keeps a decided_at edited into text (or a blob) as
    such, and its arithmetic reads it as 0: the report counted the approval as decided with a
    latency of minus its creation time (about -1.8e9 s), a time no clock gives, and gave that as
    finance's p95. The audit leaves a time that is not a number out; the report (round 29) reads
    no such column: the decision's append-only record gives its 5 s."""
    _, gate = shop_gate
    sqlite_only(gate)
    [approval_id] = decided_after(gate, clock, (5,))
    edit(gate, "decided_at", edited, approval_id)
    audited = audit(gate.store, keyring=gate.keyring).metrics
    assert audited is not None
    assert audited.approval_latency_p95_s is None
    for keyring in (None, gate.keyring):
        report = figures(gate.store, targets={"finance": 300}, keyring=keyring)
        assert report.metrics.latency_p95_s == {"finance": 5.0}
        assert [(r.mode, r.decided) for r in report.by_tool] == [("live", 1)]
        assert "e+09" not in render_html(report)


def test_a_decision_time_kept_as_text_moves_no_rank(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Nineteen refunds decided after 1..19 s and one after 3 s: the p95 (nearest rank 19 of 20)
    is 18 s. The last one's decided_at edited into text moves nothing (its -1.8e9 s latency once
    sorted first; round 29: the rank and the value come from the decisions' records)."""
    _, gate = shop_gate
    sqlite_only(gate)
    *_, last = decided_after(gate, clock, (*range(1, 20), 3))
    assert figures(gate.store, keyring=gate.keyring).metrics.latency_p95_s == {"finance": 18.0}
    edit(gate, "decided_at", "later", last)
    report = figures(gate.store, keyring=gate.keyring)
    assert report.metrics.latency_p95_s == {"finance": 18.0}


# -- notices of unknown outcomes


class Hook:
    def __init__(self) -> None:
        self.seen: list[Notification] = []

    def __call__(self, notice: Notification) -> None:
        self.seen.append(notice)


def test_a_recovered_operation_whose_approval_row_is_gone_is_not_announced_as_a_write(
    store: SQLStore, clock: FakeClock
) -> None:
    """An approved email whose worker claimed its key and died; its approval row is then deleted
    in the database. `recover` found no row for the key's approval and announced the unknown
    outcome as a write's (`intact` None: "there is no approval"), with no approval id and an
    empty tool: a receiver reads that as a write with nothing to verify. The key names an
    approval, whose record cannot be verified: the notice must say so (`intact` False, the
    fixed "does not verify" headline) and name the approval the key names."""
    hook, older = Hook(), []
    gate = app(
        store, keyring=Keyring.generate(), clock=clock, notify=hook, on_needs_reconciliation=older.append
    )
    try:
        out = gate.call(
            "send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}, context("m1")
        )
        assert isinstance(out, Pending)
        assert isinstance(
            gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead")), Grant
        )
        row = store.get_approval(out.approval_id)
        assert row is not None
        key = f"eg_{out.approval_id}_v1"
        store.claim(key, row.args_hash, lease_seconds=gate.policy.lease_seconds)
        clock.advance(gate.policy.lease_seconds + 1)
        with store.engine.begin() as conn:  # behind effectgate's back
            conn.execute(sa.text("DELETE FROM eg_approvals WHERE id = :id"), {"id": out.approval_id})
        assert gate.recover() == [key]
    finally:
        gate.close()
    *_, notice = hook.seen  # the "pending" notice first
    assert (notice.kind, notice.key, notice.approval_id) == ("needs_reconciliation", key, out.approval_id)
    assert notice.intact is False
    body = message(notice, inbox_url=None, now=clock.now())
    assert body["metadata"]["event_payload"]["intact"] is False
    assert "does not verify; do not act on it" in body["blocks"][0]["text"]["text"]
    assert [(n.approval_id, n.intact) for n in older] == [(out.approval_id, False)]
    assert store.get(key).status == "needs_reconciliation"


# -- webhooks about records that do not verify

URL = "https://hooks.example.test/T1"


@pytest.fixture
def webhook(clock: FakeClock) -> Iterator[tuple[WebhookNotifier, list[httpx.Request]]]:
    """A notifier delivering in the caller's thread to a mocked webhook, and what it received."""
    received: list[httpx.Request] = []
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        router.post(URL).mock(side_effect=lambda r: received.append(r) or httpx.Response(200))
        notifier = WebhookNotifier(
            URL, keyring=Keyring.generate("wh1"), clock=clock, jitter=False, background=False
        )
        yield notifier, received
        notifier.close(timeout=15)


@pytest.mark.parametrize("column", ["tool", "version", "args_hash"])
def test_an_expiry_notice_of_a_record_edited_into_a_blob_is_delivered_as_unverified(
    store: SQLStore, clock: FakeClock, webhook: tuple[WebhookNotifier, list[httpx.Request]], column: str
) -> None:
    """A pending email whose sealed `column` is edited into a blob (SQLite keeps it as bytes):
    `warn_expiring` warns about it as a record that does not verify, but the webhook's payload
    carried the raw bytes (its tool, version or args hash), `json.dumps` refused them, and the
    page was recorded as `webhook_failed` ("render: TypeError") and never sent: a tampered
    approval about to lapse went unannounced. It must reach the receiver, saying `intact` false."""
    notifier, received = webhook
    gate = app(store, keyring=Keyring.generate(), clock=clock, notify=notifier)
    try:
        if gate.store.engine.dialect.name != "sqlite":
            pytest.skip("PostgreSQL refuses a blob in a text or integer column")
        out = gate.call("send_email", {"to": ["a@example.com"], "subject": "Hi", "body": "x"}, context("m"))
        assert isinstance(out, Pending)
        edit(gate, column, b"\xff", out.approval_id)
        clock.advance(gate.policy.pending_ttl - 60)
        assert len(gate.warn_expiring(within=120)) == 1
    finally:
        gate.close()
    assert [e.detail_json for e in store.events(kind="webhook_failed")] == []
    _, expiring = (json.loads(r.content) for r in received)  # "pending", then "expiring"
    payload = expiring["metadata"]["event_payload"]
    assert (payload["kind"], payload["approval_id"], payload["intact"]) == (
        "expiring",
        out.approval_id,
        False,
    )
    assert "does not verify; do not act on it" in expiring["text"]


def test_an_unknown_outcome_of_a_record_edited_into_a_blob_is_delivered_as_unverified(
    store: SQLStore, clock: FakeClock, webhook: tuple[WebhookNotifier, list[httpx.Request]]
) -> None:
    """As above for `recover`'s page about an email whose worker died in flight, its approval's
    tool edited into a blob: the unknown outcome must be announced (`intact` false), not lost
    to a payload `json.dumps` refuses."""
    notifier, received = webhook
    gate = app(store, keyring=Keyring.generate(), clock=clock, notify=notifier)
    try:
        if gate.store.engine.dialect.name != "sqlite":
            pytest.skip("PostgreSQL refuses a blob in a text column")
        out = gate.call("send_email", {"to": ["a@example.com"], "subject": "Hi", "body": "x"}, context("m"))
        assert isinstance(out, Pending)
        assert isinstance(
            gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead")), Grant
        )
        row = store.get_approval(out.approval_id)
        assert row is not None
        key = f"eg_{out.approval_id}_v1"
        store.claim(key, row.args_hash, lease_seconds=gate.policy.lease_seconds)
        clock.advance(gate.policy.lease_seconds + 1)
        edit(gate, "tool", b"\xff", out.approval_id)
        assert gate.recover() == [key]
    finally:
        gate.close()
    assert [e.detail_json for e in store.events(kind="webhook_failed")] == []
    payload = json.loads(received[-1].content)["metadata"]["event_payload"]
    assert (payload["kind"], payload["key"], payload["intact"]) == ("needs_reconciliation", key, False)
