"""Round 4 of the notifier review: delivery ids of distinct pages, and notices racing close().

Receivers are httpx MockTransports that verify every request the way the README's receiver does;
threads are ordered with events, never with sleeps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import NeedsReconciliation, WebhookSignatureError
from effectgate.examples.shop import context
from effectgate.notify import EVENT, Notification, SeenDeliveries, WebhookNotifier, verify_webhook
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import INBOX, URL

FINANCE = Approver("fiona", "finance")


class Bank:
    """A payment whose request can be lost before the provider sees it (outcome unknown)."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.drop = 0

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        if self.drop:
            self.drop -= 1
            raise TimeoutError("connection reset before the request was sent")
        self.receiver.record("pay", idempotency_key=tool_context.idempotency_key, account=account)
        return {"account": account, "amount": amount}

    def lookup(self, key: str) -> Reconciled | None:
        return Reconciled(found=self.receiver.count("pay") > 0)

    def table(self) -> EffectTable:
        spec = ToolSpec(
            name="pay",
            effect=Effect.MONEY,
            fn=self.pay,
            approver_role="finance",
            subject=("account",),
            reconcile=self.lookup,
        )
        table = EffectTable([spec])
        table.allow_all("support")
        return table


class Receiver:
    """A webhook endpoint as the README builds one: every request verified with one
    SeenDeliveries; a replay is answered 200 and not acted on (as `verify_webhook` says)."""

    def __init__(self, ring: Keyring, clock: FakeClock) -> None:
        self.ring, self.clock = ring, clock
        self.seen = SeenDeliveries()
        self.acted: list[str] = []
        self.replayed = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        try:
            verify_webhook(self.ring, request.content, request.headers, now=self.clock.now(), seen=self.seen)
        except WebhookSignatureError as exc:
            if exc.reason != "replayed":
                return httpx.Response(401)
            self.replayed += 1
            return httpx.Response(200)
        self.acted.append(request.headers[EVENT])
        return httpx.Response(200)


@pytest.fixture
def ring() -> Keyring:
    return Keyring.generate("wh4")


def test_a_second_unknown_outcome_of_one_key_is_a_new_page(
    store: SQLStore, clock: FakeClock, ring: Keyring
) -> None:
    """A reconcile that runs the payment again and ends unknown again is a second, distinct page:
    a receiver de-duplicating on the delivery id must still act on it."""
    bank = Bank()
    receiver = Receiver(ring, clock)
    client = httpx.Client(transport=httpx.MockTransport(receiver))
    hook = WebhookNotifier(
        URL, keyring=ring, inbox_url=INBOX, clock=clock, jitter=False, background=False, client=client
    )
    gate = EffectGate(bank.table(), store, keyring=Keyring.generate(), clock=clock, notify=hook)
    try:
        out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        bank.drop = 2
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)
        with pytest.raises(NeedsReconciliation):
            gate.reconcile(grant.approval_id)  # not found: runs again, and is lost again
    finally:
        hook.close()
        gate.close()
    assert bank.receiver.count("pay") == 0
    assert receiver.acted == ["pending", "needs_reconciliation", "needs_reconciliation"]
    assert receiver.replayed == 0
    assert len(store.events(kind="webhook_delivered")) == 3


def test_the_same_unknown_outcome_told_again_is_the_same_page(
    store: SQLStore, clock: FakeClock, ring: Keyring
) -> None:
    """A grant presented again for an operation awaiting reconciliation pages again about the same
    unknown outcome (nothing ran again): the same delivery id, which the receiver drops."""
    bank = Bank()
    receiver = Receiver(ring, clock)
    client = httpx.Client(transport=httpx.MockTransport(receiver))
    hook = WebhookNotifier(
        URL, keyring=ring, inbox_url=INBOX, clock=clock, jitter=False, background=False, client=client
    )
    gate = EffectGate(bank.table(), store, keyring=Keyring.generate(), clock=clock, notify=hook)
    try:
        out = gate.call("pay", {"account": "a1", "amount": 500}, context("m1"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        bank.drop = 1
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)  # the same outcome, told again: no second run
    finally:
        hook.close()
        gate.close()
    assert bank.receiver.count("pay") == 0
    assert receiver.acted == ["pending", "needs_reconciliation"]
    assert receiver.replayed == 1


def test_a_retried_unknown_outcome_keeps_its_delivery_id(clock: FakeClock, ring: Keyring) -> None:
    """The retries of one page (503, then 200) carry one delivery id; a second page of the same key
    carries another."""
    ids: list[str] = []
    answers = iter([503, 200, 200])

    def endpoint(request: httpx.Request) -> httpx.Response:
        ids.append(request.headers["X-Effectgate-Delivery"])
        return httpx.Response(next(answers))

    client = httpx.Client(transport=httpx.MockTransport(endpoint))
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False, background=False, client=client)
    base: dict[str, Any] = {"tool": "pay", "approver_role": "finance", "at": clock.now(), "key": "k1"}
    first = Notification(kind="needs_reconciliation", reason="lost", nonce="n1", **base)
    second = Notification(kind="needs_reconciliation", reason="lost", nonce="n2", **base)
    assert hook.deliver(first).delivered
    assert hook.deliver(second).delivered
    assert ids[0] == ids[1] != ids[2]


# -- racing close()


class Tap:
    """A transport answering 200 and counting what reached the receiver."""

    def __init__(self) -> None:
        self.received = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.received += 1
        return httpx.Response(200)


def webhook_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "effectgate-webhook" and t.is_alive()]


@pytest.fixture
def no_leftover_worker() -> Iterator[None]:
    before = set(webhook_threads())
    yield
    left = set(webhook_threads()) - before
    for thread in left:
        thread.join(5)  # a worker draining its queue after close() ends on its own
    assert [t for t in left if t.is_alive()] == [], "a delivery thread outlived close()"


def notice(clock: FakeClock, recorded: list[str], key: str) -> Notification:
    return Notification(
        kind="needs_reconciliation",
        tool="pay",
        approver_role="finance",
        at=clock.now(),
        key=key,
        reason="lost",
        record=lambda kind, detail: recorded.append(kind),
    )


class _ClosingQueue:
    """Wraps the notifier's queue: the first `put_nowait` of a notice first lets a concurrent
    close() run as far as it can (to its end, or until it waits for the notifier's lock)."""

    def __init__(self, notifier: WebhookNotifier) -> None:
        self.inner = notifier._queue
        self.notifier = notifier
        self.progress = threading.Event()
        self.closer: threading.Thread | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_nowait(self, item: Any) -> None:
        if self.closer is None and isinstance(item, Notification):

            def close() -> None:
                self.notifier.close(timeout=10)
                self.progress.set()

            self.closer = threading.Thread(target=close)
            self.closer.start()
            assert self.progress.wait(10), "close() neither finished nor waited"
        self.inner.put_nowait(item)


class _SpyLock:
    """The notifier's lock, telling the test when a thread waits for it."""

    def __init__(self, waiting: threading.Event) -> None:
        self.lock = threading.Lock()
        self.waiting = waiting
        self.holder: int | None = None

    def __enter__(self) -> bool:
        if self.holder is not None and self.holder != threading.get_ident():
            self.waiting.set()
        self.lock.acquire()
        self.holder = threading.get_ident()
        return True

    def __exit__(self, *exc: object) -> None:
        self.holder = None
        self.lock.release()


@pytest.mark.parametrize("started", [True, False], ids=["worker-running", "no-worker-yet"])
def test_a_notice_racing_close_is_delivered_or_recorded_dropped(
    started: bool, clock: FakeClock, ring: Keyring, no_leftover_worker: None
) -> None:
    """close() running between a notice's closed-check and its queueing: the notice is delivered
    (close drains it) or recorded as dropped, never left in the queue unrecorded; flush() does not
    wait forever and no delivery thread is left behind."""
    tap = Tap()
    recorded: list[str] = []
    client = httpx.Client(transport=httpx.MockTransport(tap))
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False, client=client)
    if started:
        hook(notice(clock, recorded, "k0"))
        assert hook.flush(timeout=10)
    racing = _ClosingQueue(hook)
    hook._lock = _SpyLock(racing.progress)  # type: ignore[assignment]
    hook._queue = racing  # type: ignore[assignment]
    hook(notice(clock, recorded, "k1"))
    assert racing.closer is not None
    racing.closer.join(10)
    assert not racing.closer.is_alive(), "close() hangs"
    assert hook.flush(timeout=5), "a notice was left in the queue of a stopped notifier"
    assert recorded in (
        ["webhook_delivered"] * (int(started) + 1),
        ["webhook_delivered"] * int(started) + ["webhook_dropped"],
    )
    assert tap.received == recorded.count("webhook_delivered")


def test_close_returns_within_its_timeout_when_the_queue_is_full(
    clock: FakeClock, ring: Keyring, no_leftover_worker: None
) -> None:
    """A hanging webhook and a full queue: close(timeout) still returns (it used to block forever
    putting its stop marker into the full queue); what was queued still ends recorded."""
    entered, release = threading.Event(), threading.Event()
    recorded: list[str] = []

    def stuck(request: httpx.Request) -> httpx.Response:
        entered.set()
        release.wait(30)
        return httpx.Response(200)

    client = httpx.Client(transport=httpx.MockTransport(stuck))
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False, client=client, queue_size=1)
    closer = threading.Thread(target=hook.close, kwargs={"timeout": 0})
    try:
        hook(notice(clock, recorded, "k1"))
        assert entered.wait(10), "the delivery never started"
        hook(notice(clock, recorded, "k2"))  # fills the queue
        hook(notice(clock, recorded, "k3"))  # dropped: queue full
        assert recorded == ["webhook_dropped"]
        closer.start()
        closer.join(10)
        closed_in_time = not closer.is_alive()
    finally:
        release.set()
    closer.join(30)
    assert hook.flush(timeout=30)
    assert closed_in_time, "close(timeout=0) blocked on a full queue"
    assert sorted(recorded) == ["webhook_delivered", "webhook_delivered", "webhook_dropped"]
