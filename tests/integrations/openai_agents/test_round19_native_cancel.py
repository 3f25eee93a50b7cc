"""Round 19: a run cancelled while its native approve (`state.approve(item)` settled as the
configured `native_approver`) commits the grant in its worker thread.

The adapter ran `gate.approve` in `asyncio.to_thread`: the cancelled run left the approval
approved with a grant whose token nobody held (only its hash is stored), so the next request's
`state.approve(item)` was refused (`AlreadyDecided`) until the grant lapsed and the refund could
not run. Now it awaits `gate.aapprove`, which waits for its thread and voids the grant it minted:
the approval is approved again and the refund runs once. On SQLite and PostgreSQL; the refund is
counted at the receiver. Threads meet at events; the guard is a bound a passing run never nears.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from agents import Runner, RunState

from effectgate._decisions import Decisions
from effectgate.testing import say
from effectgate_openai_agents import pending_approvals

from ._harness import context, tool_results
from .test_native_approvals import FINANCE, REFUND, Shop

GUARD = 10.0  #: seconds: a bound on a wait that a passing run never comes near


def test_a_run_cancelled_while_its_native_approve_commits_leaves_an_approval_approvable_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Shop(store_url, [REFUND, say("Refunded.")], native_approver=FINANCE)
    try:
        paused = Runner.run_sync(s.agent, "Please refund my order", context=context("m1"))
        assert paused.interruptions
        snapshot = paused.to_state().to_string()
        [item] = pending_approvals(paused)
        approval_id = item.approval_id or ""

        entered, go = threading.Event(), threading.Event()
        mint = Decisions.mint

        def held(self: Decisions, *args: Any, **kwargs: Any) -> Any:
            entered.set()  # inside the native approve's transaction, in its worker thread
            assert go.wait(GUARD)
            return mint(self, *args, **kwargs)

        monkeypatch.setattr(Decisions, "mint", held)

        async def cancelled_run() -> None:
            state = await RunState.from_string(s.agent, snapshot)
            state.approve(state.get_interruptions()[0])
            task = asyncio.ensure_future(Runner.run(s.agent, state))
            await asyncio.to_thread(entered.wait, GUARD)
            task.cancel()  # the request is cancelled while the grant commits
            go.set()
            await asyncio.wait({task}, timeout=GUARD)
            assert task.cancelled()

        asyncio.run(cancelled_run())  # waits for the default executor's threads
        monkeypatch.undo()
        assert entered.is_set()
        assert s.receiver.count("refund") == 0
        row = s.gate.store.get_approval(approval_id)
        assert row is not None
        assert row.token_expires_at is not None
        assert row.token_expires_at <= s.gate.clock.now()  # the lost token's grant can run nothing

        # the next request restores the same snapshot and approves again: it is granted and runs
        state = asyncio.run(RunState.from_string(s.agent, snapshot))
        state.approve(state.get_interruptions()[0])
        result = Runner.run_sync(s.agent, state)
        assert [o.content for o in tool_results(result)] == ["refunded 500 on 1042"]
        assert s.receiver.count("refund", order_id="1042", amount=500) == 1
        assert [e.status for e in s.gate.store.executions()] == ["succeeded"]
        assert s.gate.audit().findings == []
        s.model.assert_complete()
    finally:
        s.gate.close()
