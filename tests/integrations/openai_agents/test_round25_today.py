"""Review of today's changes (round 25), OpenAI Agents adapter: `reject` (and the SDK's own
`state.reject`, bridged) trusted a status column edited to 'denied' (no seal covers it) and recorded
no denial, bypassing the core's round 24 fix. Scripted models drive the real Runner; effects are
counted at the receiver; SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from agents import Runner, RunState

from effectgate import Approver
from effectgate.errors import AlreadyDecided
from effectgate.testing import say
from effectgate_openai_agents import approve_as, pending_approvals, reject

from ._harness import context
from .test_native_approvals import FINANCE, REFUND, Shop
from .test_round20_openai import _output


def test_reject_of_a_copy_whose_approval_another_copy_denied_lets_the_run_go_on(store_url: str) -> None:
    """A pin (it held): another copy of the state was rejected first (a sealed denial); rejecting
    this copy, by anyone, rejects its SDK call with that denial, and nothing is denied twice."""
    shop = Shop(store_url, [REFUND, say("Not refunded."), say("Not refunded.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        text = first.to_state().to_string()
        one = asyncio.run(RunState.from_string(shop.agent, text))
        two = asyncio.run(RunState.from_string(shop.agent, text))
        [a] = pending_approvals(one)
        [b] = pending_approvals(two)
        assert reject(shop.gate, one, a, approver=FINANCE, reason="no") is not None
        reject(shop.gate, two, b, approver=Approver("sam", "support"), reason="no, again")  # no role needed
        ended = Runner.run_sync(shop.agent, two)
        assert ended.interruptions == []
        assert _output(ended, "c1").startswith("Refused (denied)")
        [row] = shop.gate.store.approvals()
        assert row.status == "denied"
        assert [d.decision for d in shop.gate.store.all_decisions()] == ["deny"]
        assert shop.receiver.count("refund") == 0
    finally:
        shop.gate.close()


def test_reject_of_a_call_whose_status_column_was_edited_to_denied_records_the_denial(
    store_url: str,
) -> None:
    """The run pauses on a refund; its approval's status column (no seal covers it) is edited to
    'denied' with no sealed denial behind it. `reject` read that column and only rejected the SDK
    call: the reviewer's denial was never recorded (the core's fix, round 24, bypassed), and the
    column edited back to 'pending' let a copy of the run be approved and pay. Now the denial is
    recorded, sealed, and holds."""
    shop = Shop(store_url, [REFUND, say("Not refunded."), say("Refunded.")])
    try:
        first = Runner.run_sync(shop.agent, "Refund 1042", context=context("m1"))
        text = first.to_state().to_string()
        one = asyncio.run(RunState.from_string(shop.agent, text))
        [paused] = pending_approvals(one)
        _status(shop.gate.store, str(paused.approval_id), "denied")

        reject(shop.gate, one, paused, approver=FINANCE, reason="not this one")
        ended = Runner.run_sync(shop.agent, one)
        assert ended.interruptions == []
        assert _output(ended, "c1").startswith("Refused (denied)")
        assert [d.decision for d in shop.gate.store.all_decisions()] == ["deny"]

        _status(shop.gate.store, str(paused.approval_id), "pending")  # edited back
        two = asyncio.run(RunState.from_string(shop.agent, text))
        [again] = pending_approvals(two)
        with pytest.raises(AlreadyDecided):
            approve_as(shop.gate, two, again, FINANCE)
        assert shop.receiver.count("refund") == 0
    finally:
        shop.gate.close()


def _status(store: Any, approval_id: str, status: str) -> None:
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = :s WHERE id = :i"), {"s": status, "i": approval_id}
        )


def test_a_native_reject_of_a_call_whose_status_column_was_edited_to_denied_records_the_denial(
    store_url: str,
) -> None:
    """As above, rejected with the SDK's own `state.reject(item)`: the bridge took the column's
    'denied' as closed and recorded nothing. Now the denial is recorded (as sdk-reject) and holds."""
    shop = Shop(store_url, [REFUND, say("Not refunded.")])
    try:
        state = shop.pause()
        row = shop.row(state)
        _status(shop.gate.store, row.id, "denied")
        state.reject(state.get_interruptions()[0], rejection_message="Not this order.")
        shop.resume(state)
        assert [d[2] for d in shop.decisions(row.id)] == ["deny"]
        _status(shop.gate.store, row.id, "pending")  # edited back: the sealed denial decides
        with pytest.raises(AlreadyDecided):
            shop.gate.approve(row.id, version=1, approver=FINANCE)
        assert shop.receiver.count("refund") == 0
    finally:
        shop.gate.close()
