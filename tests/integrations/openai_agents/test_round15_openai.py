"""Review round 15: the OpenAI Agents adapter's snapshot restore paths. Each test reproduced a
defect before its fix; scripted models drive the SDK's real Runner and effects are counted at the
receiver. Every test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Runner, RunState
from agents._tool_invocation import tool_invocation_identity_and_scope

from effectgate.testing import call, say
from effectgate_openai_agents import STATE_KEY, TamperedState, pending_approvals

from ._harness import context
from .test_round14_openai import REFUND, Shop, _drop_interruption


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def _edit_call(snapshot: dict[str, Any], *, fingerprint: str) -> dict[str, Any]:
    """The paused refund's arguments edited from 500 to 99999 in every copy of the call the
    snapshot holds (the model response, the generated items, the processed response, effectgate's
    turn entry), the SDK's own fingerprint of the call either recomputed for the edited item or
    dropped, and its paused item removed (so the resumed SDK asks `needs_approval` again), as
    anyone holding the snapshot can do."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node.replace('"amount":500', '"amount":99999') if isinstance(node, str) else node

    data: dict[str, Any] = walk(snapshot)
    invocations = data["context"].get("tool_invocations") or {}
    if fingerprint == "dropped":
        data["context"].pop("tool_invocations", None)
    elif "c1" in invocations:
        [item] = data["current_step"]["data"]["interruptions"]
        identity = tool_invocation_identity_and_scope(item["raw_item"], tool_name="refund_order")
        assert identity is not None
        invocations["c1"]["fingerprint"] = identity[3]
    _drop_interruption(data, "c1")
    return data


@pytest.mark.parametrize("fingerprint", ["recomputed", "dropped"])
@pytest.mark.parametrize("load", ["from_json", "from_string"])
def test_a_paused_calls_arguments_edited_in_the_snapshot_never_amend_its_approval(
    shop: Callable[..., Shop], fingerprint: str, load: str
) -> None:
    """A refund of 500 pauses (Pending, version 1); its snapshot (`to_json`) is edited so the
    paused call says 99999 (`_edit_call`), and restored and resumed with the same gate. Before the fix the
    resumed call reached `needs_approval` again and amended the waiting approval to version 2 with
    the edited arguments: a refund no model proposed, waiting in the reviewer's inbox. The edit is
    refused (`TamperedState`): the approval keeps version 1 and the model's 500, nothing ran."""
    s = shop([REFUND, say("Waiting."), say("Still waiting.")])
    paused = Runner.run_sync(s.agent, "Refund 1042", context=context("m1"))
    [listed] = pending_approvals(paused)
    edited = _edit_call(paused.to_state().to_json(), fingerprint=fingerprint)

    if load == "from_json":
        state = asyncio.run(RunState.from_json(s.agent, edited))
    else:
        state = s.restore(json.dumps(edited))
    with pytest.raises(TamperedState):
        Runner.run_sync(s.agent, state)

    [row] = s.gate.store.approvals()
    assert row.id == listed.approval_id
    assert (row.status, row.version, json.loads(row.args_json)) == (
        "pending",
        1,
        {"order_id": "1042", "amount": 500},
    )
    assert s.receiver.effects == []


def test_a_model_reusing_a_paused_calls_id_in_a_new_run_of_the_message_still_amends(
    shop: Callable[..., Shop],
) -> None:
    """What the fix above must not refuse: the application runs the same message again with the
    same context dict (its paused record for c1 still in it), and the model's new response reuses
    the call id c1 for a refund of 300. That is a call the model proposed in this process (the
    turn `gate_agent` recorded names it), so it amends the waiting approval in place (version 2),
    as any new proposal for the same subject does; nothing runs."""
    s = shop([REFUND, call("refund_order", id="c1", order_id="1042", amount=300), say("Waiting.")])
    ctx = context("m1")
    Runner.run_sync(s.agent, "Refund 1042", context=ctx)
    again = Runner.run_sync(s.agent, "Refund 1042", context=ctx)

    assert [p.version for p in pending_approvals(again)] == [2]
    [row] = s.gate.store.approvals()
    assert (row.status, row.version, json.loads(row.args_json)) == (
        "pending",
        2,
        {"order_id": "1042", "amount": 300},
    )
    assert s.receiver.effects == []


@pytest.mark.xfail(
    strict=True,
    reason=(
        "design decision: with effectgate's sealed record of the paused call removed from the "
        "snapshot as well (context['effectgate']['approvals'] emptied), nothing in the run state "
        "tells the re-asked call from a new one, so it registers and amends the approval to the "
        "edited arguments. Refusing it needs a store read per gated call without a record (the "
        "approval's events name the tool_call_id that registered it) or a sealed list of the "
        "run's paused call ids beside the identity: larger than this round's fix"
    ),
)
def test_a_paused_call_edited_with_its_record_removed_never_amends_its_approval(
    shop: Callable[..., Shop],
) -> None:
    """As above (fingerprint recomputed, paused item dropped), and effectgate's own record of the
    paused call removed too; the application inspects the restored state (`pending_approvals`,
    so its identity must verify) and resumes it. The approval should keep version 1 and the
    model's 500; today it is amended to the edited 99999."""
    s = shop([REFUND, say("Waiting."), say("Still waiting.")])
    paused = Runner.run_sync(s.agent, "Refund 1042", context=context("m1"))
    edited = _edit_call(paused.to_state().to_json(), fingerprint="recomputed")
    edited["context"]["context"][STATE_KEY]["approvals"] = {}
    state = asyncio.run(RunState.from_json(s.agent, edited))
    pending_approvals(state)

    with contextlib.suppress(TamperedState):
        Runner.run_sync(s.agent, state)

    [row] = s.gate.store.approvals()
    assert (row.version, json.loads(row.args_json)) == (1, {"order_id": "1042", "amount": 500})
    assert s.receiver.effects == []
