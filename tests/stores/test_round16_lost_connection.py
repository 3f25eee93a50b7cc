"""Round 16, stores: the database connection lost in the middle of propose, approve and execute.

PostgreSQL: the session is ended from another connection (`pg_terminate_backend`) before each
statement of each of the gate's transactions in turn, and before its COMMIT: the operation
raises SQLAlchemy's error for a lost connection (what the CLI reports as "store unavailable",
exit 5; `store.lost_connection` recognises it), nothing of its transaction is written, and the
same operation run again completes, its effect at the receiver once. This holds today.

Both databases (simulated as `tests/core/test_lost_connection.py` does: the COMMIT lands and its
reply is lost, as in a failover): two cases where a grant was lost, fixed in round 17 by reading
back what the transaction committed (`Decisions.landed`, `Execution.landed`):
- approve: the decision and the grant's hash were committed, the approver never got the token,
  and approving again was `AlreadyDecided`: nobody held a grant until it lapsed. Now the approval
  row, read back and verified, holds the minted grant's hash: the grant is returned.
- execute: the claim (token_used, the record in flight under this run's lease) was committed and
  the tool never ran; presenting the grant again was `TokenError("used")`, and after the lease
  `recover` asked a person about a call that never started. Now the record, read back, is in
  flight under this claim's owner: the tool runs, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.testing import EffectRecorder, FakeClock

FINANCE = Approver("fiona", "finance")
STEPS = ("propose", "approve", "execute")


@pytest.fixture
def paying(store: SQLStore, clock: FakeClock) -> Iterator[tuple[EffectGate, EffectRecorder]]:
    """A gate whose `pay` tool (money, finance approves, one subject per account) records its
    effects at the receiver."""
    receiver = EffectRecorder()

    def pay(account: str, amount: int) -> dict[str, int]:
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    table.allow("support", ["pay"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    yield gate, receiver
    gate.close()


def _rows(store: SQLStore) -> dict[str, Any]:
    """Every table's rows that the gate's transactions write, as they stand."""
    with store.reading() as conn:
        return {
            t: sorted(map(repr, conn.execute(sa.text(f"SELECT * FROM {t}")).all()))
            for t in ("eg_approvals", "eg_intent_keys", "eg_decisions", "eg_events", "eg_executions")
        } | {"idempotency": sorted(repr(r) for r in store.idempotency_records())}


class Killer:
    """Ends the gate's database session before its `n`-th statement (or COMMIT) while armed."""

    def __init__(self, store: SQLStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.admin = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)
        self.armed, self.seen, self.n, self.killed = False, 0, 0, False
        x, run_many, end = store._x, _dialect.run_many, _dialect.driver_end

        def counted(conn: Any, sql: str, params: Any) -> Any:
            self.tick(conn)
            return x(conn, sql, params)

        def counted_many(conn: Any, sql: str, rows: Any, *, driver: Any = None) -> None:
            self.tick(conn)
            run_many(conn, sql, rows, driver=driver)

        def counted_end(conn: Any, driver: Any, *, commit: bool) -> None:
            if commit:
                self.tick(conn)
            end(conn, driver, commit=commit)

        monkeypatch.setattr(store, "_x", counted)
        monkeypatch.setattr(_dialect, "run_many", counted_many)
        monkeypatch.setattr(_dialect, "driver_end", counted_end)

    def arm(self, n: int) -> None:
        self.armed, self.seen, self.n, self.killed = True, 0, n, False

    def tick(self, conn: Any) -> None:
        if not self.armed:
            return
        self.seen += 1
        if self.seen == self.n:
            self.armed, self.killed = False, True
            pid = conn.connection.driver_connection.info.backend_pid
            with self.admin.connect() as admin:
                admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


def _outcome(op: Callable[[], Any]) -> Any:
    """`op()`'s value, or the database error it raised."""
    try:
        return op()
    except sa.exc.DBAPIError as exc:
        return exc


def _pay_once(
    gate: EffectGate, store: SQLStore, killer: Killer, *, account: str, step: str, n: int
) -> dict[str, Any]:
    """Propose, approve and execute a payment to `account`, the session ended before the `n`-th
    statement of `step`; each operation that raised is checked and run again."""
    state: dict[str, Any] = {}
    ops: dict[str, Callable[[], Any]] = {
        "propose": lambda: gate.call("pay", {"account": account, "amount": n}, context(f"m-{account}")),
        "approve": lambda: gate.approve(state["propose"].approval_id, version=1, approver=FINANCE),
        "execute": lambda: gate.execute(state["approve"].token),
    }
    for name in STEPS:
        before = _rows(store)
        if name == step:
            killer.arm(n)
        state[name] = _outcome(ops[name])
        killer.armed = False
        if isinstance(state[name], sa.exc.DBAPIError):
            assert killer.killed, state[name]
            assert name == step
            assert store.lost_connection(state[name])
            assert _rows(store) == before  # never half a transaction
            state[name] = ops[name]()
    return state


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("step", STEPS)
def test_a_session_ended_before_any_statement_writes_nothing_and_the_retry_completes(
    paying: tuple[EffectGate, EffectRecorder],
    store: SQLStore,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    """Before each statement of `step`'s transactions in turn: a lost-connection error and nothing
    of its transaction written, or (storing a result) stored on a fresh connection; run again, the
    call completes, and its payment reaches the receiver once."""
    gate, receiver = paying
    killer = Killer(store, monkeypatch)
    for n in range(1, 40):
        account = f"acct-{step}-{n}"
        state = _pay_once(gate, store, killer, account=account, step=step, n=n)
        assert isinstance(state["propose"], Pending)
        assert isinstance(state["approve"], Grant)
        assert isinstance(state["execute"], Executed)
        assert receiver.count("pay", account=account) == 1
        [execution] = store.executions(approval_id=state["propose"].approval_id)
        assert execution.status == "succeeded"
        if not killer.killed:  # past the last statement of the step
            break
    assert n > 4  # every statement of the step was reached, and the loop ended


class LostReply:
    """The next COMMIT of one kind of transaction lands, and its reply is lost (a failover)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        end = _dialect.driver_end

        def landed_then_lost(conn: Any, driver: Any, *, commit: bool) -> None:
            end(conn, driver, commit=commit)
            if self.armed and commit:
                self.armed = False
                lost = ConnectionError("server closed the connection unexpectedly")
                raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

        monkeypatch.setattr(_dialect, "driver_end", landed_then_lost)


def test_an_approval_whose_commit_landed_and_reply_was_lost_still_yields_its_grant(
    paying: tuple[EffectGate, EffectRecorder], store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approver who retries after a lost reply gets a grant that runs the payment once."""
    gate, receiver = paying
    lost = LostReply(monkeypatch)
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    lost.armed = True
    grant = _outcome(lambda: gate.approve(pending.approval_id, version=1, approver=FINANCE))
    if isinstance(grant, sa.exc.DBAPIError):
        assert store.lost_connection(grant)
        grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    assert receiver.count("pay") == 1


def test_an_execution_whose_claim_commit_landed_and_reply_was_lost_runs_once(
    paying: tuple[EffectGate, EffectRecorder], store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant whose claim landed runs its payment once (in this call or when presented again)."""
    gate, receiver = paying
    lost = LostReply(monkeypatch)
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    lost.armed = True
    outcome = _outcome(lambda: gate.execute(grant.token))
    if isinstance(outcome, sa.exc.DBAPIError):
        assert store.lost_connection(outcome)
        outcome = gate.execute(grant.token)
    assert isinstance(outcome, Executed)
    assert receiver.count("pay") == 1
    [execution] = store.executions(approval_id=pending.approval_id)
    assert execution.status == "succeeded"
