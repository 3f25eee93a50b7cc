"""Round 21: approver notifications and webhooks against an adversarial hook, receiver and record.
Store tests run on SQLite and PostgreSQL (`store`); HTTP goes to respx (no network); the clock is
a FakeClock, nothing sleeps."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Keyring, Pending, Refused
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import SHOP_POLICY, Shop, app, context
from effectgate.notify import Notification, WebhookNotifier, message
from effectgate.outcomes import TAMPERED_WARNING, Card
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

URL = "https://hooks.example.test/T21"
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
DAY = 24 * 3600.0


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as mock:
        yield mock


def shop_gate(
    store: SQLStore, clock: FakeClock, shop: Shop, hook: Callable[[Notification], None]
) -> EffectGate:
    return app(store, keyring=Keyring.generate(), clock=clock, shop=shop, notify=hook)


@pytest.mark.parametrize("forged", ["token_used", "expiry_warning", "proposed", "grant_voided"])
def test_a_hook_cannot_append_one_of_the_gates_own_events(
    store: SQLStore, clock: FakeClock, shop: Shop, forged: str
) -> None:
    """`Notification.record` appended any event kind to the gate's log: a hook that recorded
    `token_used` for the approval it announced spent its grant before anyone decided (the gate
    reads that event back as "presented before"), so the approved refund never ran. A notice
    records a notifier's own kinds only; the refused attempt is the hook's failure
    (`notify_failed`) and changes nothing the gate decides with."""
    tries: list[str] = []

    def hook(n: Notification) -> None:
        tries.append(n.kind)
        n.record(forged, {"note": "from the hook"})

    gate = shop_gate(store, clock, shop, hook)
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Pending)
        assert tries == ["pending"]
        assert [e.kind for e in store.events(approval_id=out.approval_id) if e.kind == forged] == (
            ["proposed"] if forged == "proposed" else []
        )
        [failed] = store.events(kind="notify_failed")
        assert failed.approval_id == out.approval_id
        grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        assert shop.receiver.count("refund", order_id="1042") == 1
    finally:
        gate.close()


def test_a_hooks_own_event_keeps_its_detail_whatever_its_keys(
    store: SQLStore, clock: FakeClock, shop: Shop
) -> None:
    """A notifier's own event whose detail has a key named like one of the event's fields
    (`tool`, `row`) was a TypeError inside `record` (or set the field): it is recorded, the detail
    as given, the event's fields the gate's."""

    def hook(n: Notification) -> None:
        n.record("notify_paged", {"tool": "pagerduty", "row": 3})

    gate = shop_gate(store, clock, shop, hook)
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Pending)
        assert store.events(kind="notify_failed") == []
        [paged] = store.events(kind="notify_paged")
        assert (paged.tool, paged.approval_id) == ("refund_order", out.approval_id)
        assert json.loads(paged.detail_json or "{}") == {"tool": "pagerduty", "row": 3}
    finally:
        gate.close()


def test_a_hook_that_edits_its_card_changes_neither_the_callers_card_nor_the_next_hooks(
    store: SQLStore, clock: FakeClock, shop: Shop
) -> None:
    """Every hook got the caller's own Card object: a notifier that dropped the amount from
    `n.card.args` before posting (to keep it out of a chat) dropped it from the `Pending` the
    call returned, whose card an adapter shows the reviewer (LangGraph's interrupt), and from
    what the next notifier sent. The reviewer would approve a refund shown without its amount."""
    later: list[dict[str, Any]] = []

    def redacting(n: Notification) -> None:
        assert n.card is not None
        n.card.args.pop("amount")  # type: ignore[attr-defined]
        n.card.subject["order_id"] = "****"  # type: ignore[index]

    def second(n: Notification) -> None:
        assert n.card is not None
        later.append({"args": dict(n.card.args), "subject": dict(n.card.subject or {})})

    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop, notify=[redacting, second])
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Pending)
        assert dict(out.card.args) == REFUND
        assert out.card == gate.card(out.approval_id)
        assert later == [{"args": REFUND, "subject": {"order_id": "1042"}}]
        clock.advance(DAY - 600)
        [warned] = gate.warn_expiring(within=900)
        assert dict(warned.args) == REFUND
        assert store.events(kind="notify_failed") == []
    finally:
        gate.close()


class ReprRaises(Exception):
    def __repr__(self) -> str:
        raise AttributeError("this SDK error has no repr without its response")


class ReprSurrogate(Exception):
    def __repr__(self) -> str:
        return "PagerError('\udcff')"  # a provider's bytes decoded with surrogateescape


@pytest.mark.parametrize(
    ("error", "recorded"), [(ReprRaises, "ReprRaises(no text)"), (ReprSurrogate, "PagerError('\\udcff')")]
)
def test_a_hook_whose_error_has_an_odd_repr_changes_no_outcome_and_is_recorded(
    store: SQLStore, clock: FakeClock, shop: Shop, error: type[Exception], recorded: str
) -> None:
    """A pager raising an exception whose repr raises: as `on_needs_reconciliation`, the gate's
    `repr(exc)` raised from its except clause, so `execute` raised that AttributeError instead of
    NeedsReconciliation (the page, and the caller's answer, lost); as a notifier, its failure went
    unrecorded. One whose repr holds a lone surrogate was not stored on PostgreSQL. Each failure is
    recorded, and the outcome stands."""

    def pager(n: object) -> None:
        raise error("pager down")

    gate = app(
        store, keyring=Keyring.generate(), clock=clock, shop=shop, notify=pager, on_needs_reconciliation=pager
    )
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        shop.provider.timeouts_to_inject = 1
        with pytest.raises(NeedsReconciliation):
            gate.execute(grant.token)
        assert shop.receiver.count("refund", order_id="1042") == 1
        failed = store.events(kind="notify_failed")
        assert len(failed) == 3  # the proposal's notice; the unknown outcome's notice and page
        assert all(e.approval_id == out.approval_id for e in failed)
        assert [json.loads(e.detail_json or "{}")["error"] for e in failed] == [recorded] * 3
    finally:
        gate.close()


@pytest.mark.parametrize("wrap", ["bound method", "partial", "__call__", "wraps"])
def test_a_notifier_sharing_the_grant_keyring_is_refused_however_it_is_given(
    store: SQLStore, clock: FakeClock, wrap: str
) -> None:
    """The gate refused a WebhookNotifier signing with its grant keyring, but not the same
    notifier given as `hook.deliver`, `functools.partial(hook)`, `hook.__call__` or a decorated
    function: its receiver could check grant MACs, i.e. mint grants. Each is refused."""
    ring = Keyring.generate()
    hook = WebhookNotifier(URL, keyring=ring, clock=clock, background=False)

    @functools.wraps(hook.__call__)
    def decorated(n: Notification) -> None:
        hook(n)

    given: Any = {
        "bound method": hook.deliver,
        "partial": functools.partial(hook),
        "__call__": hook.__call__,
        "wraps": decorated,
    }[wrap]
    try:
        with pytest.raises(ValueError, match="grant keyring"):
            app(store, keyring=ring, clock=clock, notify=given)
        with pytest.raises(ValueError, match="grant keyring"):
            app(store, keyring=ring, clock=clock, on_needs_reconciliation=given)
        app(store, keyring=Keyring.generate(), clock=clock, notify=given).close()  # its own keys: fine
    finally:
        hook.close()


SLACK_FIELD, SLACK_TEXT = 2000, 3000  # Block Kit: a section field's text, a section's text


def slack(request: httpx.Request) -> httpx.Response:
    """Slack's incoming webhook refuses a message whose blocks break Block Kit's limits."""
    body = json.loads(request.content)
    for block in body["blocks"]:
        if block["type"] != "section":
            continue
        texts = [block["text"]["text"]] if "text" in block else []
        if "text" in block and len(texts[0]) > SLACK_TEXT:
            return httpx.Response(400, text="invalid_blocks")
        if (
            any(len(f["text"]) > SLACK_FIELD for f in block.get("fields", ()))
            or len(block.get("fields", ())) > 10
        ):
            return httpx.Response(400, text="invalid_blocks")
    return httpx.Response(200, text="ok")


def test_a_subject_edited_large_still_pages_that_the_record_does_not_verify(
    store: SQLStore, clock: FakeClock, shop: Shop, router: respx.MockRouter
) -> None:
    """An approval edited in the database (its role, and its subject into eight long entries): its
    expiry notice (which says the record does not verify) carried a Subject field of about
    3,300 characters, over Block Kit's 2,000 for a field, so Slack refused it (400, final) and the
    page about the edited record was lost. The field is bounded; the rest is on the card."""
    router.post(URL).mock(side_effect=slack)
    hook = WebhookNotifier(URL, keyring=Keyring.generate(), clock=clock, background=False, jitter=False)
    gate = shop_gate(store, clock, shop, hook)
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Pending)
        edited = {f"{'k' * 150}{i}": "v" * 300 for i in range(8)}
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE eg_approvals SET subject_json = :v, approver_role = 'support' WHERE id = :id"
                ),
                {"v": json.dumps(edited), "id": out.approval_id},
            )
        clock.advance(DAY - 600)
        [card] = gate.warn_expiring(within=900)
        assert TAMPERED_WARNING in card.warnings
        kinds = [(e.kind, json.loads(e.detail_json or "{}").get("notification")) for e in store.events()]
        assert ("webhook_delivered", "expiring") in kinds
        assert ("webhook_failed", "expiring") not in kinds
    finally:
        hook.close()
        gate.close()


def test_every_message_field_fits_slacks_limits(clock: FakeClock) -> None:
    """The same bound without a store: a card with long keys and values in every subject entry,
    a long reason and eight long warnings renders within Block Kit's limits."""
    now = clock.now()
    card = Card(
        approval_id="a-1",
        version=1,
        status="pending",
        tool="t" * 500,
        effect="e" * 500,
        reversibility="r" * 500,
        args={},
        args_hash="0" * 64,
        subject={"<&>" * 100 + str(i): "&" * 500 for i in range(20)},
        approver_role="r" * 500,
        notes=(),
        approvals_required=1,
        approvals_given=0,
        owner=None,
        session_id="s" * 500,
        user_id="u" * 500,
        created_at=now,
        expires_at=now + 3600,
        reason="x" * 5000,
        warnings=tuple("w" * 500 for _ in range(12)),
    )
    n = Notification(kind="pending", tool=card.tool, approver_role=card.approver_role, at=now, card=card)
    body = message(n, inbox_url="https://inbox.example.test", now=now)
    request = httpx.Request("POST", URL, content=json.dumps(body).encode())
    assert slack(request).status_code == 200


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(lambda hook: {hook}, id="set"),
        pytest.param(lambda hook: (h for h in [hook]), id="generator"),
        pytest.param(lambda hook: URL, id="url"),
    ],
)
def test_notifiers_that_are_not_callable_are_refused_when_the_gate_is_made(
    store: SQLStore, clock: FakeClock, given: Callable[[Callable[[Notification], None]], Any]
) -> None:
    """`notify={hook}` (a set is no Sequence: taken as one hook), a generator, or the webhook URL
    itself (a string is a Sequence: each letter a hook) were accepted, and then every notice
    failed (one `notify_failed` per letter): nobody was ever told. Refused up front."""
    seen: list[Notification] = []
    with pytest.raises(TypeError, match="must be callable"):
        app(store, keyring=Keyring.generate(), clock=clock, notify=given(seen.append))
    with pytest.raises(TypeError, match="must be callable"):
        app(store, keyring=Keyring.generate(), clock=clock, on_needs_reconciliation=given(seen.append))


def test_a_shadow_approval_is_announced_as_its_expiry_is(
    store: SQLStore, clock: FakeClock, shop: Shop
) -> None:
    """A refund proposed in shadow mode waits for a reviewer's decision like a live one; its
    expiry warning is sent, but it was never announced as pending."""
    seen: list[Notification] = []
    table = shop.table().shadowed(["refund_order"])
    gate = EffectGate(
        table, store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock, notify=seen.append
    )
    try:
        out = gate.call("refund_order", dict(REFUND), context("m3"))
        assert isinstance(out, Refused)
        assert out.code == "shadow"
        clock.advance(DAY - 600)
        gate.warn_expiring(within=900)
        assert [(n.kind, n.approval_id) for n in seen] == [
            ("pending", out.approval_id),
            ("expiring", out.approval_id),
        ]
    finally:
        gate.close()
