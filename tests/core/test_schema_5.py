"""Schema 5: an idempotency record names the user its call is made for, so `redact` finds a
user's call in flight before any other row names it (tests/core/test_round7_erasure.py and
test_round18_governance.py reproduce the erasure it allowed). A version 4 database is refused
until `setup` adds the column in place, keeping every row. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Executed
from effectgate._execution import WRITE_PREFIX
from effectgate.audit import audit
from effectgate.errors import StoreError
from effectgate.redact import DAY, RedactionError, hold, redact, retain
from effectgate.stores import SQLStore, open_store
from effectgate.stores._unnamed import WRITE_KEYS
from effectgate.stores.records import SCHEMA_VERSION
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_redact import everything
from .test_round7_erasure import ALL_KINDS, SECRET, Notes, _ctx, _Died


def _users(store: SQLStore) -> list[tuple[str, str | None]]:
    with store.reading() as conn:
        return [
            (k, u) for k, u in conn.exec_driver_sql("SELECT key, user_id FROM eg_idempotency ORDER BY key")
        ]


def test_a_write_records_its_user_with_its_claim(make_gate: MakeGate, store: SQLStore) -> None:
    notes = Notes()
    gate = make_gate(notes.table())
    assert isinstance(gate.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1")), Executed)
    [(key, user)] = _users(store)
    assert user == "u1"
    assert store.get(key).user_id == "u1"  # type: ignore[union-attr]


def test_a_version_4_database_gains_the_column_in_place_keeping_every_row(
    make_gate: MakeGate, store: SQLStore, store_url: str, clock: FakeClock
) -> None:
    notes = Notes()
    gate = make_gate(notes.table())
    assert isinstance(gate.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1")), Executed)
    gate.flush()
    before = [(r.key, r.status, r.result) for r in store.idempotency_records()]
    with store.transaction() as conn:  # what schema 4 left: no user_id column
        conn.exec_driver_sql("ALTER TABLE eg_idempotency DROP COLUMN user_id")
        conn.exec_driver_sql("UPDATE eg_schema_version SET version = 4")
    old = open_store(store_url, clock=clock)
    try:
        with pytest.raises(StoreError, match="schema version 4; run `effectgate setup`"):
            old.check()
        old.setup()
        old.check()
        with old.reading() as conn:
            assert conn.execute(sa.text("SELECT version FROM eg_schema_version")).scalar() == SCHEMA_VERSION
        assert [(r.key, r.status, r.result) for r in old.idempotency_records()] == before
        assert [user for _, user in _users(old)] == [None]  # written before: names no user
        old.setup()  # run again: nothing to add, nothing changes
        assert [(r.key, r.status, r.result) for r in old.idempotency_records()] == before
    finally:
        old.close()
    assert isinstance(gate.call("post", {"ticket_id": "t-2", "text": "x"}, _ctx("m2")), Executed)
    assert sorted(user or "" for _, user in _users(store)) == ["", "u1"]


def test_a_redaction_of_another_user_is_not_refused_by_a_write_in_flight(make_gate: MakeGate) -> None:
    """The user's own records only: u2's erasure goes on while u1's write runs."""
    notes = Notes()
    gate = make_gate(notes.table())
    outcome: list[object] = []

    def erase() -> None:
        try:
            outcome.append(redact(gate.store, gate.keyring, user_id="u2", by="dpo", reason="request"))
        except RedactionError as exc:
            outcome.append(exc)

    notes.during = erase
    assert isinstance(gate.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1")), Executed)
    [done] = outcome
    assert not isinstance(done, RedactionError), done


def test_the_write_key_prefix_retention_reads_is_the_gates() -> None:
    assert WRITE_KEYS == WRITE_PREFIX


def _dead_write(make_gate: MakeGate, clock: FakeClock, notes: Notes, user: str, text: str) -> EffectGate:
    """A write of `user` whose worker died mid-run, recovered by a second gate (no execution row)."""

    def die() -> None:
        raise _Died

    gate = make_gate(notes.table())
    notes.during = die
    with pytest.raises(_Died):
        gate.call("post", {"ticket_id": f"t-{user}", "text": text}, _ctx("m1", user))
    notes.during = None
    gate.close()
    gate = make_gate(notes.table(), keyring=gate.keyring)
    clock.advance(gate.policy.lease_seconds + 1)
    assert gate.recover()
    return gate


def test_retention_of_dead_writes_leaves_a_held_users_record_and_a_store_run_record(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    notes = Notes()
    _dead_write(make_gate, clock, notes, "u1", SECRET)
    gate = _dead_write(make_gate, clock, notes, "u2", "held-" + SECRET)
    store.run("w_own", "h" * 64, lambda: {"kept": "own-" + SECRET})  # no user: not a gate's write
    hold(store, user_id="u2", by="legal", reason="case 5")
    clock.advance(2 * DAY)
    retain(store, gate.keyring, dict.fromkeys(ALL_KINDS, 1), by="nightly", now=clock.now())
    left = everything(store)
    assert f'"{SECRET}' not in left  # u1's record erased
    assert f"'{SECRET}" not in left
    assert "held-" + SECRET in left
    assert "own-" + SECRET in left
    assert audit(store, gate.table, keyring=gate.keyring).clean
