"""Round 6 review of governance over the ledger (redaction, retention, replay, report), on SQLite
and PostgreSQL through the `store` fixture family."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate.audit import audit
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.redact import RedactionError, is_redacted, redact, retain
from effectgate.replay import replay
from effectgate.report import figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

LEAD = Approver("sam", "support_lead")
FINANCE = Approver("fiona", "finance")


def _email(gate: EffectGate, message: str, to: list[str], user: str = "u1") -> str:
    args = {"to": to, "subject": "Your refund", "body": "It is on its way."}
    pending = gate.call("send_email", args, context(message, user_id=user))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=LEAD)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    return pending.approval_id


def _args(store: SQLStore, approval_id: str) -> str:
    with store.reading() as conn:
        text = conn.execute(
            sa.text("SELECT args_json FROM eg_approvals WHERE id = :id"), {"id": approval_id}
        ).scalar_one()
    return str(text)


def test_subject_list_named_as_the_call_named_it_is_found(shop_gate: ShopGate, store: SQLStore) -> None:
    """A list subject (an email's recipients) names a set (`ToolSpec.subject_of`): the gate keys the
    call by its recipients sorted. An erasure request that names them as the call did, in the
    model's order, must find and erase that call, not answer SubjectNotFound ("no record")."""
    gate = shop_gate.gate
    to = ["grace@example.com", "ada@example.com"]  # not in sorted order
    email_id = _email(gate, "m1", to)
    other_id = _email(gate, "m2", ["bob@example.com"])
    gate.flush()
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure #1", subject={"to": to})
    assert done.rows >= 1
    assert is_redacted(_args(store, email_id))
    assert not is_redacted(_args(store, other_id))
    assert "ada@example.com" not in _args(store, email_id)
    assert audit(store, keyring=gate.keyring).clean


def test_subject_list_in_another_order_is_the_same_subject(shop_gate: ShopGate, store: SQLStore) -> None:
    """The same recipients in another order, or one twice, are the same subject to the gate; so
    they are to an erasure request."""
    gate = shop_gate.gate
    email_id = _email(gate, "m1", ["ada@example.com", "grace@example.com"])
    gate.flush()
    subject = {"to": ["grace@example.com", "ada@example.com", "ada@example.com"]}
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure #2", subject=subject)
    assert is_redacted(_args(store, email_id))
    assert json.loads(_args(store, email_id)).get("to") is None


@pytest.mark.parametrize("body", ['{"shadow": true, "n": NaN}', '{"n": 100000000000000000000000}'])
def test_an_appended_rule_the_canonical_form_refuses_is_no_rule_not_a_crash(
    store: SQLStore, clock: FakeClock, body: str
) -> None:
    """A rule row inserted with a body Python's parser reads but canonical JSON refuses (NaN, an
    integer past 2**53) made every report and every replay fail with ArgumentError: it is no rule
    (no body that hashes to its fingerprint), and the figures and the replay go on."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        pending = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
    with store.transaction() as conn:
        conn.execute(
            sa.text("INSERT INTO eg_rules (fingerprint, kind, body_json, at) VALUES ('odd', 'row', :b, 0)"),
            {"b": body},
        )
    report = figures(store, keyring=keyring)
    assert {(r.key, r.mode, r.decided) for r in report.by_tool} == {("refund_order", "live", 1)}
    results = replay(store, shop.table(), SHOP_POLICY).results
    assert [(r.approval_id, r.verdict) for r in results] == [(pending.approval_id, "same")]


def test_retention_days_no_float_holds_are_refused_not_an_overflow(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """An integer number of days no float holds (10**400) raised a bare OverflowError from the
    rule check; it is refused as every other rule that is no finite number of days, nothing
    written."""
    gate = shop_gate.gate
    _email(gate, "m1", ["ada@example.com"])
    gate.flush()
    with store.reading() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM eg_events")).scalar_one()
    with pytest.raises(RedactionError, match=">= 0"):
        retain(store, gate.keyring, {"send": 10**400}, by="nightly")
    with store.reading() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM eg_events")).scalar_one() == before


def test_a_write_named_by_a_list_in_another_order_is_found(shop_gate: ShopGate, store: SQLStore) -> None:
    """A write (no subject key) is found by its arguments; a list among them names a set, as the
    gate's subjects do: the same tags in another order find the same write."""
    gate = shop_gate.gate
    tags = {"ticket_id": "t-17", "tags": ["billing", "ada-vip"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    gate.flush()
    subject = {"ticket_id": "t-17", "tags": ["ada-vip", "billing"]}
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure #3", subject=subject)
    assert done.rows >= 1
    with store.reading() as conn:
        stored = conn.execute(sa.text("SELECT args_json FROM eg_executions")).scalars().all()
    assert stored
    assert all(is_redacted(str(text)) for text in stored)
