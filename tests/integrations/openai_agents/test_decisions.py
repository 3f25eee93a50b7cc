"""Every decision is bound to the operation and version it was made for, in both adapter modes.

Approval mode binds a grant to the paused call in `approve()`; deferred mode binds it to the
operation in `execute_deferred`. A grant for another operation, or for a version the run did not
pause on, runs nothing: counted at the receiver and on the record.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Runner

from effectgate import Grant, Pending
from effectgate.errors import StaleApproval
from effectgate.examples.shop import context as shop_context
from effectgate.testing import Script, call, step
from effectgate_openai_agents import (
    DecisionMismatch,
    aexecute_deferred,
    approve,
    approve_as,
    deferred_operations,
    deferred_payload,
    execute_deferred,
    pending_approvals,
)
from tests.conformance.adapters import EMAIL, FINANCE, REFUND, SUPPORT_LEAD, Paused, ShopGate, grant

from ._harness import context, tool_results
from .conftest import MakeOpenAIHarness

HALF = {**REFUND, "amount": 6000}


def _status(shop_gate: ShopGate, approval_id: str) -> str:
    row = shop_gate.store.get_approval(approval_id)
    assert row is not None
    return row.status


def _as_paused(op: dict[str, Any]) -> Paused:
    return Paused(op["operation_id"], op["version"], op["args_hash"], op["tool"])


def _amend_refund(shop_gate: ShopGate, approval_id: str) -> Pending:
    """A later user message (m4) asks for half the refund: the same approval, version 2."""
    amended = shop_gate.gate.call("refund_order", HALF, shop_context("m4"))
    assert isinstance(amended, Pending)
    assert (amended.approval_id, amended.version) == (approval_id, 2)
    return amended


def test_approve_refuses_a_grant_for_a_newer_version(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The run paused on version 1; a grant for version 2 (amended by a later message) is refused by
    `approve()` with DecisionMismatch, the SDK item stays pending, and resuming runs nothing."""
    h = oa_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    amended = _amend_refund(shop_gate, paused.approval_id)
    newer = grant(shop_gate.gate, Paused(paused.approval_id, 2, amended.card.args_hash, paused.tool))
    state = h.restore()
    [waiting] = pending_approvals(state)
    with pytest.raises(DecisionMismatch):
        approve(state, waiting, newer)
    assert [i.call_id for i in state.get_interruptions()] == [waiting.call_id]
    assert state._context is not None
    assert state._context.get_approval_status("refund_order", waiting.call_id) is None  # undecided
    again = Runner.run_sync(h.agent, state)
    assert [p.approval_id for p in pending_approvals(again)] == [paused.approval_id]  # paused again
    assert tool_results(again) == ()
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert _status(shop_gate, paused.approval_id) == "approved"  # version 2 waits, unspent
    with pytest.raises(StaleApproval):
        approve_as(shop_gate.gate, state, waiting, FINANCE)  # version 1 cannot be decided now
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def _deferred_refund_and_email(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One deferred turn proposing the refund and the email: their two operations."""
    h = oa_harness(
        Script([step(call("refund_order", **REFUND), call("send_email", **EMAIL))]), mode="deferred"
    )
    result = Runner.run_sync(h.agent, "Refund 1042 and email me", context=context("m3"))
    by_tool = {op["tool"]: op for op in deferred_operations(result)}
    assert sorted(by_tool) == ["refund_order", "send_email"]
    assert shop_gate.shop.receiver.effects == []
    h.script.assert_complete()
    return by_tool["refund_order"], by_tool["send_email"]


def test_execute_deferred_refuses_a_grant_for_another_operation(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The email's grant presented for the refund operation (by id or by payload, sync or async)
    is DecisionMismatch: no email is sent, nothing is refunded, neither approval is spent."""
    refund, email = _deferred_refund_and_email(oa_harness, shop_gate)
    email_grant = grant(shop_gate.gate, _as_paused(email), SUPPORT_LEAD)
    for operation in (refund["operation_id"], refund):
        with pytest.raises(DecisionMismatch):
            execute_deferred(shop_gate.gate, operation, email_grant)
        with pytest.raises(DecisionMismatch):
            asyncio.run(aexecute_deferred(shop_gate.gate, operation, email_grant))
    assert shop_gate.shop.receiver.count("email") == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert _status(shop_gate, email["operation_id"]) == "approved"
    assert _status(shop_gate, refund["operation_id"]) == "pending"
    done = execute_deferred(shop_gate.gate, email, email_grant)  # its own operation: runs once
    assert done.tool == "send_email"
    assert shop_gate.shop.receiver.count("email") == 1
    assert shop_gate.shop.receiver.count("refund") == 0


def test_execute_deferred_binds_the_grant_to_the_payloads_version(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The refund amended to version 2 by another message: its grant is refused for the version-1
    payload the run deferred; by id (the operation as it stands) or with the version-2 payload it
    runs once, and every later call returns the stored result without a second refund."""
    refund, _ = _deferred_refund_and_email(oa_harness, shop_gate)
    amended = _amend_refund(shop_gate, refund["operation_id"])
    newer = shop_gate.gate.approve(refund["operation_id"], version=2, approver=FINANCE)
    assert isinstance(newer, Grant)
    for run in (execute_deferred, lambda g, op, t: asyncio.run(aexecute_deferred(g, op, t))):
        with pytest.raises(DecisionMismatch):
            run(shop_gate.gate, refund, newer)
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    assert _status(shop_gate, refund["operation_id"]) == "approved"

    done = execute_deferred(shop_gate.gate, refund["operation_id"], newer)
    assert shop_gate.shop.receiver.count("refund", order_id="1042", amount=6000) == 1
    current = deferred_payload(amended)
    assert execute_deferred(shop_gate.gate, current, newer).result == done.result
    assert asyncio.run(aexecute_deferred(shop_gate.gate, current, newer)).result == done.result
    assert execute_deferred(shop_gate.gate, refund["operation_id"]).result == done.result
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [(e.approval_id, e.status) for e in shop_gate.store.executions()] == [
        (refund["operation_id"], "succeeded")
    ]
    assert _status(shop_gate, refund["operation_id"]) == "executed"
    with pytest.raises(DecisionMismatch):
        execute_deferred(shop_gate.gate, refund, newer)  # the stale payload stays refused
    assert shop_gate.gate.audit().clean
