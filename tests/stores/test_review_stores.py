"""Review of the stores: defects found in the SQL store, each reproduced on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.audit import audit
from effectgate.errors import InProgress, StoreError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.stores.base import Stored
from effectgate.testing import EffectRecorder, FakeClock

FINANCE = Approver("fiona", "finance")


def _paying_table(receiver: EffectRecorder) -> EffectTable:
    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        receiver.record("pay", account=account, amount=amount)
        return {"paid": amount}

    t = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))]
    )
    t.allow("support", ["pay"])
    return t


def test_an_audit_reads_one_snapshot_while_the_gate_commits(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit reads approvals, decisions and executions in one `reading()` transaction. A call
    approved and executed while the audit runs (between its statements) is either wholly in what
    it reads or wholly absent: never an approval read before its grant and a decision or an
    execution read after it, which the audit would report as a finding of an honest ledger."""
    receiver = EffectRecorder()
    keyring = Keyring.generate()
    gate = EffectGate(_paying_table(receiver), store, keyring=keyring, clock=clock)
    try:
        pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
        assert isinstance(pending, Pending)
        assert audit(store, gate.table, keyring=keyring).findings == []
        real = _dialect.stream
        started: list[str] = []

        def stream(conn: Any, sql: str, *, batch: int) -> Iterator[tuple[Any, ...]]:
            started.append(sql)
            if len(started) == 2:  # the first statement has run, the second has not
                grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
                assert isinstance(grant, Grant)
                gate.execute(grant.token)
            yield from real(conn, sql, batch=batch)

        monkeypatch.setattr(_dialect, "stream", stream)
        report = audit(store, gate.table, keyring=keyring)
        assert len(started) > 2
        assert receiver.count("pay") == 1
        assert report.findings == []
    finally:
        gate.close()


@pytest.mark.parametrize(
    "url", ["postgres://bob:s3cret-pw@db.example/prod", "mysql+pymysql://bob:s3cret-pw@db.example/prod"]
)
def test_an_unsupported_url_is_refused_without_its_password(url: str) -> None:
    """`open_store` with a URL of another scheme (Heroku's `postgres://`, MySQL) says which URL it
    refuses, its password masked as everywhere else the store names its database."""
    with pytest.raises(StoreError, match="unsupported database URL") as raised:
        open_store(url)
    assert "s3cret-pw" not in str(raised.value)
    assert "bob:***@db.example/prod" in str(raised.value)


HASH = "h" * 64


@pytest.mark.xfail(
    strict=True,
    reason="lease times are each host's own clock (`Clock.now()`), not the database's: a host "
    "whose clock runs ahead by more than the lease takes a live, renewed operation over. Using "
    "the database's clock for leases is a design change (the fake clocks of the tests too)",
)
def test_a_host_whose_clock_runs_ahead_does_not_take_a_live_lease_over(store_url: str) -> None:
    """Worker A holds the lease and has just renewed it; worker B, on a host whose clock is two
    minutes ahead, must see the operation in progress, not an expired lease to reconcile."""
    a_clock, b_clock = FakeClock(), FakeClock()
    b_clock.advance(120)  # the same instant, read on a host whose clock is ahead
    a, b = open_store(store_url, clock=a_clock), open_store(store_url, clock=b_clock)
    try:
        a.setup()
        claimed = a.claim("op", HASH, lease_seconds=60)
        assert not isinstance(claimed, Stored)
        assert a.renew_lease("op", claimed.owner, lease_seconds=60)  # alive, renewed just now
        with pytest.raises(InProgress):
            b.claim("op", HASH, lease_seconds=60)
        record = a.get("op")
        assert record is not None
        assert record.status == "in_progress"
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_that_closes_its_store_leaves_the_parents_sessions_open(store: SQLStore) -> None:
    """A forked worker that closes its copy of the store when it is done (a pre-fork server's
    worker shutting down, a multiprocessing child) closes its own connections only: the parent's,
    kept by the store or idle in the pool, stay open, and the parent's next operations succeed."""
    store.run("warm", HASH, lambda: 0)  # the parent keeps a connection
    assert store.approvals() == []  # and has one idle in the pool
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:
            code = 0 if store.run("child", HASH, lambda: "c") == "c" else 2
            store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.run("parent", HASH, lambda: "p") == "p"
    assert [a.id for a in store.approvals()] == []
    record = store.get("child")
    assert record is not None
    assert record.result == "c"


def test_a_tool_error_holding_a_nul_from_the_model_is_recorded_as_a_failure(store: SQLStore) -> None:
    """A write whose tool raises with the model's text in its message (a NUL byte written as
    `\\u0000` in the arguments' JSON) is a definite failure on both databases: recorded `failed`
    with its error, not a raw DataError from PostgreSQL (whose text cannot hold NUL) that left the
    record in flight, so that the next call was refused as in progress."""
    receiver = EffectRecorder()

    def note(order_id: str, text: str) -> dict[str, str]:
        """Add a note to an order."""
        receiver.record("note", order_id=order_id, text=text)
        if "\x00" in text:
            raise ValueError(f"cannot store the note {text}")
        return {"noted": text}

    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note)])
    table.allow("support", ["note"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=FakeClock())
    try:
        with pytest.raises(ValueError, match="cannot store the note"):
            gate.call("note", {"order_id": "o-1", "text": "a\x00b"}, context("m1"))
        [record] = store.idempotency_records()
        assert record.status == "failed"
        assert (record.error or "").startswith("ValueError: cannot store the note a")
        [execution] = store.executions()
        assert execution.status == "failed"
        assert execution.error == record.error
        with pytest.raises(ValueError, match="cannot store the note"):  # a failure runs again
            gate.call("note", {"order_id": "o-1", "text": "a\x00b"}, context("m1"))
        assert receiver.count("note") == 2
    finally:
        gate.close()
