"""Amended versions and the adapters: who proposed a version (a44ee2b) against who may run it.

OpenAI Agents deferred mode: u1's run defers a refund; u2, later in the same session, amends it
(version 2, proposed by u2). Once a reviewer approves version 2, `execute_deferred` accepts either
user's context, with its message (`check_owner` finds the identity among the approval's events)
or without it: naming only the session and user must not refuse u1's run where naming more is
accepted. A context of a user who never took part is still TamperedState. Refunds are counted at
the tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Runner

from effectgate import CallContext, Grant, Pending
from effectgate.testing import call
from effectgate_openai_agents import TamperedState, deferred_operations, execute_deferred
from tests.conformance.adapters import FINANCE

from .openai_agents._harness import context
from .openai_agents.test_deferred_spoof import Desk

U2 = CallContext(session_id="s-ada", origin_message_id="m2", user_id="u2", agent_id="support")


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    script = [call("refund_order", id="c1", order_id="1042", amount=500)]
    made = Desk(f"sqlite:///{tmp_path / 'eg.db'}", script)
    yield made
    made.gate.close()


def _amended_and_granted(desk: Desk) -> tuple[str, Grant]:
    result = Runner.run_sync(desk.agent, "Refund 5.00 on 1042", context=context("m1"))
    [op] = deferred_operations(result)
    amended = desk.gate.call("refund_order", {"order_id": "1042", "amount": 400}, U2)
    assert isinstance(amended, Pending)
    assert amended.approval_id == op["operation_id"]
    assert amended.version == 2
    grant = desk.gate.approve(amended.approval_id, version=2, approver=FINANCE)
    assert isinstance(grant, Grant)
    return str(op["operation_id"]), grant


@pytest.mark.parametrize(
    "named",
    [
        {"session_id": "s-ada", "user_id": "u1"},
        {"session_id": "s-ada", "user_id": "u2"},
        context("m1"),
        {"session_id": "s-ada", "origin_message_id": "m2", "user_id": "u2"},
    ],
    ids=["u1-session-user", "u2-session-user", "u1-full", "u2-full"],
)
def test_an_operation_amended_by_another_user_runs_once_for_either_users_context(
    desk: Desk, named: dict[str, Any]
) -> None:
    operation_id, grant = _amended_and_granted(desk)
    assert execute_deferred(desk.gate, operation_id, grant, context=named).result == "refunded 400"
    assert desk.receiver.count("refund", order_id="1042", amount=400) == 1
    assert desk.receiver.count("refund") == 1


def test_a_user_who_never_took_part_is_still_refused(desk: Desk) -> None:
    operation_id, grant = _amended_and_granted(desk)
    with pytest.raises(TamperedState):
        execute_deferred(desk.gate, operation_id, grant, context={"session_id": "s-ada", "user_id": "u3"})
    assert desk.receiver.count("refund") == 0
