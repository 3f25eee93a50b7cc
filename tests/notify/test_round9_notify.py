"""Round 9 of the review of the webhook notifier: what reaches the application's logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
import respx
import sqlalchemy as sa

from effectgate import Approver, Grant, Keyring
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import Shop, app
from effectgate.notify import Notification
from effectgate.outcomes import ReconciliationNotice
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeNotifier, hand_card, propose

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


def test_the_webhook_url_never_reaches_the_log_at_info(
    make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An application logging at INFO (`logging.basicConfig(level=logging.INFO)`, as the README's
    example does) had the webhook's whole URL, its secret path and query, in its log for every
    attempt: httpx, which posts each notice, logs `HTTP Request: POST <url> "HTTP/1.1 200 OK"` at
    INFO. Only the host (what the notifier records) reaches the log; the delivery still happens,
    once per attempt."""
    route = router.post(SECRET_URL).mock(side_effect=[httpx.Response(503), httpx.Response(200)])
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    with caplog.at_level(logging.INFO):
        d = make_notifier(url=SECRET_URL).deliver(notice(clock, recorded))
    assert (d.delivered, d.statuses) == (True, (503, 200))
    assert route.call_count == 2
    assert [k for k, _ in recorded] == ["webhook_delivered"]
    requests = [r for r in caplog.records if r.name == "httpx"]
    assert len(requests) == 2  # the lines are kept, with the host in the URL's place
    for record in caplog.records:
        assert "SECRET" not in record.getMessage()
        assert "/services/" not in record.getMessage()
    assert all("hooks.example.test" in r.getMessage() for r in requests)


def test_a_failing_pager_and_a_store_dropping_its_record_leave_the_unknown_outcome_told(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approved refund's provider timed out (the refund happened): the gate stored
    needs_reconciliation and paged the approver through `on_needs_reconciliation`, which raised;
    recording that failure then failed too (the database dropped the connection). That second
    error escaped from `execute` in place of `NeedsReconciliation`, so the caller read a database
    error, not "the outcome is unknown: do not retry" (the hooks given as `notify=` are guarded
    against this already). The caller is told the outcome is unknown; nothing ran twice."""
    shop = Shop()

    def pager(notice: ReconciliationNotice) -> None:
        raise RuntimeError("the pager is down")

    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop, on_needs_reconciliation=pager)
    append = store.append_events

    def dropping(conn: Any, events: list[dict[str, Any]]) -> None:
        if any(e.get("kind") == "notify_failed" for e in events):
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("INSERT", None, lost)
        append(conn, events)

    try:
        pending = propose(gate)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        shop.provider.timeouts_to_inject = 1
        monkeypatch.setattr(store, "append_events", dropping)
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)
    finally:
        gate.close()
    assert shop.receiver.count("refund") == 1
    record = store.get(f"eg_{pending.approval_id}_v1")
    assert record is not None
    assert record.status == "needs_reconciliation"


class EndlessBody(httpx.SyncByteStream):
    """An answer whose body never ends (an event stream that pings): a reader never finishes it.
    It counts what was read, and stops a reader after a few chunks so the test cannot hang."""

    def __init__(self) -> None:
        self.read = 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            self.read += 1
            if self.read > 3:
                raise RuntimeError("the body never ends: the reader would wait for ever")
            yield b": ping\n\n"


def test_an_answer_whose_body_never_ends_does_not_hold_the_delivery(
    make_notifier: MakeNotifier, router: respx.MockRouter, clock: FakeClock
) -> None:
    """The receiver answered 200 with its headers, then kept the body open (a URL that serves an
    event stream, or a proxy that trickles): the notifier read the body to its end, which never
    came, so its worker waited for ever (every byte within the read timeout) and every later
    notice of that webhook stayed queued behind it. A delivery needs only the status line: it is
    delivered, and none of the body is read."""
    body = EndlessBody()
    route = router.post(SECRET_URL).mock(return_value=httpx.Response(200, stream=body))
    recorded: list[tuple[str, Mapping[str, Any]]] = []
    d = make_notifier(url=SECRET_URL).deliver(notice(clock, recorded))
    assert route.call_count == 1
    assert (d.delivered, d.statuses, d.error) == (True, (200,), None)
    assert [k for k, _ in recorded] == ["webhook_delivered"]
    assert body.read == 0
