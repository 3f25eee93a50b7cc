"""Round 12: the async and step flows (acall, acall_step, call_step) at their edges.

Effects are counted at the tool and records read back from the store; on SQLite and PostgreSQL
(`make_gate` is on the parametrized `store`). Waits are events and executor shutdowns, never sleeps.

- An `acall_step` cancelled while a read of the step ran in its worker thread went on, once the
  read returned, to propose the step's next gated call: an approval and a card for a task that
  was cancelled (a reviewer asked to decide a call nobody waits for). A write was already refused
  (`Abandoned`); now a proposal is too: nothing more is claimed or proposed for a cancelled task.
- A write or gated row whose tool is a generator function (async or not) was accepted, and its
  call recorded `succeeded` with `{"unserializable": "async_generator"}` while its body never ran
  (the grant spent, nothing paid), or, a sync generator, its body run by the result's
  serialization, after the tool "returned": an exception it raised (a declined payment) was
  recorded as a success. Now such a row is a TableError; a read may still return a stream.
- A sync tool that returned a task it scheduled on the running loop (`asyncio.ensure_future`),
  called through `call` in a notebook cell, was refused after its claim and recorded as a
  definite failure (nothing ran, the write free to run again) while its task still ran the effect
  once the cell yielded. Now a task whose coroutine has not started is cancelled, as an unrun
  coroutine is closed: the record and the receiver agree that nothing ran.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from effectgate import Effect, EffectTable, ToolSpec
from effectgate.errors import TableError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import MakeGate
from .test_lease_edges import _finish


def _step_table(lookup: Any, pay: Any) -> EffectTable:
    table = EffectTable(
        [
            ToolSpec(name="lookup", effect=Effect.READ, fn=lookup),
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",)),
        ]
    )
    table.allow("support", ["lookup", "pay"])
    return table


def test_a_cancelled_step_proposes_none_of_its_later_calls(make_gate: MakeGate, store: SQLStore) -> None:
    in_read, finish = threading.Event(), threading.Event()
    paid: list[int] = []

    def lookup(account: str) -> dict[str, str]:
        """Look an account up (slow)."""
        in_read.set()
        assert finish.wait(10)
        return {"account": account}

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        paid.append(amount)
        return {"paid": amount}

    gate = make_gate(_step_table(lookup, pay))
    calls = [("lookup", {"account": "acct-1"}), ("pay", {"account": "acct-1", "amount": 5})]
    kept: list[Any] = []

    async def main() -> None:
        task = asyncio.ensure_future(gate.acall_step(calls, context("m1")))
        await asyncio.to_thread(in_read.wait, 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            kept.extend([task, exc])

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())
    finish.set()
    _finish(loop)
    assert len(kept) == 2
    assert paid == []
    assert gate.pending() == []  # no card for the cancelled task's later call
    assert store.approvals() == []


async def _paying_stream(account: str, amount: int) -> AsyncIterator[int]:
    """Pay `amount` to an account (written as an async generator)."""
    yield amount


def _declining_stream(account: str, amount: int) -> Iterator[int]:
    """Pay `amount` to an account (written as a generator; the provider declines)."""
    raise ValueError("card declined")
    yield amount


@pytest.mark.parametrize("effect", [Effect.WRITE, Effect.MONEY])
@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(_paying_stream, id="async-generator"),
        pytest.param(_declining_stream, id="generator"),
        pytest.param(functools.partial(_paying_stream, amount=5), id="partial"),
    ],
)
def test_a_generator_tool_is_no_write_or_gated_row(
    make_gate: MakeGate, store: SQLStore, effect: Effect, fn: Any
) -> None:
    def pay() -> Any:  # what ran before: recorded `succeeded`, nothing paid
        table = EffectTable([ToolSpec(name="pay", effect=effect, fn=fn, approver_role="finance")])
        table.allow("support", ["pay"])
        return make_gate(table).call("pay", {"account": "acct-1", "amount": 5}, context("m1"))

    with pytest.raises(TableError, match="generator"):
        pay()
    assert store.executions() == []


def test_a_read_may_still_return_a_stream() -> None:
    spec = ToolSpec(name="stream", effect=Effect.READ, fn=_paying_stream)
    assert spec.fn is _paying_stream


def test_a_task_a_sync_tool_scheduled_on_the_running_loop_does_not_run_after_its_refusal(
    make_gate: MakeGate, store: SQLStore
) -> None:
    sent: list[str] = []
    scheduled: list[asyncio.Future[None]] = []

    async def deliver(to: str) -> None:
        sent.append(to)

    def send(to: str) -> object:
        """Send a message (scheduled on the running loop)."""
        task = asyncio.ensure_future(deliver(to))
        scheduled.append(task)
        return task

    table = EffectTable([ToolSpec(name="send", effect=Effect.WRITE, fn=send)])
    table.allow("support", ["send"])
    gate = make_gate(table)

    async def cell() -> None:  # a notebook cell: the sync API on a thread whose loop runs
        with pytest.raises(RuntimeError, match="acall"):
            gate.call("send", {"to": "a@x.example"}, context("m1"))
        await asyncio.wait(scheduled)  # the loop runs what the tool scheduled

    asyncio.run(cell())
    assert [e.status for e in store.executions()] == ["failed"]  # recorded: nothing ran
    assert sent == []  # and nothing did
