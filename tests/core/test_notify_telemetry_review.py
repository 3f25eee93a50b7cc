"""Review of notices, spans and the gate's logging: a notice about a record that does not verify
is routed by the table, never by the edited row; a log handler or filter that raises changes
nothing the gate returns, records or announces."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import pytest
import sqlalchemy as sa
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span, SpanProcessor, TracerProvider

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate._leases import LeaseKeeper
from effectgate._readlog import ReadLog
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import Notification
from effectgate.stores import SQLStore
from effectgate.stores.protocol import Store
from effectgate.testing import FakeClock

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
SUPPORT_LEAD = Approver("sam", "support_lead")
EMAIL = {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}


class Hook:
    def __init__(self) -> None:
        self.seen: list[Notification] = []

    def __call__(self, notice: Notification) -> None:
        self.seen.append(notice)


class Raising(logging.Handler):
    """A handler whose `emit` raises (a careless network handler): Python passes that to the caller."""

    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("log shipper is down")


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


@pytest.fixture
def broken_log() -> Iterator[None]:
    """Every record of the `effectgate` loggers, at any level, reaches a handler that raises."""
    logger = logging.getLogger("effectgate")
    handler, level = Raising(level=logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield
    logger.removeHandler(handler)
    logger.setLevel(level)


def edit_role(store: SQLStore, approval_id: str, role: str) -> None:
    with store.transaction() as conn:  # behind effectgate's back
        update = sa.text("UPDATE eg_approvals SET approver_role = :r WHERE id = :id")
        conn.execute(update, {"r": role, "id": approval_id})


def crashed_email(gate: EffectGate, store: SQLStore, clock: FakeClock) -> str:
    """An approved email whose worker claimed the key and died: its approval id."""
    out = gate.call("send_email", EMAIL, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=SUPPORT_LEAD)
    assert isinstance(grant, Grant)
    row = store.get_approval(out.approval_id)
    assert row is not None
    store.claim(f"eg_{out.approval_id}_v1", row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    return out.approval_id


# -- routing: by the table, never by an edited row


def test_an_expiry_warning_of_an_edited_row_goes_to_the_tables_role(
    gate: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook
) -> None:
    """A pending refund whose approver_role was edited in the database to 'intern': its expiry
    warning goes to finance (the table's approver role), not to the role the edit names."""
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    edit_role(store, out.approval_id, "intern")
    row = store.get_approval(out.approval_id)
    assert row is not None
    clock.advance(row.expires_at - clock.now() - 60)
    [card] = gate.warn_expiring(within=900)
    assert card.approval_id == out.approval_id
    notice = hook.seen[-1]
    assert notice.kind == "expiring"
    assert notice.approver_role == "finance"


def test_a_recovered_edited_row_pages_the_tables_role(
    gate: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook
) -> None:
    """An in-flight email whose approval row was edited to name 'intern': recover() pages
    support_lead (the table's approver role of send_email), the notice says it does not verify."""
    approval_id = crashed_email(gate, store, clock)
    edit_role(store, approval_id, "intern")
    assert len(gate.recover()) == 1
    notice = hook.seen[-1]
    assert (notice.kind, notice.approval_id, notice.intact) == ("needs_reconciliation", approval_id, False)
    assert notice.approver_role == "support_lead"


def test_an_intact_recovered_row_still_pages_its_own_role(
    gate: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook
) -> None:
    """The untouched row's sealed role is still the one paged."""
    approval_id = crashed_email(gate, store, clock)
    assert len(gate.recover()) == 1
    notice = hook.seen[-1]
    assert (notice.approval_id, notice.intact, notice.approver_role) == (approval_id, True, "support_lead")


# -- a raising log handler changes nothing


def test_a_raising_log_handler_loses_no_recovered_notice(
    gate: EffectGate, store: SQLStore, clock: FakeClock, hook: Hook, broken_log: None
) -> None:
    """recover() under a log handler that raises: the in-flight record is still recorded as
    needs_reconciliation and its approver paged (the expired lease is not picked up again)."""
    approval_id = crashed_email(gate, store, clock)
    assert gate.recover() == [f"eg_{approval_id}_v1"]
    assert [e.approval_id for e in store.events(kind="needs_reconciliation")] == [approval_id]
    assert [(n.kind, n.approval_id) for n in hook.seen][-1] == ("needs_reconciliation", approval_id)


def test_a_raising_log_handler_changes_no_proposal_or_notice(
    gate: EffectGate, store: SQLStore, hook: Hook, broken_log: None
) -> None:
    """A proposal under a raising handler returns its Pending and announces it once."""
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    assert [(n.kind, n.approval_id) for n in hook.seen] == [("pending", out.approval_id)]


def test_a_raising_log_handler_changes_no_execution(
    gate: EffectGate, shop: Shop, hook: Hook, broken_log: None
) -> None:
    """Approve and execute under a raising handler: a Grant, one refund, an Executed."""
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    executed = gate.execute(grant.token)
    assert isinstance(executed, Executed)
    assert shop.receiver.count("refund") == 1


def test_a_raising_log_handler_loses_no_unknown_outcome_page(
    gate: EffectGate, shop: Shop, store: SQLStore, hook: Hook, broken_log: None
) -> None:
    """A provider timeout under a raising handler: NeedsReconciliation (not the handler's error),
    one refund, and finance paged."""
    out = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert shop.receiver.count("refund") == 1
    assert [(n.kind, n.approver_role) for n in hook.seen][-1] == ("needs_reconciliation", "finance")


class StartFails(SpanProcessor):
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        raise RuntimeError("span processor broke on start")


def test_a_raising_span_processor_under_a_raising_log_handler_changes_no_outcome(
    store: SQLStore, clock: FakeClock, shop: Shop, broken_log: None
) -> None:
    """The telemetry failure is logged at DEBUG; a handler that raises on that record does not
    turn the span's failure into the call's."""
    provider = TracerProvider()
    provider.add_span_processor(StartFails())
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop, tracer_provider=provider)
    try:
        read = gate.call("get_order", {"order_id": "1042"}, context("m1"))
        assert isinstance(read, Executed)
    finally:
        gate.close()


class DownStore:
    """A store whose lease renewal fails (the database unreachable)."""

    concurrent = True

    def renew_lease(self, key: str, owner: str, *, lease_seconds: float) -> bool:
        raise ConnectionError("database unreachable")


def test_a_raising_log_handler_does_not_stop_lease_renewal(broken_log: None) -> None:
    """A failed renewal is logged and tried again at the next beat: a handler that raises on that
    warning must not end the beat (in the keeper's thread, the thread itself, so that no lease
    of a running tool is renewed again and recover() takes over a tool that is still running)."""
    keeper = LeaseKeeper(cast(Store, DownStore()), lease_seconds=3000)  # no beat of its own here
    keeper.hold("k1", "owner-1")
    try:
        assert keeper.beat() == []
        assert keeper.beat() == []  # still held: tried again
    finally:
        keeper.close()


class BlipStore:
    """A store whose read-record writes fail; the second failure stops the writer's loop."""

    def __init__(self) -> None:
        self.readlog: ReadLog | None = None
        self.attempts = 0

    @contextmanager
    def transaction(self) -> Iterator[object]:
        self.attempts += 1
        if self.attempts == 2 and self.readlog is not None:
            self.readlog._wake = threading.Event()  # what close() does: this loop ends
        raise ConnectionError("database unreachable")
        yield  # pragma: no cover


def test_a_raising_log_handler_does_not_end_the_read_record_writer(broken_log: None) -> None:
    """A failed write of read records is logged and tried again at the next round: a handler that
    raises on that warning must not end the writer (its records would then wait, unwritten,
    until close())."""
    store = BlipStore()
    readlog = ReadLog(cast(Store, store), interval=0)
    store.readlog = readlog
    readlog._items.append(("a read",))
    readlog._run(readlog._wake)  # the writer thread's loop, here in the test's thread
    assert store.attempts == 2  # tried again after the first failure
    assert list(readlog._items) == [("a read",)]  # still buffered
