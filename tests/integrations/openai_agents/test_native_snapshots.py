"""The SDK's own approval in a `RunState` snapshot is unsigned, so it is never a decision.

Only a `state.approve(item)` made in this process, on a state effectgate has seen (a run's, or a
restored one once it has loaded), is settled as the application's `native_approver`. An approval
edited into a snapshot, or saved in it and resumed again, is dropped and the call stays paused;
a rejection saved in it is recorded as the system identity, not as the current request's approver.
Each test runs on SQLite and PostgreSQL (`store_url`), effects counted at the receiver.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Runner, RunState

from effectgate import Approver
from effectgate.testing import call, say
from effectgate_openai_agents import STATE_KEY, approve_as, pending_approvals

from ._harness import context, tool_results
from .test_native_approvals import FINANCE, OTHER_FINANCE, REFUND, Shop

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def _approved(decision: bool | list[str]) -> Edit:
    """The edit: the SDK's own approval record for the refund, as its JSON has it."""

    def edit(data: dict[str, Any]) -> None:
        data["context"]["approvals"] = {"refund_order": {"approved": decision, "rejected": []}}

    return edit


def _record_removed(data: dict[str, Any]) -> None:
    _approved(["c1"])(data)
    del data["context"]["context"][STATE_KEY]["approvals"]["c1"]  # effectgate's record of the call


EDITS: dict[str, Edit] = {
    "approved-call": _approved(["c1"]),
    "always-approve": _approved(True),
    "approved-call-and-record-removed": _record_removed,
}


def _edited(snapshot: str, edit: Edit) -> str:
    data = json.loads(snapshot)
    edit(data)
    return json.dumps(data)


def _restore(s: Shop, snapshot: str) -> RunState[Any, Any]:
    return asyncio.run(RunState.from_string(s.agent, snapshot))


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_an_approval_edited_into_a_snapshot_approves_nothing(shop: Callable[..., Shop], edit: str) -> None:
    """A snapshot whose JSON marks the paused refund approved in the SDK (per call, always, or with
    effectgate's record of the call removed too): resumed with `native_approver=fiona`, nothing
    runs, nobody is recorded as approving, and the refund is still paused and pending."""
    s = shop([REFUND], native_approver=FINANCE)
    result = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    row = s.row(result)
    snapshot = _edited(result.to_state().to_string(), EDITS[edit])
    resumed = s.resume(_restore(s, snapshot))
    assert [i.call_id for i in resumed.interruptions] == ["c1"]
    assert s.receiver.effects == []
    assert s.decisions(row.id) == []
    pending = s.gate.store.get_approval(row.id)
    assert pending is not None
    assert pending.status == "pending"


def test_a_replayed_snapshot_adds_no_second_approver(shop: Callable[..., Shop]) -> None:
    """A destructive call needs two distinct approvers. fiona's `state.approve`, saved in the
    snapshot before it was settled, then that snapshot resumed in fiona's request and again in
    frank's: nothing runs and no one is recorded (one saved flag is not two decisions, and not
    frank's). Decided in this process, fiona then frank, it runs once with both on record."""
    deciding = [FINANCE]
    s = shop(
        [call("delete_account", id="c1", user="u1"), say("Deleted.")],
        native_approver=lambda run_context: deciding[0],  # who makes the current request
    )
    paused = Runner.run_sync(s.agent, "Delete my account", context=context("m1"))
    row = s.row(paused)
    state = paused.to_state()
    state.approve(state.get_interruptions()[0])  # fiona's decision in the SDK
    stored = state.to_string()
    for who in (FINANCE, OTHER_FINANCE):
        deciding[0] = who
        replayed = s.resume(_restore(s, stored))
        assert [i.call_id for i in replayed.interruptions] == ["c1"]
    assert s.receiver.effects == []
    assert s.decisions(row.id) == []

    latest = replayed.to_state()
    for who in (FINANCE, OTHER_FINANCE):
        deciding[0] = who
        latest.approve(latest.get_interruptions()[0])
        result = s.resume(latest)
        latest = result.to_state()
    assert result.interruptions == []
    assert s.receiver.count("delete", user="u1") == 1
    assert [d[:3] for d in s.decisions(row.id)] == [
        ("fiona", "finance", "approve"),
        ("frank", "finance", "approve"),
    ]
    s.model.assert_complete()


def test_an_always_approve_saved_in_a_snapshot_approves_nothing(shop: Callable[..., Shop]) -> None:
    """`state.approve(item, always_approve=True)` saved in the snapshot before it was settled
    (the SDK carries it as the agent's own decision): resumed, nothing runs and nobody is
    recorded as approving."""
    s = shop([REFUND], native_approver=FINANCE)
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    row = s.row(paused)
    state = paused.to_state()
    state.approve(state.get_interruptions()[0], always_approve=True)
    resumed = s.resume(_restore(s, state.to_string()))
    assert [i.call_id for i in resumed.interruptions] == ["c1"]
    assert s.receiver.effects == []
    assert s.decisions(row.id) == []


@pytest.mark.parametrize("restored", [False, True], ids=["in-process", "after-from_string"])
def test_a_native_approve_made_in_this_process_runs_once_as_the_native_approver(
    shop: Callable[..., Shop], restored: bool
) -> None:
    """`state.approve(item)` on the run's own state, or on a state just loaded with
    `RunState.from_string` (the SDK's idiom), then resume: the refund runs once, approved in
    effectgate as the configured approver."""
    s = shop([REFUND, say("Refunded.")], native_approver=FINANCE)
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    row = s.row(paused)
    state = _restore(s, paused.to_state().to_string()) if restored else paused.to_state()
    state.approve(state.get_interruptions()[0])
    result = s.resume(state)
    assert [o.content for o in tool_results(result)] == ["refunded 500 on 1042"]
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    assert [d[:3] for d in s.decisions(row.id)] == [("fiona", "finance", "approve")]
    s.model.assert_complete()


def test_a_rejection_saved_in_a_snapshot_is_recorded_as_the_system_not_the_current_approver(
    shop: Callable[..., Shop],
) -> None:
    """A `state.reject` saved in the snapshot closes the approval when the snapshot is resumed,
    recorded as `sdk-reject`: the configured approver of the resuming request did not make it."""
    s = shop([REFUND, say("Not refunded.")], native_approver=Approver("fiona", "finance"))
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    row = s.row(paused)
    state = paused.to_state()
    state.reject(state.get_interruptions()[0], rejection_message="No.")
    s.resume(_restore(s, state.to_string()))
    assert s.decisions(row.id) == [("sdk-reject", "finance", "deny", "No.")]
    assert s.receiver.effects == []


def test_a_grant_attached_before_the_snapshot_was_saved_runs_once(shop: Callable[..., Shop]) -> None:
    """`approve_as` attaches a signed grant, which the snapshot carries: the SDK approval beside
    it is kept when the snapshot loads, the refund runs once, and resuming the snapshot again
    gets the stored result."""
    s = shop([REFUND, say("Refunded."), say("Already refunded.")])
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    state = paused.to_state()
    [item] = pending_approvals(state)
    approve_as(s.gate, state, item, FINANCE)
    stored = state.to_string()
    for _ in range(2):
        result = s.resume(_restore(s, stored))
        assert result.interruptions == []
    assert s.receiver.count("refund", order_id="1042", amount=500) == 1
    assert [d[:3] for d in s.decisions(item.approval_id or "")] == [("fiona", "finance", "approve")]
    s.model.assert_complete()
