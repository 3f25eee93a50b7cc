"""Round 16 of the notifier review: what close() leaves to a worker still delivering.

Threads are ordered with events, never with sleeps; the webhook is a respx route (the notifier's
own client, as in production)."""

from __future__ import annotations

import threading

import httpx
import respx

from effectgate import Keyring
from effectgate.notify import Notification, WebhookNotifier
from effectgate.testing import FakeClock

from .conftest import URL


def _notice(clock: FakeClock, recorded: list[str], key: str) -> Notification:
    return Notification(
        kind="needs_reconciliation",
        tool="pay",
        approver_role="finance",
        at=clock.now(),
        key=key,
        reason="lost",
        record=lambda kind, detail: recorded.append(f"{kind} {detail.get('error', '')}".strip()),
    )


def test_notices_left_to_a_worker_after_close_timeout_are_still_delivered(
    router: respx.MockRouter, clock: FakeClock, ring: Keyring
) -> None:
    """close(timeout) returned while a slow webhook held the first notice, and closed the
    notifier's own HTTP client under the worker: the notice in flight and the one queued behind it
    ended `webhook_failed` ("the client has been closed"), though the docstring says a worker still
    delivering ends once the queue is drained. Both reach the webhook and are recorded delivered."""
    entered, release = threading.Event(), threading.Event()
    received: list[str] = []

    def slow(request: httpx.Request) -> httpx.Response:
        received.append(request.headers["x-effectgate-delivery"])
        entered.set()
        release.wait(30)
        return httpx.Response(200)

    router.post(URL).mock(side_effect=slow)
    recorded: list[str] = []
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False, attempts=1)
    hook(_notice(clock, recorded, "k1"))
    assert entered.wait(10), "the delivery never started"
    hook(_notice(clock, recorded, "k2"))
    hook.close(timeout=0)  # returns at once: the worker is still delivering k1
    worker = hook._worker
    release.set()
    assert worker is not None
    worker.join(30)
    assert not worker.is_alive()
    assert recorded == ["webhook_delivered", "webhook_delivered"]
    assert len(received) == 2
    assert hook._client.is_closed  # the worker closed it once the queue was drained


def test_close_still_closes_its_own_client(router: respx.MockRouter, clock: FakeClock, ring: Keyring) -> None:
    """A notifier closed after its worker drained, or one that never started a worker, closes
    the client it made; a client given is left to its owner."""
    router.post(URL).mock(return_value=httpx.Response(200))
    recorded: list[str] = []
    drained = WebhookNotifier(URL, keyring=ring, clock=clock, jitter=False)
    drained(_notice(clock, recorded, "k1"))
    drained.close()
    idle = WebhookNotifier(URL, keyring=ring, clock=clock)
    idle.close()
    given = httpx.Client()
    owned_elsewhere = WebhookNotifier(URL, keyring=ring, clock=clock, client=given)
    owned_elsewhere(_notice(clock, recorded, "k2"))
    owned_elsewhere.close()
    assert recorded == ["webhook_delivered", "webhook_delivered"]
    assert drained._client.is_closed
    assert idle._client.is_closed
    assert not given.is_closed
    given.close()
