"""Governance work done once per pass, on SQLite and PostgreSQL: a retention pass reads the
redaction entries (`eg_redacted`) once however many rules it applies, and a redaction, a retention
pass or a seal reads the chain's checkpoints (`eg_chain`) once, sharing them between the keyring
check and the seal. Counted as the SELECT statements the store's engine sends for each table; the
results (what is erased, the checkpoints, the refusals) stay as they were."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate._erasure import _entered, _erase
from effectgate.audit import audit
from effectgate.chain import seal_chain, verify_chain
from effectgate.errors import TokenError
from effectgate.examples.shop import context
from effectgate.redact import FACTS, redact, retain
from effectgate.stores import SQLStore
from effectgate.stores._redaction import is_open
from effectgate.stores.protocol import Store
from effectgate.testing import FakeClock

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")
EVERY_KIND = {"read": 30, "write": 30, "send": 30, "money": 30, "destructive": 30, "unclassified": 30}
_FROM = re.compile(r"\bFROM\s+\"?(eg_\w+)", re.IGNORECASE)


@contextmanager
def selects(store: Store) -> Iterator[Counter[str]]:
    """Counts the SELECTs sent to the store's database per effectgate table read (FROM)."""
    assert isinstance(store, SQLStore)
    counts: Counter[str] = Counter()

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            counts.update(set(_FROM.findall(statement)))

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)


def refund(gate: EffectGate, message: str, order: str, user: str) -> None:
    args = {"order_id": order, "amount": 1200, "currency": "GBP"}
    pending = gate.call("refund_order", args, context(message, user_id=user))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)


@pytest.fixture
def ledger(shop_gate: ShopGate, clock: FakeClock) -> EffectGate:
    """Reads, a write, refunds and a refusal of an unknown tool for u1 and u2; u2 already erased
    (so there are entries to read), and the chain checkpointed."""
    gate = shop_gate.gate
    tags = {"ticket_id": "t-17", "tags": ["billing"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("w")), Executed)
    for user, order in (("u1", "1042"), ("u2", "2001")):
        read = gate.call("get_order", {"order_id": order}, context(f"r-{user}", user_id=user))
        assert isinstance(read, Executed), read
        refund(gate, f"m-{user}", order, user)
        refused = gate.call("wire_funds_to", {"iban": "GB00"}, context(f"x-{user}", user_id=user))
        assert not isinstance(refused, Executed | Pending)
    gate.flush()
    assert redact(gate.store, gate.keyring, user_id="u2", by="dpo", reason="erasure").values > 0
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    return gate


def test_a_retention_pass_with_several_rules_reads_the_entries_and_checkpoints_once(
    ledger: EffectGate, clock: FakeClock
) -> None:
    store = ledger.store
    clock.advance(31 * 86400)
    with selects(store) as counts:
        done = retain(store, ledger.keyring, EVERY_KIND, by="nightly", now=clock.now())
    assert done.rows > 0
    assert (counts["eg_redacted"], counts["eg_chain"]) == (1, 1)
    again = retain(store, ledger.keyring, EVERY_KIND, by="nightly", now=clock.now())
    assert (again.rows, again.values) == (0, 0)  # every entry written by the first pass is seen
    assert audit(store, ledger.table, keyring=ledger.keyring, chain=True).clean


def test_the_entries_kept_through_a_pass_are_what_a_fresh_read_finds(
    ledger: EffectGate, clock: FakeClock
) -> None:
    """What a retention pass carries from rule to rule instead of reading the entries again: each
    `_erase` adds the entries it wrote, so the next rule sees what a fresh read would show."""
    store, at = ledger.store, clock.now() + 31 * 86400
    with store.transaction() as conn:
        erased = _entered(store, conn)
        before = len(erased)
        for effect in sorted(EVERY_KIND):
            targets = [
                t
                for t in store.redaction_targets(conn, effect=effect, before=at - 30 * 86400, held=[])
                if not is_open(t, at)
            ]
            _erase(store, conn, ledger.keyring, targets, "r-test", FACTS, at, erased)
            assert erased == _entered(store, conn), effect
        assert len(erased) > before


def test_a_redaction_reads_the_entries_and_checkpoints_once(ledger: EffectGate) -> None:
    with selects(ledger.store) as counts:
        done = redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="erasure")
    assert done.values > 0
    assert (counts["eg_redacted"], counts["eg_chain"]) == (1, 1)
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring, chain=True).clean


def test_a_seal_reads_the_checkpoints_once(ledger: EffectGate, clock: FakeClock) -> None:
    store = ledger.store
    assert isinstance(ledger.call("get_order", {"order_id": "1043"}, context("m9")), Executed)
    ledger.flush()
    with selects(store) as counts:
        made = seal_chain(store, ledger.keyring, now=clock.now() + 61)
    assert "eg_events" in {c.table_name for c in made}  # it continues the chain it read once
    assert (counts["eg_chain"], counts["eg_redacted"]) == (1, 1)
    assert verify_chain(store, ledger.keyring) == []


def test_a_foreign_keyring_is_refused_first_reading_the_checkpoints_once(
    ledger: EffectGate, clock: FakeClock
) -> None:
    store = ledger.store
    assert isinstance(ledger.call("get_order", {"order_id": "1043"}, context("m9")), Executed)
    ledger.flush()
    with store.reading() as conn:
        points = list(store.checkpoints(conn))
    for foreign in (
        Keyring.generate(),
        Keyring({ledger.keyring.current: bytes(range(32))}, current=ledger.keyring.current),
    ):
        with selects(store) as counts, pytest.raises(TokenError, match="not the ledger's"):
            seal_chain(store, foreign, now=clock.now() + 61)
        assert counts["eg_chain"] == 1
        assert counts["eg_redacted"] == 0  # refused before the seal reads anything else
        with store.reading() as conn:
            assert list(store.checkpoints(conn)) == points  # nothing was written
    assert seal_chain(store, ledger.keyring, now=clock.now() + 61)
