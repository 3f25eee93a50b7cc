"""Round 16: a notifier written as `async def` was called without being awaited, so every notice
it was given was a coroutine no one ran: nothing delivered, nothing recorded (a RuntimeWarning at
garbage collection at most). It is refused when the gate is made; a plain function that returns
an awaitable has its notice recorded as failed."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest

from effectgate import Keyring
from effectgate.examples.shop import Shop, app
from effectgate.notify import Notification
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import propose


async def deliver(notice: Notification) -> None:  # pragma: no cover - never awaited, by design
    raise AssertionError("an async notifier is never run")


class AsyncHook:
    async def __call__(self, notice: Notification) -> None:  # pragma: no cover - refused
        raise AssertionError("an async notifier is never run")


@pytest.mark.parametrize(
    "hook", [deliver, AsyncHook(), functools.partial(deliver)], ids=["function", "object", "partial"]
)
def test_an_async_notifier_is_refused_when_the_gate_is_made(
    store: SQLStore, clock: FakeClock, hook: Any
) -> None:
    with pytest.raises(TypeError, match="async function"):
        app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=[print, hook])
    with pytest.raises(TypeError, match="on_needs_reconciliation is an async function"):
        app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), on_needs_reconciliation=hook)
    assert store.events() == []  # nothing was proposed or recorded


def test_a_notifier_returning_a_coroutine_is_recorded_as_failed(store: SQLStore, clock: FakeClock) -> None:
    seen: list[Notification] = []
    hooks = [lambda n: deliver(n), seen.append]
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=hooks)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a coroutine left unawaited would warn when collected
            pending = propose(gate)
    finally:
        gate.close()
    assert [n.approval_id for n in seen] == [pending.approval_id]  # the other notifier still got it
    failed = [e for e in store.events() if e.kind == "notify_failed"]
    assert len(failed) == 1
    assert failed[0].approval_id == pending.approval_id
    assert "awaitable" in (failed[0].detail_json or "")
