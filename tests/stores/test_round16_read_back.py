"""Round 16, stores: rows whose columns were edited to odd types, read back (SQLite keeps any
type in any column once someone edits the file; PostgreSQL keeps NaN, Infinity and negative
numbers in its typed columns).

Defects found (each test failed before its fix):
- an intent key whose `version` was edited to text: a replay of its message raised a bare
  `ValueError: invalid literal for int()` from the store (and a huge real was taken as a version
  number): now a `StoreError` naming the key, nothing written, the gate's other calls unaffected.
- an idempotency record whose `attempts` was edited to text: the retry of its failed write raised
  `TypeError: can only concatenate str (not "int") to str` from the claim: now a `StoreError`
  naming the record, the tool not run, the record left as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
)
from effectgate.errors import StoreError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

FINANCE = Approver("fiona", "finance")
SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # PostgreSQL refuses text there


@dataclasses.dataclass
class Shop:
    gate: EffectGate
    receiver: EffectRecorder
    failing: list[bool]


@pytest.fixture
def shop(store: SQLStore, clock: FakeClock) -> Iterator[Shop]:
    """A gate whose `pay` (money, finance approves) and `note` (a write, failing while `failing`)
    record their effects at the receiver."""
    receiver, failing = EffectRecorder(), [False]

    def pay(account: str, amount: int) -> dict[str, Any]:
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    def note(text: str) -> dict[str, str]:
        if failing[0]:
            raise ValueError("the notes service said no")
        receiver.record("note", text=text)
        return {"noted": text}

    table = EffectTable(
        [
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",)),
            ToolSpec(name="note", effect=Effect.WRITE, fn=note),
        ]
    )
    table.allow("support", ["pay", "note"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    yield Shop(gate, receiver, failing)
    gate.close()


def _ctx(session: str, message: str) -> Any:
    return dataclasses.replace(context(message), session_id=session)


def _paid(receiver: EffectRecorder, kind: str) -> list[dict[str, Any]]:
    """What reached the receiver, in order."""
    return [dict(e.payload) for e in receiver.effects if e.kind == kind]


def _edit(store: SQLStore, sql: str, **params: Any) -> None:
    with store.transaction() as conn:
        conn.execute(sa.text(sql), params)


def _counts(store: SQLStore) -> tuple[int, ...]:
    return (
        len(store.approvals()),
        len(store.events()),
        len(store.executions()),
        len(store.idempotency_records()),
    )


def _pay_through(shop: Shop, account: str, session: str) -> None:
    """A payment proposed, approved and executed: it reaches the receiver once."""
    pending = shop.gate.call("pay", {"account": account, "amount": 7}, _ctx(session, f"m-{account}"))
    assert isinstance(pending, Pending), pending
    grant = shop.gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(shop.gate.execute(grant.token), Executed)
    assert [p for p in _paid(shop.receiver, "pay") if p["account"] == account] == [
        {"account": account, "amount": 7}
    ]


@SQLITE_ONLY
def test_an_intent_key_whose_version_was_edited_to_text_is_a_store_error_naming_it(
    shop: Shop, store: SQLStore
) -> None:
    """A replay whose intent key's version is no number is a StoreError naming the key; nothing is
    written, and the gate's other calls (same session, other sessions) still run."""
    pending = shop.gate.call("pay", {"account": "a1", "amount": 5}, _ctx("s1", "m1"))
    assert isinstance(pending, Pending)
    _edit(store, "UPDATE eg_intent_keys SET version = 'v' WHERE approval_id = :a", a=pending.approval_id)
    before = _counts(store)
    with pytest.raises(StoreError, match=r"intent key .*version is not a version number"):
        shop.gate.call("pay", {"account": "a1", "amount": 5}, _ctx("s1", "m1"))
    assert _counts(store) == before
    _pay_through(shop, "a2", "s1")
    _pay_through(shop, "a3", "s2")


@SQLITE_ONLY
def test_an_intent_key_whose_version_was_edited_to_a_huge_real_is_not_taken_as_a_version(
    shop: Shop, store: SQLStore
) -> None:
    """A version edited to 1e23 (SQLite stores it as a real) is not a version number either."""
    pending = shop.gate.call("pay", {"account": "a1", "amount": 5}, _ctx("s1", "m1"))
    assert isinstance(pending, Pending)
    _edit(store, "UPDATE eg_intent_keys SET version = 1e23 WHERE approval_id = :a", a=pending.approval_id)
    with pytest.raises(StoreError, match="intent key"):
        shop.gate.call("pay", {"account": "a1", "amount": 5}, _ctx("s1", "m1"))
    assert store.get_approval(pending.approval_id).status == "pending"  # type: ignore[union-attr]


@SQLITE_ONLY
def test_a_record_whose_attempts_were_edited_to_text_is_a_store_error_on_retry(
    shop: Shop, store: SQLStore
) -> None:
    """The retry of a failed write whose record's attempts are no count is a StoreError naming
    the record: the tool does not run, the record is left as it was, other writes run."""
    shop.failing[0] = True
    with pytest.raises(ValueError, match="said no"):
        shop.gate.call("note", {"text": "a"}, context("m1"))
    shop.failing[0] = False
    [record] = store.idempotency_records()
    assert record.status == "failed"
    _edit(store, "UPDATE eg_idempotency SET attempts = 'x' WHERE \"key\" = :k", k=record.key)
    with pytest.raises(StoreError, match=f"idempotency record {record.key}: its attempts"):
        shop.gate.call("note", {"text": "a"}, context("m1"))
    assert shop.receiver.count("note") == 0
    after = store.get(record.key)
    assert after is not None
    assert (after.status, after.attempts) == ("failed", "x")
    assert isinstance(shop.gate.call("note", {"text": "b"}, context("m2")), Executed)
    assert _paid(shop.receiver, "note") == [{"text": "b"}]


#: Odd values each database keeps in an approval's or intent key's columns: (column, SQLite, PostgreSQL)
ODD = [
    ("expires_at", "'soon'", "'NaN'"),
    ("expires_at", "1e999", "'Infinity'"),
    ("expires_at", "-1e999", "'-Infinity'"),
    ("grants", "'many'", "-1"),
    ("version", "99999999999999999999", "-7"),
    ("created_at", "x'01'", "'NaN'"),
]


@pytest.mark.parametrize(("column", "on_sqlite", "on_postgres"), ODD)
def test_an_approval_edited_to_odd_values_never_stops_the_other_approvals(
    shop: Shop, store: SQLStore, clock: FakeClock, column: str, on_sqlite: str, on_postgres: str
) -> None:
    """One approval with an odd value in a column: listings, expiry, recovery and the audit still
    run, and the other approvals (same subject from another session included) still flow."""
    victim = shop.gate.call("pay", {"account": "a1", "amount": 5}, _ctx("s1", "m1"))
    assert isinstance(victim, Pending)
    value = on_sqlite if store.engine.dialect.name == "sqlite" else on_postgres
    _edit(store, f"UPDATE eg_approvals SET {column} = {value} WHERE id = :a", a=victim.approval_id)
    store.approvals()
    shop.gate.pending()
    shop.gate.expire()
    shop.gate.warn_expiring(within=10**9)
    shop.gate.recover()
    _pay_through(shop, "a2", "s1")
    clock.advance(1)
    shop.gate.audit()
    row = store.get_approval(victim.approval_id)
    assert row is not None
    assert _paid(shop.receiver, "pay") == [{"account": "a2", "amount": 7}]
