"""A future-dated row (the database's owner inserting one, or a host whose clock is far ahead)
does not freeze the ledger's chain or the export, on SQLite and PostgreSQL: rows are checkpointed
and exported in id order up to the last settled one, so the rows after it are still covered by
the next checkpoint and written by the next export, while recent rows at the end still wait."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from effectgate import EffectGate, Executed
from effectgate._seal import stored_args_hash
from effectgate.audit import audit
from effectgate.chain import verify_chain
from effectgate.examples.shop import context
from effectgate.export import export_chain, manifest_path
from effectgate.stores import SQLStore
from effectgate.stores.records import ChainRow
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_chain import sql, unguard
from .test_export import TAGS, lines, refund

FUTURE = 4.0e9  # the year 2096


def last_id(gate: EffectGate, tool: str) -> int:
    [*_, last] = [e.id for e in gate.store.executions(tool=tool)]
    assert last is not None
    return last


def executions_checkpoints(store: SQLStore) -> list[ChainRow]:
    with store.reading() as conn:
        return [c for c in store.checkpoints(conn) if c.table_name == "eg_executions"]


def insert_future_write(store: SQLStore) -> int:
    """An INSERT the append-only triggers let through: a copy of the first execution (a write),
    with other arguments, dated in 2096. Returns its id."""
    with store.transaction() as conn:
        row = dict(conn.execute(sa.text("SELECT * FROM eg_executions ORDER BY id")).mappings().first() or {})
        args = '{"tags":["b"],"ticket_id":"t-17"}'
        row.pop("id")
        row.update(at=FUTURE, args_json=args, idempotency_key="future-1")
        row["args_hash"] = stored_args_hash(str(row["tool"]), args)
        names = ", ".join(row)
        marks = ", ".join(f":{name}" for name in row)
        conn.execute(sa.text(f"INSERT INTO eg_executions ({names}) VALUES ({marks})"), row)
        found = conn.execute(sa.text("SELECT max(id) FROM eg_executions")).scalar_one()
    return int(found)


def test_a_future_dated_row_does_not_hold_back_the_chain_or_the_export(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """Records after a future-dated row are exported and checkpointed; a later deletion of one of
    them is a chain_broken finding. Without the fix the second export wrote nothing."""
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    first = tmp_path / "one.jsonl"
    before = export_chain(gate.store, gate.keyring, first, now=clock.now() + 61)
    future = insert_future_write(store)
    clock.advance(5)
    refund(gate, "m2", 1200)
    done = last_id(gate, "refund_order")
    second = tmp_path / "two.jsonl"
    after = export_chain(gate.store, gate.keyring, second, after=before, now=clock.now() + 61)
    assert [line["seq"] for line in lines(second)] == [future, done]
    assert after.after_seq == done
    assert executions_checkpoints(store)[-1].last_id == done
    # the refund is covered: deleting it now is found
    unguard(store, "eg_executions")
    sql(store, "DELETE FROM eg_executions WHERE id = :id", id=done)
    [broken] = verify_chain(gate.store, gate.keyring)
    assert broken.table == "eg_executions"
    assert "chain_broken" in {f.kind for f in audit(gate.store, keyring=gate.keyring, chain=True).findings}
    assert manifest_path(second).exists()


def test_recent_rows_after_the_last_settled_one_still_wait(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """The settle window holds: a future-dated row and a recent one at the end of the ledger are
    neither checkpointed nor exported until a row after them has settled."""
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    clock.advance(100)
    write = last_id(gate, "update_ticket_tags")
    future = insert_future_write(store)
    refund(gate, "m2", 1200)  # recent: inside the settle window below
    done = last_id(gate, "refund_order")
    early = export_chain(gate.store, gate.keyring, tmp_path / "a.jsonl", now=clock.now() + 1, settle=60)
    assert [line["seq"] for line in lines(tmp_path / "a.jsonl")] == [write]
    [executions] = executions_checkpoints(store)
    assert executions.last_id == write
    later = export_chain(
        gate.store, gate.keyring, tmp_path / "b.jsonl", after=early, now=clock.now() + 61, settle=60
    )
    assert [line["seq"] for line in lines(tmp_path / "b.jsonl")] == [future, done]
    assert later.after_seq == done
