"""Webhook options a retry schedule cannot use are refused when the notifier is built.

A negative or non-finite `backoff` or `max_backoff` used to be accepted and then failed every
retried delivery as "internal: ValueError" (the clock refuses a negative sleep), after the first
attempt had already been made: the page that a retry would have delivered was lost."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
import respx

from effectgate.notify import WebhookNotifier

from .conftest import URL, MakeNotifier, Notification


@pytest.mark.parametrize(
    "options",
    [
        {"backoff": -1.0},
        {"max_backoff": -5.0},
        {"backoff": math.nan},
        {"max_backoff": math.inf},
        {"timeout": 0},
        {"timeout": -1.0},
    ],
)
def test_unusable_schedule_is_refused_at_construction(
    make_notifier: MakeNotifier, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        make_notifier(**options)


def test_a_retry_after_a_503_is_delivered_with_zero_backoff(
    make_notifier: MakeNotifier, router: respx.MockRouter, notice: Notification
) -> None:
    route = router.post(URL).mock(side_effect=[httpx.Response(503), httpx.Response(200)])
    notifier: WebhookNotifier = make_notifier(backoff=0.0, attempts=2)
    delivery = notifier.deliver(notice)
    assert route.call_count == 2
    assert delivery.delivered
    assert delivery.waits == (0.0,)
