"""Hostile answers and failures at delivery: every notice still ends as exactly one recorded
event, and no error text recorded or logged quotes the webhook URL's secret path."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import respx

from effectgate.notify import Notification
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeNotifier, Rig, hand_card, propose

SECRET_URL = "https://hooks.example.test/services/T0/B0/SECRETsecret?token=SECRETquery"


def notice(clock: FakeClock, recorded: list[tuple[str, Mapping[str, Any]]]) -> Notification:
    return Notification(
        kind="pending",
        tool="send_email",
        approver_role="support_lead",
        at=clock.now(),
        card=hand_card({"to": "x"}, clock),
        record=lambda k, d: recorded.append((k, dict(d))),
    )


@pytest.mark.parametrize(
    "retry_after", ["\u00b2", "\u0661\u0662\u0663", "1e3", "-5", "9" * 5000, "Wed, 21 Oct"]
)
def test_a_strange_retry_after_is_ignored_not_crashed(
    retry_after: str, make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock
) -> None:
    """A Retry-After that is not ASCII seconds (a superscript, Arabic-Indic digits, a float, a
    sign, thousands of digits, a date) is ignored: the usual backoff, a retry, one delivery."""
    route = router.post(SECRET_URL).mock(
        side_effect=[
            httpx.Response(503, headers=[(b"Retry-After", retry_after.encode())]),
            httpx.Response(200),
        ]
    )
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    d = make_notifier(url=SECRET_URL, backoff=1.0).deliver(notice(clock, recorded))
    assert (d.delivered, d.statuses, d.waits) == (True, (503, 200), (1.0,))
    assert route.call_count == 2
    assert [k for k, _ in recorded] == ["webhook_delivered"]


def test_a_strange_retry_after_in_the_background_is_still_recorded(
    rig: Rig, router: respx.MockRouter, store: SQLStore
) -> None:
    """Off the gate's thread, a superscript Retry-After still ends as one recorded delivery."""
    route = router.post(SECRET_URL).mock(
        side_effect=[httpx.Response(503, headers=[(b"Retry-After", "\u00b2".encode())]), httpx.Response(200)]
    )
    gate, notifier = rig(url=SECRET_URL, background=True)
    out = propose(gate)
    assert notifier.flush(timeout=10) is True
    assert route.call_count == 2
    [event] = [e for e in store.events() if e.kind.startswith("webhook_")]
    assert (event.kind, event.approval_id) == ("webhook_delivered", out.approval_id)


def test_an_error_inside_delivery_is_one_recorded_failure(
    make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug between attempts (here: the wait) is recorded as one webhook_failed, never raised."""
    router.post(SECRET_URL).mock(return_value=httpx.Response(503))
    notifier = make_notifier(url=SECRET_URL)

    def broken(attempt: int, retry_after: str | None) -> float:
        raise ArithmeticError(f"cannot wait for {SECRET_URL}")

    monkeypatch.setattr(notifier, "_wait", broken)
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    d = notifier.deliver(notice(clock, recorded))
    assert (d.delivered, d.statuses) == (False, (503,))
    [(kind, detail)] = recorded
    assert kind == "webhook_failed"
    assert "ArithmeticError" in detail["error"]
    assert "SECRET" not in detail["error"]


@pytest.mark.parametrize(
    "quote",
    [
        lambda r: f"bad request to {r.url}",
        lambda r: f"bad request to {SECRET_URL}",
        lambda r: f"bad path {r.url.raw_path.decode()}",
        lambda r: f"bad path {r.url.path}",
    ],
)
@pytest.mark.parametrize("error", [RuntimeError, httpx.ConnectError])
def test_an_error_quoting_the_url_is_recorded_with_its_host(
    quote: Any,
    error: type[Exception],
    make_notifier: MakeNotifier,
    router: respx.MockRouter,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transport error whose text quotes the webhook URL (or its path) is recorded, returned and
    logged with the host in the URL's place: the secret path and query never leave the notifier."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise error(quote(request))

    router.post(SECRET_URL).mock(side_effect=fail)
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    with caplog.at_level(logging.WARNING, logger="effectgate.notify"):
        d = make_notifier(url=SECRET_URL, attempts=2).deliver(notice(clock, recorded))
    [(kind, detail)] = recorded
    assert kind == "webhook_failed"
    assert d.error == detail["error"]
    assert d.error is not None
    assert error.__name__ in d.error
    for text in (d.error, json.dumps(detail), caplog.text):
        assert "SECRET" not in text
        assert "/services/" not in text
    assert "hooks.example.test" in d.error or "…" in d.error


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.test:99999/services/SECRETsecret",
        "https://hooks.example.test:-1/services/SECRETsecret",
        "https://hooks.example.test/services/SEC\x7fRET",
        "https://hooks.example.test/services/SEC\nRET",
    ],
)
def test_an_invalid_url_is_refused_up_front_without_quoting_it(url: str, make_notifier: MakeNotifier) -> None:
    """A port out of range or a control character is a clear ValueError at construction (not a
    failure at every delivery), and the message does not quote the URL."""
    with pytest.raises(ValueError, match="not a valid http") as info:
        make_notifier(url=url)
    assert "SEC" not in str(info.value)
