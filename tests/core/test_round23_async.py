"""Round 23: the drivers' edges (`flow.py`) and the store's own `run`. On SQLite and PostgreSQL;
effects are counted at the receiver (`EffectRecorder`), records read back from the store.

- A write or gated tool that returned what never ran: an async tool its request's coroutine
  (not awaited), a plain function a generator or an async generator (a generator function behind
  a decorator): the call was recorded executed, its result `{"unserializable": "coroutine"}`, with
  nothing run; a generator was iterated by the result's serialization (its body ran in the store
  step, an exception of its own stored as a success, the stored result the exhausted `[]`); a
  pending Future (a thread pool's job) was recorded executed while its work could still fail. Now it
  is an unknown outcome (`flow.Unfinished`: the tool's body ran, what it returned did not), the
  work closed unrun: `needs_reconciliation`, and nothing runs it again.
- `IdempotencyStore.run` took a `TimeoutError` (a socket timeout: the request may have landed)
  for a definite failure: the record ended `failed` and the next `run` of the key ran the
  function again. Now it is an unknown outcome, as the gate's writes take it:
  `needs_reconciliation`, `NeedsReconciliation` raised, and nothing runs again. So is an async
  function passed to `run`: its coroutine was stored as a success, `{"unserializable": ...}`.
- A write that handed its work to another event loop (of another thread) and returned that loop's
  pending Future: awaiting it on the caller's loop raised a plain RuntimeError ("attached to a
  different loop"), a definite failure for a write: the record ended `failed`, and the same call
  again ran the tool a second time. Now it is an unknown outcome (`flow.Unfinished`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, Grant, Pending, Refused, ToolSpec, flow
from effectgate._execution import EXEC_PREFIX
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate
from .test_lease_edges import _cancel_while, _finish
from .test_lease_renewal import _granted, _table

GUARD = 10.0  #: seconds: a bound on a wait that a passing run never comes near

FINANCE = Approver("fiona", "finance")
HASH = "h" * 64


def _generators(receiver: EffectRecorder) -> dict[str, Callable[..., Any]]:
    """Tools that return a generator (or an async one), or a coroutine, whose body records the effect."""

    async def paying(account: str) -> AsyncIterator[dict[str, str]]:
        receiver.record("pay", account=account)
        yield {"paid": account}

    def paying_sync(account: str, amount: int) -> Iterator[dict[str, str]]:
        receiver.record("pay", account=account)
        yield {"paid": account}

    def returns_async(account: str, amount: int) -> Any:
        """Pay (a plain function returning an async generator)."""
        return paying(account)

    @functools.wraps(paying_sync)
    def decorated(account: str, amount: int) -> Any:
        """Pay (a generator function behind a plain decorator)."""
        return paying_sync(account, amount)

    async def posting(account: str) -> dict[str, str]:
        receiver.record("pay", account=account)
        return {"paid": account}

    async def unawaited(account: str, amount: int) -> Any:
        """Pay (an async tool that returns its request's coroutine, not awaited)."""
        return posting(account)

    def submitted(account: str, amount: int) -> Any:
        """Pay (handed to a thread pool: the job's Future is returned, still pending)."""
        return concurrent.futures.Future()  # as `pool.submit(...)` returns it before the job ends

    return {
        "async_generator": returns_async,
        "generator": decorated,
        "coroutine": unawaited,
        "future": submitted,
    }


@pytest.mark.parametrize("kind", ["async_generator", "generator", "coroutine", "future"])
@pytest.mark.parametrize("driver", ["execute", "aexecute"])
def test_a_gated_tool_returning_work_it_did_not_run_is_an_unknown_outcome(
    make_gate: MakeGate, store: SQLStore, kind: str, driver: str
) -> None:
    receiver = EffectRecorder()
    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=_generators(receiver)[kind],
        approver_role="finance",
        subject=("account",),
    )
    table = EffectTable([spec])
    table.allow("support", ["pay"])
    gate = make_gate(table)
    pending = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    run = gate.execute if driver == "execute" else lambda token: asyncio.run(gate.aexecute(token))
    with pytest.raises(NeedsReconciliation) as info:
        run(grant.token)
    assert isinstance(info.value.__cause__, flow.Unfinished)
    with pytest.raises(NeedsReconciliation):
        run(grant.token)  # the grant again: answered, nothing runs
    again = gate.call("pay", {"account": "acct-1", "amount": 5}, context("m1"))
    assert isinstance(again, Refused)
    assert again.code == "needs_reconciliation"
    assert receiver.count("pay") == 0
    assert gate.result(pending.approval_id) is None
    record = store.get(info.value.key)
    assert record is not None
    assert record.status == "needs_reconciliation"


@pytest.mark.parametrize("kind", ["async_generator", "generator", "coroutine", "future"])
def test_a_write_returning_work_it_did_not_run_is_an_unknown_outcome(
    make_gate: MakeGate, store: SQLStore, kind: str
) -> None:
    receiver = EffectRecorder()
    table = EffectTable([ToolSpec(name="pay", effect=Effect.WRITE, fn=_generators(receiver)[kind])])
    table.allow("support", ["pay"])
    gate = make_gate(table)
    args = {"account": "acct-1", "amount": 5}
    with pytest.raises(NeedsReconciliation) as info:
        asyncio.run(gate.acall("pay", args, context("m1")))
    replay = asyncio.run(gate.acall("pay", args, context("m1")))  # nothing runs
    assert isinstance(replay, Refused)
    assert replay.code == "needs_reconciliation"
    assert receiver.count("pay") == 0
    record = store.get(info.value.key)
    assert record is not None
    assert (record.status, record.result) == ("needs_reconciliation", None)


def test_a_store_run_whose_function_timed_out_is_never_run_again(store: SQLStore) -> None:
    receiver = EffectRecorder()

    def pay() -> str:
        receiver.record("pay")
        raise TimeoutError("read timed out")  # the request may have landed

    with pytest.raises(NeedsReconciliation):
        store.run("k", HASH, pay)
    with pytest.raises(NeedsReconciliation):
        store.run("k", HASH, pay)
    assert receiver.count("pay") == 1
    record = store.get("k")
    assert record is not None
    assert (record.status, record.attempts) == ("needs_reconciliation", 1)


def test_a_store_run_of_an_async_function_is_not_stored_as_run(store: SQLStore) -> None:
    receiver = EffectRecorder()

    async def pay() -> str:
        receiver.record("pay")
        return "paid"

    with pytest.raises(NeedsReconciliation):
        store.run("k", HASH, pay)
    with pytest.raises(NeedsReconciliation):
        store.run("k", HASH, pay)
    assert receiver.count("pay") == 0
    record = store.get("k")
    assert record is not None
    assert (record.status, record.result) == ("needs_reconciliation", None)


@pytest.mark.parametrize("driver", ["call", "acall"])
def test_a_write_returning_a_pending_future_of_another_loop_is_not_run_again(
    make_gate: MakeGate, store: SQLStore, driver: str
) -> None:
    receiver = EffectRecorder()
    elsewhere = asyncio.new_event_loop()  # the application's own loop (of another thread)

    def send(note: str) -> Any:
        """Send a note through the application's own event loop."""
        receiver.record("send", note=note)  # handed over: it may land whatever the caller sees
        return elsewhere.create_future()

    table = EffectTable([ToolSpec(name="send", effect=Effect.WRITE, fn=send)])
    table.allow("support", ["send"])
    gate = make_gate(table)
    run = gate.call if driver == "call" else lambda *a: asyncio.run(gate.acall(*a))
    try:
        with pytest.raises(NeedsReconciliation) as info:
            run("send", {"note": "n"}, context("m1"))
        again = run("send", {"note": "n"}, context("m1"))  # the same call: nothing runs
    finally:
        elsewhere.close()
    assert isinstance(again, Refused)
    assert again.code == "needs_reconciliation"
    assert receiver.count("send") == 1
    record = store.get(info.value.key)
    assert record is not None
    assert record.status == "needs_reconciliation"


def test_a_cancelled_aexecute_whose_tool_then_returns_a_generator_is_an_unknown_outcome(
    make_gate: MakeGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The same through the flow the cancelled task left to its worker thread (`_Worker.store`)."""
    receiver = EffectRecorder()
    started, finish = threading.Event(), threading.Event()

    def pay(account: str, amount: int) -> Any:
        """Pay (a plain function returning a generator, after a slow provider)."""
        started.set()
        assert finish.wait(GUARD)
        return iter(_generators(receiver)["generator"](account, amount))

    gate = make_gate(_table(pay))
    grant = _granted(gate)
    kept: list[Any] = []
    loop = _cancel_while(gate, grant.token, started, kept)
    finish.set()
    _finish(loop)
    assert receiver.count("pay") == 0
    assert gate.result(grant.approval_id) is None
    assert "could not be stored" not in caplog.text
    record = store.get(f"{EXEC_PREFIX}{grant.approval_id}_v{grant.version}")
    assert record is not None
    assert record.status == "needs_reconciliation"
