"""Round 18: erasure and retention (SQLite and PostgreSQL). Retention measures each row's age by
the ledger's clock (a write's idempotency record as young as its last run, not its first); a kept
amount edited after a redaction is not counted by a business check; holds read back from their
events still keep retention off; and (strict xfail) a write still running blocks its user's
redaction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, Executed, Refused
from effectgate.audit import audit
from effectgate.effects import Effect
from effectgate.examples.shop import context
from effectgate.export import export_chain, verify_export
from effectgate.redact import DAY, RedactionError, hold, redact, retain
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_redact import ADA_EMAIL, everything
from .test_redact import ledger as ledger


def test_a_write_still_running_blocks_the_redaction_of_its_user(shop_gate: ShopGate) -> None:
    """A write claimed and running (no execution row yet) is a call that may still run: a
    redaction of its user while it runs must be refused, or the write stores its personal
    arguments and result after an erasure that reported success."""
    gate: EffectGate = shop_gate.gate
    seen: list[Any] = []
    record = shop_gate.shop.receiver.record

    def during(kind: str, **fields: Any) -> None:
        try:
            seen.append(redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="r77"))
        except RedactionError as exc:
            seen.append(exc)
        record(kind, **fields)

    shop_gate.shop.receiver.record = during  # type: ignore[method-assign]
    tags = {"ticket_id": "t-17", "tags": ["billing", "ada-vip"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    [outcome] = seen
    assert isinstance(outcome, RedactionError), outcome
    assert "ada-vip" in everything(gate.store)


def test_retention_leaves_a_write_record_younger_than_its_rule(shop_gate: ShopGate, clock: FakeClock) -> None:
    """A write that failed (day 0) and ran again under the same key (day 20): the record holds
    the second run's result, 20 days old. `retain write=30` on day 31 erases the first run's
    execution, and must leave the record (and the second run) alone: it is younger than the rule."""
    gate, store = shop_gate.gate, shop_gate.gate.store
    tags = {"ticket_id": "t-17", "tags": ["ada-vip"]}
    receiver = shop_gate.shop.receiver
    record = receiver.record

    def down(kind: str, **fields: Any) -> None:
        raise ValueError("ticket service down")  # a definite failure of a write

    receiver.record = down  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="ticket service down"):
        gate.call("update_ticket_tags", tags, context("m1"))
    receiver.record = record  # type: ignore[method-assign]
    clock.advance(20 * DAY)
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    clock.advance(11 * DAY)
    retain(store, gate.keyring, {"write": 30}, by="nightly", now=clock.now())
    [second] = [e for e in store.executions() if e.status == "succeeded"]
    assert "ada-vip" in (second.result_json or "")
    record = store.get(second.idempotency_key)
    assert record is not None
    assert "ada-vip" in json.dumps(record.result)


def test_retention_measures_ages_by_the_ledgers_clock(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Rows are stamped by the store's clock; a pass given no `now` measured their ages by the
    wall clock instead, so a ledger whose clock is ahead kept a 40-day-old write past `write=30`
    (and one behind would erase records younger than the rule). The ledger's clock decides."""
    gate, store = shop_gate.gate, shop_gate.gate.store
    tags = {"ticket_id": "t-17", "tags": ["ada-vip"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    clock.advance(40 * DAY)  # by the ledger's clock (the wall clock may be behind it, or ahead)
    done = retain(store, gate.keyring, {"write": 30}, by="nightly")
    assert done.values > 0
    assert "ada-vip" not in everything(store)
    assert [json.loads(e.detail_json)["redaction_id"] for e in store.events(kind="redacted")] == [done.id]
    [event] = store.events(kind="redacted")
    assert event.at == clock.now()


def test_after_a_retention_pass_the_ledger_audits_clean_and_its_exports_verify(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    """Every kind erased by age (Grace held): the chain still verifies, before and after."""
    store, keyring = ledger.store, ledger.keyring
    first = tmp_path / "before.jsonl"
    manifest = export_chain(store, keyring, first, now=clock.now() + 61)
    hold(store, user_id="u2", by="legal", reason="case 18")
    clock.advance(2 * DAY)
    rules = {str(e): 1 for e in Effect} | {"unclassified": 1}
    done = retain(store, keyring, rules, by="nightly")
    assert done.values > 0
    assert done.held == ("u2",)
    text = everything(store)
    assert ADA_EMAIL not in text
    assert "ada-vip" not in text
    assert '"2001"' in text  # the held user's records stay
    assert verify_export(first, keyring).ok
    later = tmp_path / "after.jsonl"
    export_chain(store, keyring, later, after=manifest, now=clock.now() + 61)
    assert verify_export(later, keyring, after=manifest).ok
    whole = tmp_path / "whole.jsonl"
    export_chain(store, keyring, whole, now=clock.now() + 61)
    assert verify_export(whole, keyring).ok
    report = audit(store, ledger.table, keyring=keyring)
    assert report.clean, report.findings


def test_a_kept_amount_forged_after_the_redaction_does_not_raise_the_refundable_balance(
    ledger: EffectGate,
) -> None:
    """Ada's refund of 1200 on 1042 is erased, its amount kept. Editing the kept amount in the
    approval's marker (and its executions') to 1 must not make 10801 refundable."""
    store = ledger.store
    redact(store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    with store.transaction() as conn:
        for table in ("eg_approvals", "eg_executions"):
            conn.exec_driver_sql(
                f"UPDATE {table} SET args_json = REPLACE(args_json, '\"amount\":1200', '\"amount\":1') "
                "WHERE tool = 'refund_order' AND user_id = 'u1'"
            )
    assert '"amount":1,' in everything(store)
    over = ledger.call(
        "refund_order", {"order_id": "1042", "amount": 10801, "currency": "GBP"}, context("m9")
    )
    assert isinstance(over, Refused), over
    assert "does not verify" in over.message
    assert [a.args_json for a in store.approvals() if a.status == "pending"] == []  # no approver sees it


def test_retention_skips_a_user_whose_hold_row_was_deleted_or_moved(
    ledger: EffectGate, clock: FakeClock
) -> None:
    """Holds are read back from their events: a hold row deleted, or moved to another user, in the
    database alone still keeps retention off the user its `hold` event names."""
    store = ledger.store
    placed = hold(store, user_id="u2", by="legal", reason="case 18")
    hold(store, user_id="u1", by="legal", reason="case 19")
    with store.transaction() as conn:
        conn.exec_driver_sql(f"DELETE FROM eg_holds WHERE id = '{placed.id}'")
        conn.exec_driver_sql("UPDATE eg_holds SET user_id = 'nobody' WHERE user_id = 'u1'")
    clock.advance(2 * DAY)
    rules = {str(e): 1 for e in Effect} | {"unclassified": 1}
    done = retain(store, ledger.keyring, rules, by="nightly")
    assert done.values == 0
    assert {"u1", "u2"} <= set(done.held)
    assert ADA_EMAIL in everything(store)
    with pytest.raises(RedactionError, match="legal hold"):
        redact(store, ledger.keyring, user_id="u2", by="dpo", reason="r")
