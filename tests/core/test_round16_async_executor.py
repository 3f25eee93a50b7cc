"""Round 16: an async call whose worker-thread job its executor dropped (a default executor shut
down with `cancel_futures=True`, as an application's shutdown does to exit fast). On SQLite and
PostgreSQL; effects are counted at the tool, records read back from the store.

- Cancelled while the store step that records its payment's outcome waited in the executor, and
  the executor then dropped that job: the job never ran, so the payment's outcome was never stored
  and the flow stayed suspended at the tool, its lease renewed for as long as the task was kept
  (`recover` in another worker could never take it over). Now a job its executor dropped runs on
  the loop instead: the outcome is stored and the lease released.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from effectgate import Policy
from effectgate.stores import SQLStore

from .conftest import MakeGate
from .test_lease_edges import _cancel, _on_one_thread, _OneThread
from .test_lease_renewal import LEASE, _granted, _table


def test_a_tool_outcome_whose_store_step_the_executor_dropped_is_stored(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The payment returned; its store step was queued behind another job, the task cancelled,
    and the executor shut down dropping queued jobs: the outcome is stored all the same, and no
    lease is kept renewed."""
    ran: list[int] = []
    kept: list[Any] = []
    in_tool, finish = threading.Event(), threading.Event()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account."""
        ran.append(amount)
        in_tool.set()
        assert finish.wait(10)
        return {"paid": amount}

    gate = make_gate(_table(pay), policy=Policy(lease_seconds=LEASE))
    token = _granted(gate).token

    async def scenario(loop: asyncio.AbstractEventLoop, executor: _OneThread, side: Any) -> None:
        task = asyncio.ensure_future(gate.aexecute(token))
        await loop.run_in_executor(side, in_tool.wait, 10)
        blocking, unblock = threading.Event(), threading.Event()

        def blocker() -> None:
            blocking.set()
            assert unblock.wait(10)

        blocked = loop.run_in_executor(None, blocker)  # queued behind the tool
        queued = executor.submitted
        finish.set()  # the tool returns; the blocker takes the thread
        await loop.run_in_executor(side, blocking.wait, 10)
        await loop.run_in_executor(side, executor.until, queued + 1)  # the store step is queued
        await _cancel(task, kept)
        executor.shutdown(wait=False, cancel_futures=True)  # the queued store step is dropped
        unblock.set()
        await blocked

    _on_one_thread(scenario)
    assert len(kept) == 2
    assert ran == [5]
    assert [e.status for e in store.executions()] == ["succeeded"]
    [record] = store.idempotency_records()
    assert record.status == "succeeded"
    assert gate._settlement.leases._held == {}
