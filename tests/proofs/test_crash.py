"""Crash proofs: an executing process is SIGKILLed at every seam, and a fresh process recovers.

Each intent (a refund on its own order) is proposed and approved here, then executed by a fresh
process (`tests/proofs/_executor.py`) that dies at the chosen point. The next process first
recovers it, with a clock running past every lease: `gate.recover()`, then, if the approval is
still approved with no idempotency record (the claim never committed), the same token once
more. Charges are counted at the payment provider, which is a real HTTP server on 127.0.0.1.

Kill points: after the claim (the start of the tool), after the provider answered (before the
result is stored), after the result is stored (before the process reports), and after the k-th
SQL statement of the execution: every k once, and under EFFECTGATE_PROOFS=long (see _plan.py)
more k drawn from a seeded random.Random, 35 kills in all.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, Keyring, Policy, open_store
from effectgate._execution import exec_key
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.stores import SQLStore

from ._money import Refunds, grant, money_table
from ._plan import size
from ._receiver import PaymentProvider

ROOT = Path(__file__).resolve().parents[2]
SHIFT = Policy().lease_seconds + 30.0  # past every lease, well inside Policy().token_ttl
SEAMS = ("claim", "provider", "stored")
SEED = 20240603
Kill = dict[str, Any] | None


@dataclass
class Intent:
    approval_id: str
    token: str
    kill: Kill
    statements: int | None = None
    recovery: dict[str, Any] = field(default_factory=dict[str, Any])


class Chain:
    """Intents executed one per fresh process; each process first recovers the intent before it."""

    def __init__(self, store_url: str, provider: PaymentProvider, *, lookups: bool) -> None:
        self.url = store_url
        self.provider = provider
        self.lookups = lookups
        self.keyring = Keyring.generate()
        self.store = open_store(store_url)
        self.store.setup()
        self.refunds = Refunds(provider.url, lookups=lookups)
        self.gate = EffectGate(money_table(self.refunds), self.store, keyring=self.keyring)
        self.intents: list[Intent] = []
        self.notified: set[str] = set()
        self.kills = 0

    def close(self) -> None:
        self.gate.close()
        self.refunds.close()
        self.store.close()

    def step(self, kill: Kill) -> Intent:
        """Grant the next intent; a fresh process recovers the previous one, then runs this one."""
        granted = grant(self.gate, f"o{len(self.intents)}")
        intent = Intent(granted.approval_id, granted.token, kill)
        self._run(execute=intent)
        self.intents.append(intent)
        return intent

    def finish(self) -> None:
        """A last fresh process recovers the last intent."""
        self._run(execute=None)

    def _run(self, *, execute: Intent | None) -> None:
        previous = self.intents[-1] if self.intents else None
        job = {
            "url": self.url,
            "keyring": self.keyring.dumps(),
            "provider": self.provider.url,
            "lookups": self.lookups,
            "shift": SHIFT,
            "recover": {"approval_id": previous.approval_id, "token": previous.token} if previous else None,
            "execute": {"approval_id": execute.approval_id, "token": execute.token} if execute else None,
            "kill": execute.kill if execute else None,
        }
        done = subprocess.run(
            [sys.executable, "-m", "tests.proofs._executor", json.dumps(job)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        killed = execute is not None and execute.kill is not None
        expected = -signal.SIGKILL if killed else 0
        assert done.returncode == expected, (job["kill"], done.returncode, done.stderr)
        self.kills += killed
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        for line in lines:
            if "notified" in line:
                self.notified.add(line["notified"])
            elif "recovered" in line:
                assert previous is not None
                assert line["recovered"] == previous.approval_id
                previous.recovery = line
            elif "executed" in line:
                assert execute is not None
                assert not killed
                execute.statements = line["statements"]
        assert previous is None or previous.recovery, done.stdout

    def calibrate(self) -> int:
        """Run one intent without a kill; the number of SQL statements its execution issued."""
        intent = self.step(None)
        assert intent.statements, "the execution issued no statement"
        return intent.statements

    # -- what is left behind

    def key(self, intent: Intent) -> str:
        row = self.store.get_approval(intent.approval_id)
        assert row is not None
        return exec_key(row)

    def notified_in_store(self) -> set[str]:
        return {e.approval_id for e in self.store.events(kind="notified") if e.approval_id}


def kill_plan(statements: int, rng: random.Random, count: int) -> list[Kill]:
    """Every statement once, then more drawn at random, shuffled: `count` kills (or more)."""
    ks = list(range(1, statements + 1)) + [rng.randint(1, statements) for _ in range(count - statements)]
    rng.shuffle(ks)
    return [{"statement": k} for k in ks]


@pytest.fixture
def chain(store_url: str, provider: PaymentProvider) -> Iterator[Chain]:
    c = Chain(store_url, provider, lookups=True)
    yield c
    c.close()


@pytest.fixture
def careless_chain(store_url: str, careless_provider: PaymentProvider) -> Iterator[Chain]:
    c = Chain(store_url, careless_provider, lookups=False)
    yield c
    c.close()


def summary(chain: Chain, statements: int, detail: Counter[str]) -> None:
    """What a run did, shown with `pytest -s`."""
    backend = chain.store.engine.dialect.name
    charges = len(chain.provider.charges)
    print(f"\n{backend}: {statements} statements, {chain.kills} kills, {charges} charges, {dict(detail)}")


def assert_nothing_in_flight(store: SQLStore) -> None:
    assert store.idempotency_records(status="in_progress") == []
    assert store.idempotency_records(status="failed") == [], "no intent may end silently failed"


def test_kills_at_every_seam_leave_exactly_one_charge_per_intent(
    chain: Chain, provider: PaymentProvider
) -> None:
    """Killed at every seam and after every statement, each approved refund is charged once and succeeds."""
    statements = chain.calibrate()
    rng = random.Random(SEED)
    kills = [*({"seam": s} for s in SEAMS), *kill_plan(statements, rng, size(statements, 35))]
    for kill in kills:
        chain.step(kill)
    chain.finish()

    assert chain.kills >= len(kills) >= len(SEAMS) + statements
    covered = {i.kill["statement"] for i in chain.intents if i.kill and "statement" in i.kill}
    assert covered == set(range(1, statements + 1)), "a kill landed after every statement"
    charges, posts = provider.charges_by_key(), provider.posts_by_key()
    store = chain.store
    for intent in chain.intents:
        key = chain.key(intent)
        record = store.get(key)
        row = store.get_approval(intent.approval_id)
        assert record is not None, (intent.kill, "lost")
        assert row is not None
        assert (record.status, row.status) == ("succeeded", "executed"), (intent.kill, record, row.status)
        assert charges[key] == 1, (intent.kill, charges[key])
        assert posts[key] == 1, (intent.kill, "the provider was asked to charge again")
        assert record.result["id"] == next(c["id"] for c in provider.charges if c["idempotency_key"] == key)
        # whatever recovery found in flight, it told the approver before settling it
        assert set(intent.recovery.get("touched", [])) <= chain.notified
    assert len(provider.charges) == len(chain.intents)
    assert_nothing_in_flight(store)
    for intent in chain.intents:  # a grant presented again after recovery is refused, not run
        with pytest.raises(TokenError) as used:
            chain.gate.execute(intent.token)
        assert used.value.reason == "used"
    assert sum(provider.posts_by_key().values()) == len(chain.intents), "only lookups were added"
    report = chain.gate.audit()
    assert report.clean, report.findings
    recovered = Counter(
        "re-executed"
        if i.recovery.get("reran")
        else "reconciled"
        if i.recovery.get("touched")
        else "untouched"
        for i in chain.intents
    )
    summary(chain, statements, recovered)


def test_kills_with_a_careless_provider_never_charge_twice(
    careless_chain: Chain, careless_provider: PaymentProvider
) -> None:
    """With a careless provider, a kill past its call parks the refund, tells finance, never charges twice."""
    chain = careless_chain
    statements = chain.calibrate()
    rng = random.Random(SEED + 1)
    kills = [
        *({"seam": s} for s in SEAMS),
        *({"statement": rng.randint(1, statements)} for _ in range(size(4, 10))),
    ]
    for kill in kills:
        chain.step(kill)
    chain.finish()

    assert chain.kills >= len(kills)
    charges, posts = careless_provider.charges_by_key(), careless_provider.posts_by_key()
    store = chain.store
    notified_in_store = chain.notified_in_store()
    statuses: Counter[str] = Counter()
    for intent in chain.intents:
        key = chain.key(intent)
        record = store.get(key)
        row = store.get_approval(intent.approval_id)
        assert record is not None, (intent.kill, "lost")
        assert row is not None
        assert posts[key] <= 1, (intent.kill, "the provider was called a second time")
        assert charges[key] == posts[key]
        statuses[record.status] += 1
        if record.status == "succeeded":
            assert (row.status, charges[key]) == ("executed", 1), intent.kill
        else:
            assert record.status == "needs_reconciliation", (intent.kill, record)
            assert row.status == "approved"
            assert key in chain.notified, intent.kill
            assert intent.approval_id in notified_in_store, intent.kill
        if intent.kill == {"seam": "provider"}:
            assert (record.status, charges[key]) == ("needs_reconciliation", 1)
        if intent.kill == {"seam": "claim"}:
            assert (record.status, charges[key]) == ("needs_reconciliation", 0)
    assert statuses["needs_reconciliation"] >= 2
    assert_nothing_in_flight(store)
    calls = len(careless_provider.requests)
    for intent in chain.intents:  # neither the grant nor reconciliation calls the provider again
        if chain.gate.result(intent.approval_id) is not None:
            continue
        with pytest.raises(NeedsReconciliation):
            chain.gate.execute(intent.token)
        assert chain.gate.reconcile(intent.approval_id) is None, "the provider cannot tell"
    assert len(careless_provider.requests) == calls
    report = chain.gate.audit()
    assert report.clean, report.findings
    summary(chain, statements, statuses)
