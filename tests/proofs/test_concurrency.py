"""Concurrency proofs: separate processes race on one database; effects are counted at the receiver.

The receiver is the payment provider in its careless mode (it ignores Idempotency-Key), so a
second execution anywhere would show up as a second charge instead of being absorbed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from effectgate import EffectGate, Keyring, open_store
from effectgate.stores import SQLStore

from . import _racers
from ._money import Refunds, grant, money_table
from ._plan import size
from ._receiver import PaymentProvider

WORKERS = 16


@pytest.fixture(scope="module")
def pool(fast_children: None) -> Iterator[_racers.Pool]:
    """Sixteen spawned workers, started once for the module (each test opens its own stores)."""
    p = _racers.Pool(WORKERS)
    yield p
    p.close()


@pytest.fixture
def racers(pool: _racers.Pool) -> _racers.Pool:
    assert not pool.closed, "a worker crashed in an earlier test"
    return pool


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.generate()


@pytest.fixture
def store(store_url: str) -> Iterator[SQLStore]:
    s = open_store(store_url)
    s.setup()
    yield s
    s.close()


@pytest.fixture
def gate(store: SQLStore, keyring: Keyring, careless_provider: PaymentProvider) -> Iterator[EffectGate]:
    refunds = Refunds(careless_provider.url)
    with EffectGate(money_table(refunds), store, keyring=keyring) as g:
        yield g
    refunds.close()


def test_sixteen_processes_execute_one_grant_once(
    racers: _racers.Pool,
    store_url: str,
    store: SQLStore,
    gate: EffectGate,
    keyring: Keyring,
    careless_provider: PaymentProvider,
) -> None:
    """Sixteen processes presenting one grant at once cause exactly one charge at the provider."""
    granted = grant(gate, "o-1")
    base = (store_url, keyring.dumps(), careless_provider.url, granted.token)
    outcomes = racers.race("execute_grant", [base] * WORKERS)
    ran = [o for o in outcomes if o == ("executed", False)]
    assert len(ran) == 1, outcomes
    others = [o for o in outcomes if o is not ran[0]]
    assert all(o in (("token_error", "used"), ("executed", True)) for o in others), others
    assert len(careless_provider.charges) == 1
    assert [r.method for r in careless_provider.requests] == ["POST"]
    assert store.idempotency_records(status="in_progress") == []
    records = store.idempotency_records()
    assert [(r.status, r.attempts) for r in records] == [("succeeded", 1)]
    assert records[0].key == careless_provider.charges[0]["idempotency_key"]
    assert gate.audit().clean


def test_sixteen_processes_propose_one_intent_once(
    racers: _racers.Pool,
    store_url: str,
    store: SQLStore,
    keyring: Keyring,
    careless_provider: PaymentProvider,
) -> None:
    """Sixteen processes proposing the same intent at once register exactly one approval."""
    outcomes = racers.race("propose_intent", [(store_url, keyring.dumps(), careless_provider.url)] * WORKERS)
    approvals = store.approvals()
    assert len(approvals) == 1
    assert {o[:2] for o in outcomes} == {("Pending", approvals[0].id)}
    assert sorted(o[2] for o in outcomes) == [False] + [True] * 15
    assert approvals[0].status == "pending"
    assert careless_provider.requests == []


def test_two_sessions_racing_on_one_subject_get_one_pending(
    racers: _racers.Pool,
    store_url: str,
    store: SQLStore,
    keyring: Keyring,
    careless_provider: PaymentProvider,
) -> None:
    """Two sessions proposing on one order at once: one waits for approval, the other hears subject_busy."""
    rounds = 10
    base = (store_url, keyring.dumps(), careless_provider.url)
    outcomes = racers.race("propose_rounds", [(*base, "sA", rounds), (*base, "sB", rounds)])
    by_round: dict[int, list[tuple[Any, ...]]] = {}
    for o in (seen for report in outcomes for seen in report):
        by_round.setdefault(o[0], []).append(o)
    assert sorted(by_round) == list(range(rounds))
    winners: Counter[str] = Counter()
    for i, pair in sorted(by_round.items()):
        kinds = sorted((o[2], o[3]) for o in pair)
        assert kinds == [("Pending", None), ("Refused", "subject_busy")], (i, pair)
        pending = next(o for o in pair if o[2] == "Pending")
        refused = next(o for o in pair if o[2] == "Refused")
        assert refused[4] == pending[4], "the refusal names the approval in flight"
        winners[pending[1]] += 1
    approvals = store.approvals()
    assert len(approvals) == rounds
    assert {a.status for a in approvals} == {"pending"}
    assert len({a.subject_key for a in approvals}) == rounds
    assert sum(winners.values()) == rounds
    assert careless_provider.requests == []


def test_eight_processes_execute_hundreds_of_grants(
    racers: _racers.Pool,
    store_url: str,
    store: SQLStore,
    gate: EffectGate,
    keyring: Keyring,
    careless_provider: PaymentProvider,
) -> None:
    """Eight processes running distinct grants (50 each; 200 under EFFECTGATE_PROOFS=long) charge
    once per grant, losing nothing."""
    workers, each = 8, size(50, 200)
    grants = [grant(gate, f"bulk-{i}") for i in range(workers * each)]
    base = (store_url, keyring.dumps(), careless_provider.url)
    tokens = [[g.token for g in grants[w * each : (w + 1) * each]] for w in range(workers)]
    out = racers.race("execute_grants", [(*base, t) for t in tokens])
    done = [d for o in out for d in o]
    assert len(done) == workers * each
    assert not [d for d in done if d[2]], "no grant was a replay: each ran in the process it was given to"
    assert {d[0] for d in done} == {g.approval_id for g in grants}
    keys = [c["idempotency_key"] for c in careless_provider.charges]
    assert len(keys) == workers * each
    assert len(set(keys)) == len(keys), "no key was charged twice"
    assert set(keys) == {d[1] for d in done}
    records = store.idempotency_records()
    assert len(records) == workers * each
    assert Counter(r.status for r in records) == {"succeeded": workers * each}
    assert {r.key for r in records} == set(keys)
    assert Counter(a.status for a in store.approvals()) == {"executed": workers * each}
    assert gate.audit().clean
