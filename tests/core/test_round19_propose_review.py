"""Round 19 review of propose's and approve's merged reads (`stores/_together.py`), SQLite and
PostgreSQL: `proposal_reads` answers what `pending_of_session`, `approval_for_key`,
`in_flight_elsewhere` and the write record's look answered (order of the session's pending
approvals newest first included, whatever order they were inserted in, with odd ids);
`locked_decided` what `locked_approval` and `decisions` of its version did (none, another
version's only, several in order). Through the gate: a lapsed keyed approval replays as expired,
a lapsed approval neither counts nor makes its subject busy, a version's decisions never count
for the next.
"""

from __future__ import annotations

import dataclasses

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    Grant,
    Invalid,
    Keyring,
    PartialApproval,
    Pending,
    Refused,
)
from effectgate._written import write_key
from effectgate.canonical import args_hash
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate, ShopGate
from .test_round18_keys import ctx, pay_table, run

PRIVACY = (Approver("pia", "privacy"), Approver("pat", "privacy"))
FINANCE = Approver("fiona", "finance")
DAY = 24 * 3600.0


def _refund(shop_gate: ShopGate, message: str, session: str = "s-ada", order: str = "1042") -> object:
    args = {"order_id": order, "amount": 100, "currency": "GBP"}
    return shop_gate.gate.call("refund_order", args, context(message, session_id=session))


def _delete(gate: EffectGate, customer: str, message: str, session: str = "s-ada") -> object:
    ctx = context(message, session_id=session, user_id=customer)
    return gate.call("delete_customer_data", {"customer_id": customer}, ctx)


def _old_reads(store: SQLStore, session: str, key: str, subject: str, now: float, record: str) -> tuple:
    with store.transaction() as conn:
        return (
            store.pending_of_session(conn, session),
            store.approval_for_key(conn, key),
            store.in_flight_elsewhere(conn, subject, session, now),
            store.load(conn, record) is not None,
        )


def _new_reads(store: SQLStore, session: str, key: str, subject: str, now: float, record: str) -> tuple:
    with store.transaction() as conn:
        return store.proposal_reads(conn, session, key, subject, now, record)


@pytest.mark.parametrize("session", ["s-ada", 'o\'brien "x"; --', "é" * 1000, "s\\%_"])
def test_proposal_reads_answer_what_the_four_reads_answered(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, session: str
) -> None:
    gate = shop_gate.gate
    ids = []
    for i in range(4):
        pending = _delete(gate, f"c{i}", f"m{i}", session)
        assert isinstance(pending, Pending), pending
        ids.append(pending.approval_id)
        clock.advance(10.0 * (4 - i))
    other = _delete(gate, "c2", "o1", "s-other")
    assert isinstance(other, Refused)
    assert other.code == "subject_busy"
    rows = store.approvals()
    mine = next(r for r in rows if r.id == ids[2])
    with store.transaction() as conn:
        key = next(k for k in _keys(store, conn) if k[1] == ids[1])[0]
    now = clock.now()
    for probe_session in (session, "s-other"):
        old = _old_reads(store, probe_session, key, mine.subject_key, now, "nope")
        new = _new_reads(store, probe_session, key, mine.subject_key, now, "nope")
        assert [r.id for r in new[0]] == [r.id for r in old[0]]
        assert [r.id for r in new[0]] == ([*reversed(ids)] if probe_session == session else [])
        assert new[0] == old[0]
        assert new[1] == old[1]
        assert new[2] == old[2]
        assert new[3] == old[3]


def _keys(store: SQLStore, conn: object) -> list[tuple[str, str]]:
    return [(k, a) for k, a in store._x(conn, 'SELECT "key", approval_id FROM eg_intent_keys', {}).fetchall()]


def test_the_write_record_flag_matches_the_record(shop_gate: ShopGate, store: SQLStore) -> None:
    store.run("w:k'1", "h", lambda: 1)
    for record, there in (("w:k'1", True), ("w:k", False), ("w:k'1 ", False)):
        new = _new_reads(store, "s", "k", "subj", 0.0, record)
        assert new[3] is there
        assert new[:3] == ([], None, None)


def test_a_lapsed_keyed_approval_replays_as_expired(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    first = _refund(shop_gate, "m1")
    assert isinstance(first, Pending)
    clock.advance(DAY + 1)
    again = _refund(shop_gate, "m1")  # the same message: its (lapsed) approval answers
    assert isinstance(again, Refused)
    assert again.code == "expired"
    assert [(r.id, r.status) for r in store.approvals()] == [(first.approval_id, "expired")]
    kinds = [e.kind for e in store.events(approval_id=first.approval_id)]
    assert kinds.count("expired") == 1


def test_a_lapsed_approval_neither_counts_nor_makes_its_subject_busy(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    old = _delete(gate, "c1", "m1", "s-1")
    assert isinstance(old, Pending)
    clock.advance(DAY + 1)
    # another session, same subject: the lapsed one is not in flight
    new = _delete(gate, "c1", "m1", "s-2")
    assert isinstance(new, Pending), new
    # the first session proposes again (a new message): a new approval, the old one expired
    again = _delete(gate, "c1", "m2", "s-1")
    assert isinstance(again, Refused)
    assert again.code == "subject_busy"
    statuses = {r.id: r.status for r in store.approvals()}
    assert statuses[old.approval_id] == "expired"
    assert statuses[new.approval_id] == "pending"


def test_max_pending_counts_only_live_approvals(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    gate = shop_gate.gate
    for i in range(20):
        p = _delete(gate, f"c{i}", f"m{i}")
        assert isinstance(p, Pending)
    over = _delete(gate, "c99", "m99")
    assert isinstance(over, Refused)
    assert over.code == "too_many_pending"
    clock.advance(DAY + 1)
    fresh = _delete(gate, "c99", "m100")
    assert isinstance(fresh, Pending), fresh
    assert sum(r.status == "expired" for r in store.approvals()) == 20


def test_locked_decided_answers_what_locked_approval_and_decisions_did(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    gate = shop_gate.gate
    pending = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m1"))
    assert isinstance(pending, Pending)

    def both() -> None:
        with store.transaction() as conn:
            row, read = store.locked_decided(conn, pending.approval_id)
        with store.transaction() as conn:
            old = store.locked_approval(conn, pending.approval_id)
            assert old is not None
            assert (row, read) == (old, store.decisions(conn, old.id, old.version))

    both()  # no decision
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=PRIVACY[0]), PartialApproval)
    both()  # one
    with store.transaction() as conn:
        for bad in ("", "nope", "x\x00y", "\ud800", "'; DROP TABLE eg_approvals; --"):
            assert store.locked_decided(conn, bad) == (None, [])
    grant = gate.approve(pending.approval_id, version=1, approver=PRIVACY[1])
    assert isinstance(grant, Grant)
    both()  # two, in order
    with store.transaction() as conn:
        _, read = store.locked_decided(conn, pending.approval_id)
    assert [d.approver_id for d in read] == ["pia", "pat"]


def test_an_amended_version_counts_none_of_the_last_versions_decisions(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    gate = shop_gate.gate
    first = _refund(shop_gate, "m1")
    assert isinstance(first, Pending)
    args = {"order_id": "1042", "amount": 200, "currency": "GBP"}
    amended = gate.call("refund_order", args, context("m2"))
    assert isinstance(amended, Pending)
    assert amended.version == 2
    with store.transaction() as conn:
        row, read = store.locked_decided(conn, first.approval_id)
    assert row is not None
    assert row.version == 2
    assert read == []
    grant = gate.approve(first.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    with store.transaction() as conn:
        _, read = store.locked_decided(conn, first.approval_id)
    assert [(d.version, d.approver_id) for d in read] == [(2, "fiona")]


def test_an_amended_two_person_call_reads_none_of_the_first_versions_approvals(
    store: SQLStore, clock: FakeClock
) -> None:
    policy = dataclasses.replace(
        SHOP_POLICY, double_confirmation=frozenset({Effect.MONEY, Effect.DESTRUCTIVE})
    )
    shop = Shop()
    gate = EffectGate(shop.table(), store, policy=policy, keyring=Keyring.generate(), clock=clock)
    args = {"order_id": "1042", "amount": 100, "currency": "GBP"}
    first = gate.call("refund_order", args, context("m1"))
    assert isinstance(first, Pending)
    assert isinstance(gate.approve(first.approval_id, version=1, approver=FINANCE), PartialApproval)
    amended = gate.call("refund_order", {**args, "amount": 200}, context("m2"))
    assert isinstance(amended, Pending)
    assert amended.version == 2
    with store.transaction() as conn:
        row, read = store.locked_decided(conn, first.approval_id)
        assert [d.version for d in store.decisions(conn, first.approval_id)] == [1]
    assert row is not None
    assert (row.version, read) == (2, [])  # the first version's approval is not this one's
    # so its approver may approve version 2, and a second one is still needed
    assert isinstance(gate.approve(first.approval_id, version=2, approver=FINANCE), PartialApproval)
    grant = gate.approve(first.approval_id, version=2, approver=Approver("fred", "finance"))
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert [int(r["amount"]) for r in shop.provider.refunds.values()] == [200]
    gate.close()


def test_a_write_record_of_other_arguments_under_the_key_proposes_as_usual(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The `ran` flag says only that a record of the call's write key exists: one whose payload is
    not this call's (edited) answers nothing, and the call is proposed; a real one replays."""
    rec = EffectRecorder()
    gate = make_gate(pay_table(rec, Effect.MONEY))
    args = {"to": "acct", "amount": 5}
    key = write_key("pay", ctx("m1"), args_hash("pay", args))
    store.run(key, "another payload", lambda: {"paid": 99})
    out = gate.call("pay", args, ctx("m1"))
    assert isinstance(out, Pending), out
    run(gate, out)
    assert rec.count("pay") == 1
    assert [r.status for r in store.approvals()] == ["executed"]


@pytest.mark.parametrize("customer", ["o'\x00x", "\ud800", "'; --" * 500, ""])
def test_odd_subject_text_is_answered_not_raised(shop_gate: ShopGate, store: SQLStore, customer: str) -> None:
    gate = shop_gate.gate
    for _ in range(2):  # a new call, then its replay (the merged read finds its intent key)
        out = gate.call("delete_customer_data", {"customer_id": customer}, context("m1"))
        assert isinstance(out, (Refused, Invalid)), out
    assert len(store.approvals()) <= 1
    assert shop_gate.shop.receiver.count("delete") == 0
