"""Round 7 of the notifier review: a notifier across `os.fork` and at interpreter exit; redirects.

Receivers are httpx MockTransports counting what reached them; threads are ordered with events,
never with sleeps."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest
import respx

from effectgate import Keyring
from effectgate.notify import DELIVERY, Notification, WebhookNotifier
from effectgate.notify._message import delivery_id
from effectgate.stores import SQLStore, open_store
from effectgate.testing import FakeClock

from .conftest import URL, MakeNotifier, Rig, propose


@pytest.fixture
def ring() -> Keyring:
    return Keyring.generate("wh7")


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_delivers_its_own_notices_not_the_parents(clock: FakeClock, ring: Keyring) -> None:
    """A pre-fork worker (the gate and its notifier made before the fork, a delivery under way):
    the child must deliver what it queues itself, once, and not the notices its parent still
    holds (the parent delivers those). Before, the child's queue was a copy of the parent's: it
    sent the parent's queued notice a second time, and its flush() waited for the parent's
    delivery in flight, which never ends in the child."""
    parent = os.getpid()
    entered, release = threading.Event(), threading.Event()
    received: list[str] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        received.append(request.headers[DELIVERY])
        if os.getpid() == parent and len(received) == 1:
            entered.set()
            release.wait(30)
        return httpx.Response(200)

    client = httpx.Client(transport=httpx.MockTransport(receiver))
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False, client=client)
    recorded: list[str] = []
    first, queued, own = (notice(clock, recorded, k) for k in ("k1", "k2", "k3"))
    try:
        hook(first)
        assert entered.wait(10), "the first delivery never started"
        hook(queued)  # waits behind the first, in the parent's queue
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                received.clear()
                hook(own)
                flushed = hook.flush(timeout=10)
                code = 0 if flushed and received == [delivery_id(own)] else 1 if not flushed else 2
            finally:
                sys.stdout.flush()
                os._exit(code)  # as multiprocessing's forked workers end: no atexit
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        hook.close(timeout=10)
    assert os.waitstatus_to_exitcode(status) == 0, "1: flush hung in the child; 2: parent's notice re-sent"
    assert received == [delivery_id(first), delivery_id(queued)]
    assert recorded == ["webhook_delivered", "webhook_delivered"]


# A script that proposes refunds through a gate notifying a background webhook, then ends
# without closing anything: argv is the store's URL and what the webhook does ("answer": 200 at
# once; "hang": the first request never returns).
_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import httpx, respx
    from effectgate import Keyring
    from effectgate.examples.shop import Shop, app, context
    from effectgate.notify import WebhookNotifier, _webhook
    from effectgate.stores import open_store

    url, mode = sys.argv[1], sys.argv[2]
    store = open_store(url)
    store.setup()
    hung = threading.Event()

    def receiver(request):
        if mode == "hang" and not hung.is_set():
            hung.set()
            threading.Event().wait()  # never answers
        return httpx.Response(200)

    respx.mock(assert_all_called=False).__enter__().post("https://hooks.example.test/T1").mock(
        side_effect=receiver
    )
    hook = WebhookNotifier("https://hooks.example.test/T1", keyring=Keyring.generate("wh7"))
    gate = app(store, keyring=Keyring.generate(), shop=Shop(), notify=hook)
    for order in ("1042", "1043"):
        gate.call("refund_order", {"order_id": order, "amount": 100, "currency": "GBP"}, context(order))
    if mode == "hang":
        assert hung.wait(30)
        _webhook.EXIT_TIMEOUT = 0  # what is left at exit is not waited for
    """
)


def _run_and_exit(url: str, mode: str) -> dict[str, list[str]]:
    """Run the script to its end; the webhook events recorded per approval."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, url, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    store = open_store(url)
    try:
        kinds: dict[str, list[str]] = {a.id: [] for a in store.approvals()}
        for event in store.events():
            if event.kind.startswith("webhook_") and event.approval_id in kinds:
                kinds[event.approval_id].append(event.kind)
    finally:
        store.close()
    return kinds


def test_notices_queued_at_exit_are_delivered(sqlite_url: str) -> None:
    """A script proposes and ends without closing its notifier: each approval's notice must
    still reach the webhook (recorded delivered). Before, the daemon worker was stopped with the
    interpreter: the approvers were never told, and nothing recorded that (the module promises
    each notice ends as one event: delivered, failed or dropped)."""
    kinds = _run_and_exit(sqlite_url, "answer")
    assert len(kinds) == 2
    assert sorted(kinds.values()) == [["webhook_delivered"], ["webhook_delivered"]]


def test_a_notice_still_queued_at_exit_is_recorded_dropped(sqlite_url: str) -> None:
    """A webhook that never answers and a notice queued behind it at exit: the notice that could
    not be sent is recorded as dropped, never lost without a trace."""
    kinds = _run_and_exit(sqlite_url, "hang")
    assert sorted(kinds.values()) == [[], ["webhook_dropped"]]  # the first is still in flight


def test_a_redirect_to_another_host_is_not_followed(
    notice: Notification, make_notifier: MakeNotifier, router: respx.MockRouter, store: SQLStore
) -> None:
    """A 3xx answer is final and recorded as failed: the signed message (which names the
    approval and links to its card) never goes to the host the redirect names."""
    elsewhere = "https://elsewhere.example.test/collect"
    route = router.post(URL).mock(return_value=httpx.Response(307, headers={"Location": elsewhere}))
    other = router.post(elsewhere).mock(return_value=httpx.Response(200))
    delivery = make_notifier().deliver(notice)
    assert (route.call_count, other.call_count) == (1, 0)
    assert (delivery.delivered, delivery.statuses) == (False, (307,))
    assert [e.kind for e in store.events() if e.kind.startswith("webhook_")] == ["webhook_failed"]


def test_a_nan_window_warns_about_nothing(
    rig: Rig, router: respx.MockRouter, store: SQLStore, clock: FakeClock
) -> None:
    """`warn_expiring(within=nan)` is refused like a window of 0: on PostgreSQL (NaN sorts above
    every number) it warned about every pending approval, a day before it lapses, and recorded
    each version as warned, so the real warning, near its deadline, was never sent."""
    route = router.post(URL).mock(return_value=httpx.Response(200))
    gate, _ = rig()
    out = propose(gate)
    with pytest.raises(ValueError, match="within"):
        gate.warn_expiring(within=math.nan)
    assert store.events(kind="expiry_warning") == []
    clock.advance(out.card.expires_at - clock.now() - 60)
    assert [c.approval_id for c in gate.warn_expiring(within=300)] == [out.approval_id]
    assert route.call_count == 2  # the proposal's notice, then the one expiring warning
