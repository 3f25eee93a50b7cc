"""GDPR erasure, retention and legal holds (issue 18), on SQLite and PostgreSQL.

A redaction removes a user's personal values from every table (and from an export already
written) while the financial facts, the approval chain and every hash stay; the audit stays clean
and the export still verifies. A marker written without `redact`, or kept facts edited after it,
is an audit finding. A held user, or one with a call that may still run, is refused with nothing
changed; retention erases by age per record kind and skips held users."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending, Recorded, Refused
from effectgate.audit import audit
from effectgate.chain import seal_chain
from effectgate.errors import TokenError
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.export import export_chain, redact_export, verify_export
from effectgate.flow import drive
from effectgate.outcomes import REDACTED_NOTE, TAMPERED_WARNING
from effectgate.redact import RedactionError, hold, holds, redact, release, retain
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
LEAD = Approver("sam", "support_lead")
ADA_EMAIL = "ada.lovelace@example.com"


def everything(store: SQLStore) -> str:
    """Every value of every effectgate table, as one text (to search for personal values)."""
    with store.reading() as conn:
        names = [t for t in sa.inspect(conn).get_table_names() if t.startswith("eg_")]
        return "\n".join(
            repr(tuple(row)) for name in names for row in conn.exec_driver_sql(f"SELECT * FROM {name}")
        )


def refund(gate: EffectGate, message: str, order: str, amount: int, user: str = "u1") -> Executed:
    args = {"order_id": order, "amount": amount, "currency": "GBP"}
    pending = gate.call("refund_order", args, context(message, user_id=user))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    return done


def email(gate: EffectGate, message: str, to: str, user: str = "u1") -> Executed:
    args = {"to": [to], "subject": "Your refund", "body": f"Dear {to}, it is on its way."}
    pending = gate.call("send_email", args, context(message, user_id=user))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=LEAD)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    return done


@pytest.fixture
def ledger(shop_gate: ShopGate) -> EffectGate:
    """Ada (u1): a read, a write, a refund of 1042 and an email; Grace (u2): a refund of 2001."""
    gate = shop_gate.gate
    assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m0")), Executed)
    tags = {"ticket_id": "t-17", "tags": ["billing", "ada-vip"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    refund(gate, "m2", "1042", 1200)
    email(gate, "m3", ADA_EMAIL)
    refund(gate, "g1", "2001", 700, user="u2")
    gate.flush()
    return gate


def test_redaction_erases_a_users_values_everywhere_and_keeps_the_facts(ledger: EffectGate) -> None:
    gate, store = ledger, ledger.store
    before = {a.id: a for a in store.approvals()}
    assert ADA_EMAIL in everything(store)
    assert "ada-vip" in everything(store)
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request 77")
    assert done.rows > 0
    assert done.values > 0
    text = everything(store)
    for value in (ADA_EMAIL, "ada-vip", '"1042"'):  # quoted: a random key id may hold the digits
        assert value not in text, value
    assert '"2001"' in text  # Grace's records are untouched
    after = {a.id: a for a in store.approvals()}
    for approval_id, old in before.items():
        new = after[approval_id]
        # the approval chain and every hash and time stay
        assert (new.args_hash, new.status, new.seal, new.version, new.created_at, new.decided_at) == (
            old.args_hash,
            old.status,
            old.seal,
            old.version,
            old.created_at,
            old.decided_at,
        )
    ada_refund = next(a for a in after.values() if a.tool == "refund_order" and a.user_id == "u1")
    kept = json.loads(ada_refund.args_json)
    assert {k: v for k, v in kept.items() if k != "$redacted"} == {"amount": 1200, "currency": "GBP"}
    assert [
        (d.approver_id, d.role, d.decision) for d in store.all_decisions() if d.approval_id == ada_refund.id
    ] == [("fiona", "finance", "approve")]
    [event] = store.events(kind="redacted")
    detail = json.loads(event.detail_json)
    assert (detail["by"], detail["reason"], detail["redaction_id"]) == ("dpo", "erasure request 77", done.id)
    report = audit(store, gate.table, keyring=gate.keyring)
    assert report.clean, report.findings


def test_a_second_redaction_has_nothing_left_to_erase(ledger: EffectGate) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="first")
    again = redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="second")
    assert (again.rows, again.values) == (0, 0)
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring).clean


def test_a_subject_narrows_the_redaction_to_that_subjects_approvals(ledger: EffectGate) -> None:
    store = ledger.store
    refund(ledger, "m4", "1043", 500)
    redact(store, ledger.keyring, user_id="u1", subject={"order_id": "1043"}, by="dpo", reason="order")
    args = {a.id: a.args_json for a in store.approvals() if a.tool == "refund_order"}
    assert sum('"$redacted"' in text for text in args.values()) == 1
    assert any('"1042"' in text for text in args.values())
    assert audit(store, ledger.table, keyring=ledger.keyring).clean


def test_the_shops_balance_check_still_counts_redacted_refunds(
    ledger: EffectGate, shop_gate: ShopGate
) -> None:
    """The kept facts (amount, currency) are what a business check over the subject reads."""
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    over = ledger.call(
        "refund_order", {"order_id": "1042", "amount": 10801, "currency": "GBP"}, context("m9")
    )
    assert not isinstance(over, Pending)  # only 10800 is left on 1042: refused before any approval
    refund(ledger, "m10", "1042", 10800)  # exactly what is left still runs
    assert shop_gate.shop.receiver.count("refund") == 3  # Ada's two and Grace's one


def test_an_export_written_before_the_redaction_is_erased_and_still_verifies(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    store, keyring = ledger.store, ledger.keyring
    path = tmp_path / "before.jsonl"
    manifest = export_chain(store, keyring, path, now=clock.now() + 61)
    assert ADA_EMAIL in path.read_text()
    redact(store, keyring, user_id="u1", by="dpo", reason="erasure")
    assert redact_export(path, store=store, user_id="u1") == 3  # the write, the refund and the email
    assert ADA_EMAIL not in path.read_text()
    assert "ada-vip" not in path.read_text()
    assert "2001" in path.read_text()
    assert verify_export(path, keyring).ok
    # an export written after the redaction continues the chain and carries only the facts
    refund(ledger, "g2", "2001", 100, user="u2")
    later = tmp_path / "after.jsonl"
    export_chain(store, keyring, later, after=manifest, now=clock.now() + 61)
    assert verify_export(later, keyring, after=manifest).ok
    whole = tmp_path / "whole.jsonl"
    export_chain(store, keyring, whole, now=clock.now() + 61)
    assert verify_export(whole, keyring).ok
    assert ADA_EMAIL not in whole.read_text()
    records = [json.loads(line)["record"] for line in whole.read_text().splitlines()]
    ada = [r for r in records if r["user_id"] == "u1"]
    assert all(r["redacted"] for r in ada)
    assert [r["args"] for r in ada if r["tool"] == "refund_order"] == [{"amount": 1200, "currency": "GBP"}]


def test_verify_finds_a_personal_value_changed_outside_the_chain(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "x.jsonl"
    export_chain(ledger.store, ledger.keyring, path, now=clock.now() + 61)
    path.write_text(path.read_text().replace(ADA_EMAIL, "eve@example.com"))
    result = verify_export(path, ledger.keyring)
    assert not result.ok
    assert "personal value" in (result.problem or "")


def _redacted_marker_without_redaction(store: SQLStore, approval_id: str) -> None:
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :m WHERE id = :id"),
            {"m": '{"$redacted":"r-forged","amount":1200,"currency":"GBP"}', "id": approval_id},
        )


def test_a_marker_no_redaction_wrote_is_an_audit_finding(ledger: EffectGate) -> None:
    store = ledger.store
    approval = next(a for a in store.approvals() if a.tool == "refund_order" and a.user_id == "u1")
    _redacted_marker_without_redaction(store, approval.id)
    with store.transaction() as conn:  # the triggers let a marker into an execution: the audit must catch it
        conn.exec_driver_sql(
            """UPDATE eg_executions SET args_json = '{"$redacted":"r-x"}' WHERE tool = 'send_email'"""
        )
    kinds = [(f.kind, f.tool) for f in audit(store, ledger.table, keyring=ledger.keyring).findings]
    assert ("redaction_forged", "refund_order") in kinds
    assert ("redaction_forged", "send_email") in kinds


def test_facts_edited_after_a_redaction_are_an_audit_finding(ledger: EffectGate) -> None:
    store = ledger.store
    redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    approval = next(a for a in store.approvals() if a.tool == "refund_order" and a.user_id == "u1")
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :m WHERE id = :id"),
            {"m": approval.args_json.replace("1200", "12"), "id": approval.id},
        )
    findings = audit(store, ledger.table, keyring=ledger.keyring).findings
    assert [(f.kind, f.approval_id) for f in findings] == [("redaction_forged", approval.id)]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE eg_executions SET args_json = '{}'",
        "UPDATE eg_executions SET args_hash = 'x'",
        "UPDATE eg_events SET kind = 'x'",
        "UPDATE eg_decisions SET approver_id = 'x'",
        "DELETE FROM eg_events",
        "DELETE FROM eg_redacted",
        "UPDATE eg_redacted SET commitment = 'x'",
    ],
)
def test_the_append_only_tables_take_nothing_but_a_marker(ledger: EffectGate, statement: str) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), ledger.store.transaction() as conn:
        conn.exec_driver_sql(statement)


def test_a_held_user_is_refused_and_nothing_changes(ledger: EffectGate, clock: FakeClock) -> None:
    store = ledger.store
    placed = hold(store, user_id="u1", by="legal", reason="case 2026-14")
    snapshot = everything(store)
    with pytest.raises(RedactionError, match="legal hold"):
        redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    assert everything(store) == snapshot
    assert [h.id for h in holds(store)] == [placed.id]
    release(store, placed.id, by="legal")
    with pytest.raises(RedactionError, match="no active legal hold"):
        release(store, placed.id, by="legal")
    assert holds(store) == []
    assert redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure").rows > 0


def test_a_user_with_a_call_still_open_is_refused_and_nothing_changes(ledger: EffectGate) -> None:
    store = ledger.store
    pending = ledger.call("refund_order", {"order_id": "1043", "amount": 5, "currency": "GBP"}, context("m5"))
    assert isinstance(pending, Pending)
    snapshot = everything(store)
    with pytest.raises(RedactionError, match="may still run"):
        redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    assert everything(store) == snapshot


@pytest.mark.parametrize(
    ("who", "value", "message"),
    [("user_id", "", "user_id"), ("by", " ", "by"), ("reason", "", "reason")],
)
def test_bad_input_is_refused(ledger: EffectGate, who: str, value: str, message: str) -> None:
    kwargs: dict[str, Any] = {"user_id": "u1", "by": "dpo", "reason": "erasure", who: value}
    snapshot = everything(ledger.store)
    with pytest.raises(RedactionError, match=message):
        redact(ledger.store, ledger.keyring, **kwargs)
    assert everything(ledger.store) == snapshot


def test_retention_erases_old_records_of_a_kind_and_skips_held_users(
    ledger: EffectGate, clock: FakeClock
) -> None:
    store = ledger.store
    hold(store, user_id="u2", by="legal", reason="case")
    clock.advance(31 * 86400)
    assert isinstance(ledger.call("get_order", {"order_id": "1043"}, context("m7")), Executed)
    ledger.flush()
    done = retain(store, ledger.keyring, {"read": 30, "money": 30}, by="nightly", now=clock.now())
    assert done.held == ("u2",)
    reads = [e for e in store.events() if e.effect == "read" and e.kind != "refused"]
    erased = [e for e in reads if e.detail_json.startswith('{"$redacted"')]
    assert len(erased) == len(reads) - 1 > 0  # the new read is younger than 30 days
    money = {a.user_id: a.args_json for a in store.approvals() if a.tool == "refund_order"}
    assert money["u1"].startswith('{"$redacted"')
    assert not money["u2"].startswith('{"$redacted"')
    emails = [a.args_json for a in store.approvals() if a.tool == "send_email"]
    assert ADA_EMAIL in emails[0]  # send: no rule
    assert audit(store, ledger.table, keyring=ledger.keyring).clean


def test_an_erased_event_detail_keeps_the_approval_chain(ledger: EffectGate) -> None:
    """Who edited a call (and the hash the edit replaced), who approved it and in what role stay
    in the events' markers, as in the decisions: the version history still names the editor."""
    first = {"order_id": "1042", "amount": 900, "currency": "GBP"}
    pending = ledger.call("refund_order", first, context("m9"))
    assert isinstance(pending, Pending)
    fixed = {**first, "amount": 800}
    edited = drive(ledger.flows.edit("refund_order", fixed, context("m9"), editor="sam"))
    assert isinstance(edited, Pending)
    assert edited.version == 2
    grant = ledger.approve(edited.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(ledger.execute(grant.token), Executed)
    before = [v.edited_by for v in ledger.versions(edited.approval_id)]
    assert before == [None, "sam"]
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    assert [v.edited_by for v in ledger.versions(edited.approval_id)] == before
    details = {e.kind: json.loads(e.detail_json) for e in ledger.store.events(approval_id=edited.approval_id)}
    assert details["amended"]["edited_by"] == "sam"
    assert "$redacted" in details["amended"]
    assert details["amended"]["previous_hash"]
    approved = details["approved"]
    assert {k: approved[k] for k in ("approver", "role")} == {"approver": "fiona", "role": "finance"}
    assert set(details["executed"]) == {"$redacted"}  # the idempotency key: not part of the chain
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring).clean


def test_retention_reaches_events_that_name_no_effect_class(ledger: EffectGate, clock: FakeClock) -> None:
    """A refusal of a tool absent from the table names no effect class: no effect's rule reaches
    it, the `unclassified` kind does (by age, skipping held users), and the audit stays clean."""
    store = ledger.store
    hold(store, user_id="u2", by="legal", reason="case")
    for user in ("u1", "u2"):
        refused = ledger.call("wire_funds_to", {"iban": "GB00 ADA"}, context(f"x-{user}", user_id=user))
        assert not isinstance(refused, Executed | Pending)
    ledger.flush()

    def unknown() -> dict[str, str]:
        return {e.user_id: e.detail_json for e in store.events(kind="refused") if e.effect is None}

    assert all("wire_funds_to" in detail for detail in unknown().values())
    clock.advance(31 * 86400)
    every_effect = {"read": 30, "write": 30, "send": 30, "money": 30, "destructive": 30}
    retain(store, ledger.keyring, every_effect, by="nightly", now=clock.now())
    assert all(not d.startswith('{"$redacted"') for d in unknown().values())  # no effect reaches them
    done = retain(store, ledger.keyring, {"unclassified": 30}, by="nightly", now=clock.now())
    assert done.held == ("u2",)
    assert unknown()["u1"].startswith('{"$redacted"')
    assert "wire_funds_to" in unknown()["u2"]  # held
    assert done.rows == 1
    assert audit(store, ledger.table, keyring=ledger.keyring).clean


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"reads": 30}, "unknown record kind"),
        ({"read": -1}, ">= 0"),
        ({"money": float("nan")}, ">= 0"),
        ({"money": float("inf")}, ">= 0"),
        ({"money": float("-inf")}, ">= 0"),
    ],
)
def test_retention_refuses_bad_rules(ledger: EffectGate, rules: dict[str, float], message: str) -> None:
    """A rule that is no finite number of days >= 0 is refused and nothing is written (no event)."""
    snapshot = everything(ledger.store)
    with pytest.raises(RedactionError, match=message):
        retain(ledger.store, ledger.keyring, rules, by="nightly")
    assert everything(ledger.store) == snapshot


def foreign_keyrings(own: Keyring) -> list[Keyring]:
    """Another environment's keyring, and one that reuses the ledger's key id with another secret."""
    return [Keyring.generate(), Keyring({own.current: bytes(range(32))}, current=own.current)]


@pytest.mark.parametrize("sealed", [False, True], ids=["unchained", "checkpointed"])
def test_a_foreign_keyring_is_refused_before_anything_is_erased(
    ledger: EffectGate, clock: FakeClock, sealed: bool
) -> None:
    """A redaction or retention pass with a keyring that is not the ledger's erases nothing (its
    commitments could never be checked): the ledger's own keyring still finds it clean."""
    store = ledger.store
    if sealed:
        seal_chain(store, ledger.keyring, now=clock.now() + 61)
    snapshot = everything(store)
    for foreign in foreign_keyrings(ledger.keyring):
        with pytest.raises(TokenError, match="not the ledger's") as raised:
            redact(store, foreign, user_id="u1", by="dpo", reason="erasure")
        assert raised.value.reason == "keyring_mismatch"
        with pytest.raises(TokenError, match="not the ledger's"):
            retain(store, foreign, {"read": 0, "money": 0}, by="nightly", now=clock.now() + 86400)
        assert everything(store) == snapshot
    assert audit(store, ledger.table, keyring=ledger.keyring, chain=True).clean
    assert redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure").values > 0
    assert audit(store, ledger.table, keyring=ledger.keyring, chain=True).clean


def test_a_keyring_that_added_a_key_still_erases(ledger: EffectGate) -> None:
    """Rotation by adding a key: the new keyring holds the ledger's key, so it is the ledger's."""
    rotated = Keyring.parse(f"new:{bytes(range(1, 33)).hex()},{ledger.keyring.dumps()}")
    assert redact(ledger.store, rotated, user_id="u1", by="dpo", reason="erasure").values > 0
    assert audit(ledger.store, ledger.table, keyring=rotated).clean


def test_an_approved_shadow_call_is_not_open(make_gate: MakeGate, clock: FakeClock) -> None:
    """An approved shadow call never runs, so it neither blocks a redaction nor escapes retention."""
    gate = make_gate(Shop().table().shadowed(["refund_order"]), policy=SHOP_POLICY)
    args = {"order_id": "1042", "amount": 500, "currency": "GBP"}
    out = gate.call("refund_order", args, context("m1"))
    assert isinstance(out, Refused)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Recorded)
    gate.flush()
    assert [a.status for a in gate.store.approvals()] == ["approved"]
    done = retain(gate.store, gate.keyring, {"money": 0}, by="nightly", now=clock.now() + 1)
    assert done.values > 0
    assert gate.store.approvals()[0].args_json.startswith('{"$redacted"')
    assert redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure", now=clock.now())
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_an_approved_call_whose_grant_lapsed_after_its_deadline_is_not_open(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """A grant that lapsed unpresented can be renewed only before the approval's deadline; after
    it the call can never run, so it is erased like a decided one. Before it, it is still open."""
    gate = shop_gate.gate
    args = {"order_id": "1042", "amount": 500, "currency": "GBP"}
    pending = gate.call("refund_order", args, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    row = gate.store.get_approval(pending.approval_id)
    assert row is not None
    assert row.token_expires_at is not None
    gate.flush()
    for at in (row.token_expires_at + 1, row.expires_at - 1):  # lapsed, but may be granted again
        with pytest.raises(RedactionError, match="may still run"):
            redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure", now=at)
    clock.advance(row.expires_at - clock.now() + 1)
    done = retain(gate.store, gate.keyring, {"money": 0}, by="nightly", now=clock.now())
    assert done.values > 0
    assert gate.store.approvals()[0].args_json.startswith('{"$redacted"')
    assert redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure", now=clock.now())
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_replay_lists_redacted_intents_without_calling_them_changed(ledger: EffectGate) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    report = replay(ledger.store, ledger.table, ledger.policy)
    ada = sorted(a.id for a in ledger.store.approvals() if a.user_id == "u1")
    assert sorted(report.redacted) == ada
    assert [r.verdict for r in report.results] == ["same"]  # Grace's refund
    assert report.clean


def test_a_redacted_approvals_card_says_so_and_is_not_called_tampered(ledger: EffectGate) -> None:
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    ada = next(a for a in ledger.store.approvals() if a.tool == "refund_order" and a.user_id == "u1")
    card = ledger.card(ada.id)
    assert REDACTED_NOTE in card.warnings
    assert TAMPERED_WARNING not in card.warnings
    assert {k: v for k, v in card.args.items() if k != "$redacted"} == {"amount": 1200, "currency": "GBP"}
    assert card.notes == ()
    assert (card.args_hash, card.status) == (ada.args_hash, "executed")
