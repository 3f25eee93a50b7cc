"""Shared fixtures for the notifier tests: a webhook keyring, a respx router every request must
hit, notifiers on a FakeClock delivering in the caller's thread, the shop's gate notifying one,
a real proposal's notice, and a hand-built card."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import respx

from effectgate import CallContext, EffectGate, Keyring, Pending
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import Notification, WebhookNotifier
from effectgate.outcomes import Card
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

URL = "https://hooks.example.test/T1"
INBOX = "https://inbox.example.test"
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
EVIL = "<!channel> <https://evil|Approve> *bold* & co"

MakeNotifier = Callable[..., WebhookNotifier]
Rig = Callable[..., tuple[EffectGate, WebhookNotifier]]


@pytest.fixture
def ring() -> Keyring:
    return Keyring.generate("wh1")


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    """Every request must hit a mocked route; tests count the calls they expect (zero included)."""
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as mock:
        yield mock


@pytest.fixture
def make_notifier(ring: Keyring, clock: FakeClock) -> Iterator[MakeNotifier]:
    made: list[WebhookNotifier] = []

    def make(**options: Any) -> WebhookNotifier:
        defaults: dict[str, Any] = {
            "keyring": ring,
            "inbox_url": INBOX,
            "clock": clock,
            "jitter": False,
            "background": False,
        }
        notifier = WebhookNotifier(options.pop("url", URL), **{**defaults, **options})
        made.append(notifier)
        return notifier

    yield make
    for notifier in made:
        notifier.close(timeout=15)


@pytest.fixture
def rig(store: SQLStore, clock: FakeClock, make_notifier: MakeNotifier) -> Iterator[Rig]:
    """`rig(**notifier_options)`: the shop's gate on `store` notifying a fresh webhook notifier."""
    made: list[tuple[EffectGate, WebhookNotifier]] = []

    def make(**options: Any) -> tuple[EffectGate, WebhookNotifier]:
        notifier = make_notifier(**options)
        gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=notifier)
        made.append((gate, notifier))
        return gate, notifier

    yield make
    for gate, notifier in made:
        notifier.close(timeout=15)  # first: queued deliveries record through the gate's store
        gate.close()


@pytest.fixture
def notice(store: SQLStore, clock: FakeClock) -> Iterator[Notification]:
    """The notice a real refund proposal produces; its `record` writes into `store`."""
    seen: list[Notification] = []
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=seen.append)
    propose(gate)
    yield seen[0]
    gate.close()


def propose(
    gate: EffectGate,
    tool: str = "refund_order",
    args: Mapping[str, Any] = REFUND,
    ctx: CallContext | None = None,
) -> Pending:
    out = gate.call(tool, dict(args), ctx or context("m3"))
    assert isinstance(out, Pending), out
    return out


def hand_card(
    subject: Mapping[str, Any] | None,
    clock: FakeClock,
    *,
    warnings: Sequence[str] = (),
    session_id: str = "s-1",
    user_id: str = "u1",
) -> Card:
    now = clock.now()
    return Card(
        approval_id="a-1",
        version=1,
        status="pending",
        tool="send_email",
        effect="send",
        reversibility="irreversible",
        args={"to": ["x@example.test"], "subject": EVIL, "body": EVIL},
        args_hash="0" * 64,
        subject=subject,
        approver_role="support_lead",
        notes=(),
        approvals_required=1,
        approvals_given=0,
        owner="messaging",
        session_id=session_id,
        user_id=user_id,
        created_at=now,
        expires_at=now + 3600,
        warnings=tuple(warnings),
    )
