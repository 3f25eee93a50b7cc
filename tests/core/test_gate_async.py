"""The async twins (acall, acall_step, aapprove, adeny, aexecute) keep the same guarantees."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Refused,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

FINANCE = Approver("fiona", "finance")
AGENT = "teller"
PAY = {"account": "a1", "amount": 500}


class AsyncBank:
    """Coroutine tools: a read, a write and a money transfer, counted at the receiver."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.timeouts = 0
        self.reads = 0
        self.flaky_reads = 0

    async def balance(self, account: str) -> dict[str, Any]:
        """An account's balance."""
        await asyncio.sleep(0)
        self.reads += 1
        if self.flaky_reads:
            self.flaky_reads -= 1
            raise ConnectionError("bank API busy")
        return {"account": account, "balance": 1000}

    async def note(self, account: str, text: str) -> dict[str, Any]:
        """Attach a note to an account."""
        await asyncio.sleep(0)
        self.receiver.record("note", account=account, text=text)
        return {"account": account, "text": text}

    async def transfer(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Move money out of an account."""
        await asyncio.sleep(0)
        self.receiver.record("transfer", idempotency_key=tool_context.idempotency_key, account=account)
        if self.timeouts:
            self.timeouts -= 1
            raise TimeoutError("bank did not answer")
        return {"account": account, "amount": amount}

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(name="balance", effect=Effect.READ, fn=self.balance, transient=(ConnectionError,)),
                ToolSpec(name="note", effect=Effect.WRITE, fn=self.note),
                ToolSpec(
                    name="transfer",
                    effect=Effect.MONEY,
                    fn=self.transfer,
                    approver_role="finance",
                    subject=("account",),
                ),
            ]
        )
        table.allow_all(AGENT)
        return table


@pytest.fixture
def bank() -> AsyncBank:
    return AsyncBank()


@pytest.fixture
def gate(bank: AsyncBank, make_gate: MakeGate) -> EffectGate:
    return make_gate(bank.table())


def ctx(message: str = "m1", session: str = "s1") -> CallContext:
    return CallContext(session_id=session, origin_message_id=message, user_id="u1", agent_id=AGENT)


async def agrant(gate: EffectGate, message: str = "m1") -> Grant:
    out = await gate.acall("transfer", PAY, ctx(message))
    assert isinstance(out, Pending), out
    grant = await gate.aapprove(out.approval_id, version=out.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def test_async_read_runs_and_is_logged(gate: EffectGate, store: SQLStore) -> None:
    """acall runs a coroutine read tool and logs the read."""
    out = asyncio.run(gate.acall("balance", {"account": "a1"}, ctx()))
    assert isinstance(out, Executed)
    assert out.result == {"account": "a1", "balance": 1000}
    gate.flush()
    assert [e.tool for e in store.events(kind="read")] == ["balance"]


def test_async_transient_read_is_retried_on_the_clock(
    gate: EffectGate, bank: AsyncBank, clock: FakeClock
) -> None:
    """A transient failure of an async read is retried with the policy's backoff."""
    bank.flaky_reads = 1
    out = asyncio.run(gate.acall("balance", {"account": "a1"}, ctx()))
    assert isinstance(out, Executed)
    assert bank.reads == 2
    assert clock.slept == [gate.policy.retry_backoff]


def test_async_write_runs_once_and_replays(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """An async write runs once; the same message replayed returns the stored result."""

    async def scenario() -> tuple[Any, Any]:
        first = await gate.acall("note", {"account": "a1", "text": "vip"}, ctx())
        again = await gate.acall("note", {"account": "a1", "text": "vip"}, ctx())
        return first, again

    first, again = asyncio.run(scenario())
    assert isinstance(first, Executed)
    assert isinstance(again, Executed)
    assert (first.replay, again.replay) == (False, True)
    assert bank.receiver.count("note") == 1
    assert [e.status for e in store.executions()] == ["succeeded"]


def test_async_gated_call_pauses(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """acall of a money tool returns Pending; the coroutine tool has not run."""
    out = asyncio.run(gate.acall("transfer", PAY, ctx()))
    assert isinstance(out, Pending)
    assert [r.status for r in store.approvals()] == ["pending"]
    assert bank.receiver.count("transfer") == 0


def test_async_approve_and_execute_run_once(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """aapprove then aexecute runs the transfer once, with the approval's idempotency key."""

    async def scenario() -> tuple[Grant, Executed]:
        grant = await agrant(gate)
        return grant, await gate.aexecute(grant.token)

    grant, done = asyncio.run(scenario())
    assert done.result == PAY
    [effect] = bank.receiver.effects
    assert effect.idempotency_key == f"eg_{grant.approval_id}_v1"
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert row.status == "executed"


def test_async_reused_token_is_refused(gate: EffectGate, bank: AsyncBank) -> None:
    """A second aexecute of the same grant raises TokenError(used); one transfer."""

    async def scenario() -> str:
        grant = await agrant(gate)
        await gate.aexecute(grant.token)
        try:
            await gate.aexecute(grant.token)
        except TokenError as exc:
            return exc.reason
        return "ran twice"

    assert asyncio.run(scenario()) == "used"
    assert bank.receiver.count("transfer") == 1


def test_concurrent_async_executions_transfer_once(gate: EffectGate, bank: AsyncBank) -> None:
    """Two aexecute of one grant gathered on one loop: one runs, one is refused used."""

    async def scenario() -> list[Any]:
        grant = await agrant(gate)
        return await asyncio.gather(
            gate.aexecute(grant.token), gate.aexecute(grant.token), return_exceptions=True
        )

    results = asyncio.run(scenario())
    assert sorted(type(r).__name__ for r in results) == ["Executed", "TokenError"]
    assert [r.reason for r in results if isinstance(r, TokenError)] == ["used"]
    assert bank.receiver.count("transfer") == 1


def test_async_replay_after_execution_returns_the_stored_result(gate: EffectGate, bank: AsyncBank) -> None:
    """The same message replayed through acall after execution returns Executed(replay=True)."""

    async def scenario() -> Any:
        grant = await agrant(gate)
        await gate.aexecute(grant.token)
        return await gate.acall("transfer", PAY, ctx())

    out = asyncio.run(scenario())
    assert isinstance(out, Executed)
    assert out.replay
    assert out.result == PAY
    assert bank.receiver.count("transfer") == 1


def test_async_deny_refuses_and_nothing_runs(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """adeny returns Refused(denied); the grant-less transfer never runs."""

    async def scenario() -> Refused:
        out = await gate.acall("transfer", PAY, ctx())
        assert isinstance(out, Pending)
        return await gate.adeny(out.approval_id, approver=FINANCE, reason="account frozen")

    refused = asyncio.run(scenario())
    assert refused.code == "denied"
    assert [r.status for r in store.approvals()] == ["denied"]
    assert bank.receiver.count("transfer") == 0


def test_async_parallel_gated_calls_register_none(gate: EffectGate, store: SQLStore) -> None:
    """acall_step with two transfers refuses both with parallel_calls; the read beside them runs."""
    outs = asyncio.run(
        gate.acall_step(
            [("transfer", PAY), ("transfer", {**PAY, "amount": 1}), ("balance", {"account": "a1"})], ctx()
        )
    )
    assert [o.code for o in outs[:2] if isinstance(o, Refused)] == ["parallel_calls", "parallel_calls"]
    assert isinstance(outs[2], Executed)
    assert store.approvals() == []


def test_async_timeout_needs_reconciliation(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """An async tool that times out parks the record as needs_reconciliation; a retry does not rerun it."""

    async def scenario() -> Grant:
        grant = await agrant(gate)
        for _ in range(2):
            with pytest.raises(NeedsReconciliation):
                await gate.aexecute(grant.token)
        return grant

    bank.timeouts = 1
    grant = asyncio.run(scenario())
    record = store.get(f"eg_{grant.approval_id}_v1")
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert bank.receiver.count("transfer") == 1


def test_sync_call_runs_an_async_tool_outside_a_loop(gate: EffectGate, bank: AsyncBank) -> None:
    """Without a running loop, the sync API runs a coroutine tool to completion."""
    out = gate.call("note", {"account": "a1", "text": "vip"}, ctx())
    assert isinstance(out, Executed)
    assert out.result == {"account": "a1", "text": "vip"}
    assert bank.receiver.count("note") == 1


def test_sync_call_inside_a_loop_refuses_an_async_tool(gate: EffectGate, bank: AsyncBank) -> None:
    """Inside a running loop the sync API refuses a coroutine tool and names the async method."""

    async def scenario() -> None:
        gate.call("balance", {"account": "a1"}, ctx())

    with pytest.raises(RuntimeError, match="acall"):
        asyncio.run(scenario())
    assert bank.reads == 0


def test_sync_write_inside_a_loop_claims_nothing(gate: EffectGate, bank: AsyncBank, store: SQLStore) -> None:
    """A write's async tool called through the sync API on a loop is refused before its claim:
    no record is left failed, and the same call then runs once under acall."""
    args = {"account": "a1", "text": "vip"}

    async def scenario() -> Any:
        with pytest.raises(RuntimeError, match="acall"):
            gate.call("note", args, ctx())
        return await gate.acall("note", args, ctx())

    out = asyncio.run(scenario())
    assert isinstance(out, Executed)
    assert not out.replay
    assert bank.receiver.count("note") == 1
    record = store.get(out.idempotency_key or "")
    assert record is not None
    assert (record.status, record.attempts) == ("succeeded", 1)


def test_sync_execute_inside_a_loop_keeps_the_grant(
    gate: EffectGate, bank: AsyncBank, store: SQLStore
) -> None:
    """`execute` of an async money tool on a loop (a notebook cell) is refused before the claim:
    the grant is not spent and no record awaits reconciliation; `aexecute` then runs it once."""

    async def scenario() -> tuple[Grant, Executed]:
        grant = await agrant(gate)
        with pytest.raises(RuntimeError, match="aexecute"):
            gate.execute(grant.token)
        assert store.get(f"eg_{grant.approval_id}_v1") is None
        return grant, await gate.aexecute(grant.token)

    grant, out = asyncio.run(scenario())
    assert isinstance(out, Executed)
    assert not out.replay
    assert bank.receiver.count("transfer") == 1
    record = store.get(f"eg_{grant.approval_id}_v1")
    assert record is not None
    assert record.status == "succeeded"
    row = store.get_approval(grant.approval_id)
    assert row is not None
    assert row.status == "executed"
