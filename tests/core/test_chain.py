"""The ledger's own hash chain (issue 18): signed checkpoints over the append-only tables, so the
audit finds a row deleted, inserted or edited in the database between two exports, on SQLite and
PostgreSQL. The attacker here has the database's owner rights: the append-only triggers are
dropped first (they stop the application, not the owner)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate.audit import audit
from effectgate.chain import ChainError, seal_chain, verify_chain
from effectgate.errors import TokenError
from effectgate.examples.shop import context
from effectgate.export import ExportError, export_chain
from effectgate.redact import redact
from effectgate.stores import SQLStore
from effectgate.stores.records import ChainRow
from effectgate.testing import FakeClock

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")


def unguard(store: SQLStore, table: str) -> None:
    """Drop a table's append-only triggers, as the database's owner can."""
    with store.transaction() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_update")
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_delete")
        else:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")


def sql(store: SQLStore, statement: str, **params: object) -> None:
    with store.transaction() as conn:
        conn.execute(sa.text(statement), params)


@pytest.fixture
def ledger(shop_gate: ShopGate, clock: FakeClock) -> EffectGate:
    """Reads, a write and an executed refund, checkpointed."""
    gate = shop_gate.gate
    assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m0")), Executed)
    tags = {"ticket_id": "t-17", "tags": ["billing"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    pending = gate.call(
        "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m2")
    )
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    gate.flush()
    made = seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    assert {c.table_name for c in made} == {"eg_decisions", "eg_executions", "eg_events"}
    return gate


def test_an_untouched_ledger_verifies_and_a_second_seal_continues_the_chain(
    ledger: EffectGate, clock: FakeClock
) -> None:
    assert verify_chain(ledger.store, ledger.keyring) == []
    assert seal_chain(ledger.store, ledger.keyring, now=clock.now() + 61) == []  # nothing new
    clock.advance(10)
    assert isinstance(ledger.call("get_order", {"order_id": "1043"}, context("m3")), Executed)
    ledger.flush()
    # inside the settle window: waits; after it: one more checkpoint continuing the last
    assert seal_chain(ledger.store, ledger.keyring, now=clock.now() + 1) == []
    [more] = seal_chain(ledger.store, ledger.keyring, now=clock.now() + 61)
    assert (more.table_name, more.count) == ("eg_events", 1)
    assert verify_chain(ledger.store, ledger.keyring) == []
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring, chain=True).clean


@pytest.mark.parametrize("change", ["deleted", "edited", "inserted", "marker"])
def test_a_row_changed_after_its_checkpoint_is_named(ledger: EffectGate, change: str) -> None:
    store = ledger.store
    unguard(store, "eg_events")
    [first, *_] = [e for e in store.events() if e.kind != "refused"]
    if change == "deleted":
        sql(store, "DELETE FROM eg_events WHERE id = :id", id=first.id)
    elif change == "edited":
        sql(store, "UPDATE eg_events SET user_id = 'u2' WHERE id = :id", id=first.id)
    elif change == "inserted":  # a row slipped in below the checkpointed ids
        sql(store, "DELETE FROM eg_events WHERE id = :id", id=first.id)
        sql(
            store,
            "INSERT INTO eg_events (id, at, kind, detail_json) VALUES (:id, :at, 'executed', '{}')",
            id=first.id,
            at=first.at,
        )
    else:  # a marker the trigger lets in, written by no redaction
        sql(store, """UPDATE eg_events SET detail_json = '{"$redacted":"r-x"}' WHERE id = :id""", id=first.id)
    [broken] = verify_chain(store, ledger.keyring)
    assert broken.table == "eg_events"
    assert broken.first_id is not None
    assert broken.last_id is not None
    assert broken.first_id <= first.id <= broken.last_id
    findings = audit(store, ledger.table, keyring=ledger.keyring, chain=True).findings
    forged = ["redaction_forged"] if change == "marker" else []  # a marker no redaction wrote
    assert [f.kind for f in findings] == [*forged, "chain_broken"]


def test_a_redaction_after_the_checkpoint_keeps_the_chain(ledger: EffectGate, clock: FakeClock) -> None:
    done = redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    assert done.values > 0
    assert verify_chain(ledger.store, ledger.keyring) == []
    seal_chain(ledger.store, ledger.keyring, now=clock.now() + 61)  # the redaction event itself
    assert verify_chain(ledger.store, ledger.keyring) == []


def test_a_forged_checkpoint_is_named_and_stops_the_next_seal(ledger: EffectGate, clock: FakeClock) -> None:
    store = ledger.store
    unguard(store, "eg_chain")
    sql(store, "UPDATE eg_chain SET signature = 'k.forged' WHERE table_name = 'eg_executions'")
    problems = [b.problem for b in verify_chain(store, ledger.keyring)]
    assert any("signature" in p for p in problems)
    with pytest.raises(ChainError, match="does not verify"):
        seal_chain(store, ledger.keyring, now=clock.now() + 61)


def test_an_export_is_refused_after_a_row_was_deleted(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    store = ledger.store
    unguard(store, "eg_executions")
    sql(store, "DELETE FROM eg_executions WHERE tool = 'update_ticket_tags'")
    with pytest.raises(ExportError, match="chain_broken"):
        export_chain(store, ledger.keyring, tmp_path / "x.jsonl", now=clock.now() + 61)
    assert not (tmp_path / "x.jsonl").exists()


def checkpoints(store: SQLStore) -> list[ChainRow]:
    with store.reading() as conn:
        return list(store.checkpoints(conn))


def foreign_keyrings(own: Keyring) -> list[Keyring]:
    """Another environment's keyring, and one that reuses the ledger's key id with another secret."""
    return [Keyring.generate(), Keyring({own.current: bytes(range(32))}, current=own.current)]


def test_a_foreign_keyring_appends_no_checkpoint(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """A seal (and so an export) with a keyring that is not the ledger's is refused before it
    appends anything, whether the ledger has checkpoints yet or not; the ledger's keyring then
    seals and exports as before."""
    gate = shop_gate.gate
    pending = gate.call("refund_order", {"order_id": "1042", "amount": 5, "currency": "GBP"}, context("m1"))
    assert isinstance(pending, Pending)
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
    gate.flush()
    for sealed in (False, True):
        if sealed:
            assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
            assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m2")), Executed)
            gate.flush()
        before = checkpoints(gate.store)
        for foreign in foreign_keyrings(gate.keyring):
            with pytest.raises(TokenError, match="not the ledger's") as raised:
                seal_chain(gate.store, foreign, now=clock.now() + 61)
            assert raised.value.reason == "keyring_mismatch"
            with pytest.raises(TokenError, match="not the ledger's"):
                export_chain(gate.store, foreign, tmp_path / "x.jsonl", now=clock.now() + 61)
            assert not (tmp_path / "x.jsonl").exists()
            assert checkpoints(gate.store) == before
    assert audit(gate.store, gate.table, keyring=gate.keyring, chain=True).clean
    export_chain(gate.store, gate.keyring, tmp_path / "x.jsonl", now=clock.now() + 61)


def erase_in_a_thread(gate: EffectGate) -> threading.Thread:
    def run() -> None:
        redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="concurrent erasure")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("when", ["before_its_transaction", "during_its_transaction"])
def test_a_redaction_committing_while_a_seal_runs_keeps_the_chain(
    shop_gate: ShopGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A seal reads the redaction entries and the rows they erased as of one moment: a redaction
    that commits while the seal runs (after it read the entries, or while it streams the rows)
    either is wholly seen or waits, so every checkpoint still verifies."""
    gate = shop_gate.gate
    store = gate.store
    pending = gate.call("refund_order", {"order_id": "1042", "amount": 5, "currency": "GBP"}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    gate.flush()
    threads: list[threading.Thread] = []
    state = {"read": False, "fired": False}
    if when == "before_its_transaction":  # the entries were read; the next transaction is the seal's
        read_entries = store.redacted
        transaction = store.transaction

        def redacted(conn: Any) -> Any:
            state["read"] = True
            return read_entries(conn)

        def next_transaction() -> Any:
            if state["read"] and not state["fired"]:
                state["fired"] = True
                redact(store, gate.keyring, user_id="u1", by="dpo", reason="concurrent erasure")
            return transaction()

        monkeypatch.setattr(store, "redacted", redacted)
        monkeypatch.setattr(store, "transaction", next_transaction)
    else:  # a redaction starts while the seal streams the rows: it commits or waits
        chain_rows = store.chain_rows

        def rows(*args: Any, **kwargs: Any) -> Any:
            if not threads:
                threads.append(erase_in_a_thread(gate))
                threads[0].join(timeout=1.5)
            return chain_rows(*args, **kwargs)

        monkeypatch.setattr(store, "chain_rows", rows)
    assert seal_chain(store, gate.keyring, now=clock.now() + 61)
    monkeypatch.undo()
    for thread in threads:
        thread.join(timeout=60)
    if when == "before_its_transaction" and not state["fired"]:  # the seal took no second transaction
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure after the seal")
    assert any(e.kind == "redacted" for e in store.events())
    assert verify_chain(store, gate.keyring) == []
    assert audit(store, gate.table, keyring=gate.keyring, chain=True).clean
