"""What an erasure reaches, on SQLite and PostgreSQL: every row of a call, never part of one.

A retention pass skips every row of an open call (its approval, executions, events, decisions
and idempotency records), as `redact` refuses a user with one. A subject redaction reaches the
writes on that subject (found by their arguments) as well as its gated calls. A notifier's events
name the call's user, so a redaction or retention pass reaches the error text they quote; events
recorded before that, naming only the approval, are reached through it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
)
from effectgate.audit import audit
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import Notification
from effectgate.redact import RedactionError, redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate
from .test_redact import ADA_EMAIL, FINANCE, LEAD, everything, refund

IBAN = "GB33BUKB20201555555555"
DAY = 86400.0
ALL_KINDS = ("read", "write", "send", "money", "destructive", "unclassified")


def _erased(text: str | None) -> bool:
    return (text or "").startswith('{"$redacted"')


def _pay(order_id: str, amount: int, iban: str) -> dict[str, Any]:
    raise ConnectionResetError(f"connection reset by provider while paying IBAN {iban}")


def _post(ticket_id: str, text: str) -> dict[str, Any]:
    raise ConnectionResetError(f"connection reset while posting {text!r}")


def _tag(ticket_id: str, tag: str) -> dict[str, Any]:
    return {"ticket_id": ticket_id, "tag": tag}


def _wipe(customer_id: str) -> dict[str, Any]:
    return {"wiped": customer_id}


def _table() -> EffectTable:
    table = EffectTable(
        [
            ToolSpec(
                name="pay", effect=Effect.MONEY, fn=_pay, approver_role="finance", subject=("order_id",)
            ),
            ToolSpec(
                name="wipe",
                effect=Effect.DESTRUCTIVE,
                fn=_wipe,
                approver_role="privacy",
                subject=("customer_id",),
            ),
            ToolSpec(
                name="post",
                effect=Effect.WRITE,
                fn=_post,
                owner="support",
                subject=("ticket_id",),
                unknown_outcome=(ConnectionResetError,),
            ),
            ToolSpec(name="tag", effect=Effect.WRITE, fn=_tag, owner="support", subject=("ticket_id",)),
        ]
    )
    table.allow("support", ["pay", "wipe", "post", "tag"])
    return table


def _ctx(message: str, user: str = "u1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message, user_id=user, agent_id="support")


@pytest.fixture
def open_calls(make_gate: MakeGate) -> EffectGate:
    """u1: a payment awaiting reconciliation, a wipe waiting for its second approver, a write
    awaiting reconciliation (all open) and a finished write (closed)."""
    gate = make_gate(_table())
    pay = gate.call("pay", {"order_id": "o1", "amount": 100, "iban": IBAN}, _ctx("m1"))
    assert isinstance(pay, Pending)
    grant = gate.approve(pay.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    wipe = gate.call("wipe", {"customer_id": "c-ada"}, _ctx("m2"))
    assert isinstance(wipe, Pending)
    gate.approve(wipe.approval_id, version=1, approver=Approver("pia", "privacy"))
    with pytest.raises(NeedsReconciliation):
        gate.call("post", {"ticket_id": "t-1", "text": "ada-home-address"}, _ctx("m3"))
    assert isinstance(gate.call("tag", {"ticket_id": "t-2", "tag": "ada-vip"}, _ctx("m4")), Executed)
    gate.flush()
    return gate


def test_retention_leaves_every_row_of_an_open_call_alone(open_calls: EffectGate, clock: FakeClock) -> None:
    store = open_calls.store
    rules = dict.fromkeys(ALL_KINDS, 30)
    done = retain(store, open_calls.keyring, rules, by="nightly", now=clock.now() + 40 * DAY)
    assert done.values > 0  # the finished write
    executions = {x.tool: x for x in store.executions()}
    assert _erased(executions["tag"].args_json)
    for tool in ("pay", "post"):
        assert not _erased(executions[tool].args_json)
        assert not _erased(executions[tool].error)
    text = everything(store)
    assert IBAN in text
    assert "ada-home-address" in text
    assert "c-ada" in text
    for event in store.events():
        if event.tool in ("pay", "wipe", "post"):
            assert not _erased(event.detail_json), event
        if event.tool == "tag":
            assert _erased(event.detail_json), event
    assert audit(store, open_calls.table, keyring=open_calls.keyring).clean


def test_redaction_names_each_open_call_once(open_calls: EffectGate) -> None:
    snapshot = everything(open_calls.store)
    with pytest.raises(RedactionError, match="has 3 call"):
        redact(open_calls.store, open_calls.keyring, user_id="u1", by="dpo", reason="erasure")
    assert everything(open_calls.store) == snapshot


def test_a_subject_redaction_reaches_the_writes_on_that_subject(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    store = gate.store
    tags = {"ticket_id": "t-17", "tags": ["ada-vip", "divorce-case"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    grace = context("g1", user_id="u2", session_id="s-grace")
    tags = {"ticket_id": "t-18", "tags": ["grace-vip"]}
    assert isinstance(gate.call("update_ticket_tags", tags, grace), Executed)
    refund(gate, "m3", "1042", 1200)
    gate.flush()
    done = redact(
        store, gate.keyring, user_id="u1", subject={"ticket_id": "t-17"}, by="dpo", reason="request"
    )
    assert done.values > 0
    text = everything(store)
    assert "divorce-case" not in text
    assert "grace-vip" in text  # another user's ticket
    assert '"1042"' in text  # Ada's refund: another subject
    [t17] = [x for x in store.executions() if x.tool == "update_ticket_tags" and _erased(x.args_json)]
    assert _erased(t17.after_json)
    events = [e for e in store.events() if e.args_hash == t17.args_hash and e.kind != "read"]
    assert events
    assert all(_erased(e.detail_json) for e in events)
    assert audit(store, gate.table, keyring=gate.keyring).clean


def _failing(notice: Notification) -> None:
    card = notice.card
    raise RuntimeError(f"slack API 400 for a message about {card.subject if card else notice.key}")


@pytest.fixture
def notified(store: SQLStore, clock: FakeClock) -> Iterator[EffectGate]:
    """An email for Ada (u1) whose pending notice failed, quoting the card."""
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=_failing)
    args = {"to": [ADA_EMAIL], "subject": "Your refund", "body": "Dear Ada"}
    pending = gate.call("send_email", args, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=LEAD)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    gate.flush()
    yield gate
    gate.close()


def test_a_notifier_event_names_the_calls_user_and_is_redacted(notified: EffectGate) -> None:
    store = notified.store
    [failed] = store.events(kind="notify_failed")
    assert (failed.user_id, failed.effect, failed.session_id) == ("u1", "send", "s-ada")
    assert ADA_EMAIL in failed.detail_json
    redact(store, notified.keyring, user_id="u1", by="dpo", reason="request")
    assert ADA_EMAIL not in everything(store)
    assert audit(store, notified.table, keyring=notified.keyring).clean


def test_retention_reaches_a_notifier_event(notified: EffectGate, clock: FakeClock) -> None:
    store = notified.store
    retain(store, notified.keyring, {"send": 0}, by="nightly", now=clock.now() + 1)
    assert ADA_EMAIL not in everything(store)


def test_an_event_naming_only_its_approval_is_redacted_with_it(
    notified: EffectGate, clock: FakeClock
) -> None:
    """Notifier events recorded before they named the user are reached through their approval."""
    store = notified.store
    [approval] = store.approvals()
    detail = {"error": f"bounced: {ADA_EMAIL}"}
    with store.transaction() as conn:
        event = {
            "at": clock.now(),
            "kind": "webhook_failed",
            "approval_id": approval.id,
            "detail_json": detail,
        }
        store.append_events(conn, [event])
    redact(store, notified.keyring, user_id="u2", by="dpo", reason="someone else")
    assert "bounced" in everything(store)
    redact(store, notified.keyring, user_id="u1", by="dpo", reason="request")
    assert ADA_EMAIL not in everything(store)
    [legacy] = store.events(kind="webhook_failed")
    assert json.loads(legacy.detail_json).keys() == {"$redacted"}


def test_a_notifier_event_about_a_write_names_its_user(make_gate: MakeGate) -> None:
    gate = make_gate(_table(), notify=_failing)
    with pytest.raises(NeedsReconciliation):
        gate.call("post", {"ticket_id": "t-1", "text": "ada-home-address"}, _ctx("m1"))
    gate.flush()
    [failed] = gate.store.events(kind="notify_failed")
    assert (failed.user_id, failed.tool, failed.effect) == ("u1", "post", "write")
