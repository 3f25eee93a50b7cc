"""Round 31: a subject's history when the key its records were sealed under is retired too early
(SQLite and PostgreSQL through `store`), reproduced first.

`Ledger.history` (what a `confirm` balance check reads) dropped a row that does not verify when
no sealed decision of it verifies. Once the key a refund's row and decisions were sealed under
left the keyring, an executed full refund was no history at all, and a second full refund of the
same order passed the balance check and ran. The append-only executions say it ran: such a row
now counts, flagged, and a `confirm` check on its subject refuses, naming the key, until the
keyring holds that key again; so does one whose stored grant may still be presented. One that
can never run (its grant lapsed unpresented) is still no history.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from effectgate import Approver, EffectGate, Grant, Keyring, Pending, Refused
from effectgate.examples.shop import Shop, app, context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FIONA = Approver("fiona", "finance")
OLD, NEW = secrets.token_bytes(32), secrets.token_bytes(32)
RETIRED = Keyring({"k2": NEW}, current="k2")  # k1 left the keyring
RESTORED = Keyring({"k1": OLD, "k2": NEW}, current="k2")  # a rotation that keeps k1 to verify


def refund(amount: int) -> dict[str, object]:
    return {"order_id": "1042", "amount": amount, "currency": "GBP"}  # the order's total is 12000


class Shop31:
    """One shop (its receiver counts refunds) with gates on one store under different keyrings."""

    def __init__(self, store: SQLStore, clock: FakeClock) -> None:
        self.shop, self.store, self.clock = Shop(), store, clock
        self.gates: list[EffectGate] = []

    def gate(self, keyring: Keyring) -> EffectGate:
        gate = app(self.store, keyring=keyring, clock=self.clock, shop=self.shop)
        self.gates.append(gate)
        return gate

    def refunds(self) -> int:
        return self.shop.receiver.count("refund")


@pytest.fixture
def shop31(store: SQLStore, clock: FakeClock) -> Iterator[Shop31]:
    made = Shop31(store, clock)
    yield made
    for gate in made.gates:
        gate.close()


def _approved(gate: EffectGate, amount: int, message: str, session: str) -> Grant:
    pending = gate.call("refund_order", refund(amount), context(message, session_id=session))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FIONA)
    assert isinstance(grant, Grant), grant
    return grant


def _refused_naming_k1(gate: EffectGate, amount: int, message: str, session: str) -> None:
    again = gate.call("refund_order", refund(amount), context(message, session_id=session))
    assert isinstance(again, Refused), again
    assert again.code == "confirm_failed"
    assert "'k1'" in again.message
    assert "keyring" in again.message
    assert not gate.store.approvals(status="pending")


def test_an_executed_full_refund_under_a_retired_key_refuses_a_second_one(shop31: Shop31) -> None:
    old = shop31.gate(Keyring({"k1": OLD}, current="k1"))
    old.execute(_approved(old, 12000, "m1", "s1").token)
    assert shop31.refunds() == 1
    later = shop31.gate(RETIRED)
    _refused_naming_k1(later, 12000, "m9", "s-other")  # the order is refunded whole already
    _refused_naming_k1(later, 100, "m10", "s-third")  # nothing on it can be checked
    assert shop31.refunds() == 1


def test_restoring_the_key_lets_the_balance_check_decide_again(shop31: Shop31) -> None:
    old = shop31.gate(Keyring({"k1": OLD}, current="k1"))
    old.execute(_approved(old, 5000, "m1", "s1").token)
    _refused_naming_k1(shop31.gate(RETIRED), 5000, "m2", "s2")
    restored = shop31.gate(RESTORED)
    too_much = restored.call("refund_order", refund(7001), context("m3", session_id="s3"))
    assert isinstance(too_much, Refused), too_much
    assert too_much.code == "confirm_failed"
    assert "only 7000 is left" in too_much.message
    restored.execute(_approved(restored, 7000, "m4", "s4").token)
    assert shop31.refunds() == 2


def test_an_approved_refund_whose_grant_may_still_run_counts_under_a_retired_key(
    shop31: Shop31,
) -> None:
    old = shop31.gate(Keyring({"k1": OLD}, current="k1"))
    grant = _approved(old, 12000, "m1", "s1")  # not presented yet
    # in the same session (another session is refused as subject_busy while the grant is live)
    _refused_naming_k1(shop31.gate(RETIRED), 12000, "m9", "s1")
    shop31.gate(RESTORED).execute(grant.token)  # the key is back: the grant runs, once
    assert shop31.refunds() == 1


def test_a_grant_that_lapsed_unpresented_under_a_retired_key_is_no_history(
    shop31: Shop31, clock: FakeClock
) -> None:
    old = shop31.gate(Keyring({"k1": OLD}, current="k1"))
    _approved(old, 12000, "m1", "s1")
    clock.advance(old.policy.token_ttl + 1)  # never presented: it can never run
    later = shop31.gate(RETIRED)
    again = later.call("refund_order", refund(12000), context("m9", session_id="s-other"))
    assert isinstance(again, Pending), again
