"""The snapshot's map from paused call to approval decides nothing until it verifies.

The map (`context["effectgate"]["approvals"]`) is JSON anyone holding a `RunState` snapshot can
edit. Every decision through it (`approve_as`, `approve`, `reject`, the SDK's own
`state.approve` / `state.reject`) first checks the record's seal (this call, this run), the SDK
item's tool and arguments, and, from the gate's store, that the approval is this run's. Effects
are counted at the receiver; each approval's final status and decisions are read from the store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool

from effectgate import CallContext, EffectGate, Grant, Keyring, Pending, destructive, money
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_openai_agents import (
    DecisionMismatch,
    TamperedState,
    approval_of,
    approve,
    approve_as,
    gate_agent,
    gate_of,
    pending_approvals,
    reject,
)
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant

from ._harness import OpenAIAgentsHarness, context
from .conftest import MakeOpenAIHarness

BOB = CallContext(session_id="s-bob", origin_message_id="m9", user_id="u2", agent_id="support")
BOBS_REFUND = {"order_id": "2001", "amount": 50000, "currency": "GBP"}


def _records(snapshot: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads(snapshot)
    return data, data["context"]["context"]["effectgate"]["approvals"]


def _decisions(gate: EffectGate, approval_id: str) -> list[tuple[str, str]]:
    with gate.store.transaction() as conn:
        return [(d.approver_id, d.decision) for d in gate.store.decisions(conn, approval_id)]


def _status(gate: EffectGate, approval_id: str) -> str:
    row = gate.store.get_approval(approval_id)
    assert row is not None
    return row.status


def _restore(h: OpenAIAgentsHarness, snapshot: str) -> RunState[Any, Any]:
    return asyncio.run(RunState.from_string(h.agent, snapshot))


def test_a_record_pointed_at_another_sessions_approval_decides_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The review's attack: s-ada's snapshot has its record for c1 edited to s-bob's pending refund
    (id, version and args hash). `approve_as` as fiona, `reject` and `approve` with a grant for
    s-bob's approval are each TamperedState: s-bob's approval stays pending with no decision (his
    own reviewer then decides it), nothing is attached, and no refund of 2001 ever runs."""
    gate = shop_gate.gate
    h = oa_harness(Script([call("refund_order", id="c1", **REFUND), say("Done.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    foreign = gate.call("refund_order", BOBS_REFUND, BOB)
    assert isinstance(foreign, Pending)
    assert h.snapshot is not None
    data, records = _records(h.snapshot)
    records["c1"].update(
        approval_id=foreign.approval_id, version=foreign.version, args_hash=foreign.card.args_hash
    )
    state = _restore(h, json.dumps(data))
    [waiting] = pending_approvals(state)
    assert (waiting.verified, waiting.approval_id, waiting.version, waiting.args_hash) == (
        False,
        None,
        None,
        None,
    )
    # what the edited map claims, as a caller holding an entry built from it would pass it
    claimed = replace(waiting, approval_id=foreign.approval_id, version=foreign.version, verified=True)

    for entry in (waiting, claimed):
        with pytest.raises(TamperedState):
            approve_as(gate, state, entry, FINANCE)
        with pytest.raises(TamperedState):
            reject(gate, state, entry, approver=FINANCE, reason="no")
    assert _status(gate, foreign.approval_id) == "pending"
    assert _decisions(gate, foreign.approval_id) == []
    assert _status(gate, paused.approval_id) == "pending"

    bobs = gate.approve(foreign.approval_id, version=foreign.version, approver=FINANCE)  # his reviewer
    assert isinstance(bobs, Grant)
    for entry in (waiting, claimed):
        with pytest.raises(TamperedState):
            approve(state, entry, bobs)
    assert state._context is not None
    assert state._context.context["effectgate"]["grants"] == {}
    assert state._context.get_approval_status("refund_order", "c1") is None
    Runner.run_sync(h.agent, state)  # pauses again: nothing was approved in it
    assert shop_gate.shop.receiver.count("refund") == 0
    row = gate.store.get_approval(foreign.approval_id)
    assert row is not None
    assert (row.status, row.token_used_at) == ("approved", None)
    assert shop_gate.store.executions() == []


class Shop:
    """A support agent whose refund (money) and account deletion (destructive) both need finance."""

    def __init__(self, db: str, script: list[Any]) -> None:
        self.receiver = receiver = EffectRecorder()

        @function_tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund part of an order, in pence."""
            receiver.record("refund", order_id=order_id, amount=amount)
            return "refunded"

        @function_tool
        def delete_account(user: str) -> str:
            """Delete a customer account."""
            receiver.record("delete", user=user)
            return "deleted"

        self.model = ScriptedModel(Script(script))
        self.agent = gate_agent(
            Agent(name="support", model=self.model, tools=[refund_order, delete_account]),
            effects={
                "refund_order": money("finance", subject="order_id"),
                "delete_account": destructive("finance", subject="user"),
            },
            native_approver=FINANCE,
            db=db,
            keyring=Keyring.generate(),
        )
        self.gate = gate_of(self.agent)

    def swapped(self) -> tuple[RunState[Any, Any], dict[str, str]]:
        """The refund (c1) and the deletion (c2) paused in one turn, the snapshot's two records
        swapped (their approval ids, versions and args hashes; each keeps its tool, which is how
        the SDK files its decisions); and each call's real approval id."""
        result = Runner.run_sync(self.agent, "Refund 1042 and delete my account", context=context("m1"))
        real = {p.call_id: p.approval_id or "" for p in pending_approvals(result)}
        assert sorted(real) == ["c1", "c2"]
        data, records = _records(result.to_state().to_string())
        for key in ("approval_id", "version", "args_hash"):
            records["c1"][key], records["c2"][key] = records["c2"][key], records["c1"][key]
        return asyncio.run(RunState.from_string(self.agent, json.dumps(data))), real


@pytest.fixture
def swap_shop(tmp_path: Path) -> Iterator[Shop]:
    two = step(
        call("refund_order", id="c1", order_id="1042", amount=500),
        call("delete_account", id="c2", user="u1"),
    )
    made = Shop(f"sqlite:///{tmp_path / 'eg.db'}", [two, say("Done.")])
    yield made
    made.gate.close()


def test_two_swapped_records_of_one_run_do_not_cross_native_decisions(swap_shop: Shop) -> None:
    """The application approves the refund and rejects the deletion with the SDK's own API on a
    snapshot whose two records were swapped: the resume ends with TamperedState before anything
    is settled, so the deletion gets no first approver and the refund is not denied (both
    pending, no decisions), and neither runs."""
    state, real = swap_shop.swapped()
    items = {i.call_id: i for i in state.get_interruptions()}
    state.approve(items["c1"])
    state.reject(items["c2"], rejection_message="Keep my account.")
    with pytest.raises(TamperedState):
        Runner.run_sync(swap_shop.agent, state)
    for approval_id in real.values():
        assert _status(swap_shop.gate, approval_id) == "pending"
        assert _decisions(swap_shop.gate, approval_id) == []
    assert swap_shop.receiver.effects == []


def test_two_swapped_records_of_one_run_do_not_cross_approve_as(swap_shop: Shop) -> None:
    """`approve_as` on the refund of the swapped snapshot (whose record now names the deletion's
    approval) is TamperedState: the deletion's approval gets no first approver."""
    state, real = swap_shop.swapped()
    refund = next(p for p in pending_approvals(state) if p.call_id == "c1")
    assert (refund.verified, refund.approval_id) == (False, None)
    claimed = replace(refund, approval_id=real["c2"], version=1)  # what the swapped map claims
    for entry in (refund, claimed):
        with pytest.raises(TamperedState):
            approve_as(swap_shop.gate, state, entry, FINANCE)
    for approval_id in real.values():
        assert _status(swap_shop.gate, approval_id) == "pending"
        assert _decisions(swap_shop.gate, approval_id) == []
    assert swap_shop.receiver.effects == []


def test_a_later_message_that_found_the_same_approval_may_decide_it(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """s-ada asks again (m4) while the refund of m3 waits: the second run pauses on the same
    approval, whose stored origin is m3. The gate recorded m4 registering it, so `approve_as` on
    the m4 snapshot is this run's decision: the refund runs once."""
    first = oa_harness(Script([call("refund_order", id="c1", **REFUND)]))
    [paused] = first.send("Please refund order 1042", message_id="m3").paused
    again = oa_harness(Script([call("refund_order", id="c7", **REFUND), say("Refunded.")]))
    [waiting] = again.send("Any news on my refund?", message_id="m4").paused
    assert waiting.approval_id == paused.approval_id
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.origin_message_id == "m3"
    state = again.restore()
    [item] = pending_approvals(state)
    approve_as(shop_gate.gate, state, item, FINANCE)
    again.resume(state)
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert _status(shop_gate.gate, paused.approval_id) == "executed"
    again.script.assert_complete()


def test_a_grant_is_attached_only_to_the_call_it_was_registered_for(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """The honest path still attaches: `approve` with the call's own grant approves the SDK item
    and the refund runs once."""
    h = oa_harness(Script([call("refund_order", id="c1", **REFUND), say("Done.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    state = h.restore()
    [waiting] = pending_approvals(state)
    approve(state, waiting, grant(shop_gate.gate, paused))
    h.resume(state)
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1


def _shown(state: RunState[Any, Any], gate: EffectGate | None = None) -> dict[str, tuple[Any, ...]]:
    """What a reviewer UI would show per call: verified, approval id, version, args hash, tool."""
    return {
        p.call_id: (p.verified, p.approval_id, p.version, p.args_hash, p.tool)
        for p in pending_approvals(state, gate=gate)
    }


def _stored(gate: EffectGate, approval_id: str) -> tuple[Any, ...]:
    row = gate.store.get_approval(approval_id)
    assert row is not None
    return (True, row.id, row.version, row.args_hash, row.tool)


def test_pending_approvals_shows_an_untouched_snapshot_verified(swap_shop: Shop) -> None:
    """Both calls of an unedited snapshot are listed verified, each with its own approval's id,
    version, args hash and tool as the gate's store has them (gate found from the agent, or
    given); `approval_of` agrees."""
    result = Runner.run_sync(swap_shop.agent, "Refund 1042 and delete my account", context=context("m1"))
    state = asyncio.run(RunState.from_string(swap_shop.agent, result.to_state().to_string()))
    rows = {
        r.tool: r.id
        for r in (swap_shop.gate.store.get_approval(p.approval_id or "") for p in pending_approvals(result))
        if r is not None
    }
    expected = {
        "c1": _stored(swap_shop.gate, rows["refund_order"]),
        "c2": _stored(swap_shop.gate, rows["delete_account"]),
    }
    assert _shown(state) == expected
    assert _shown(state, swap_shop.gate) == expected
    assert all(p.problem is None for p in pending_approvals(state))
    item = next(i for i in state.get_interruptions() if i.call_id == "c2")
    assert approval_of(state, item).approval_id == rows["delete_account"]


def test_pending_approvals_does_not_show_swapped_records(swap_shop: Shop) -> None:
    """The two records of one run swapped in the snapshot: neither call is shown with the other's
    approval (nor with any approval id, version or args hash); each is flagged unverified, with
    the reason, under the SDK item's own tool."""
    state, real = swap_shop.swapped()
    shown = {p.call_id: p for p in pending_approvals(state)}
    assert {k: (p.verified, p.approval_id, p.version, p.args_hash, p.tool) for k, p in shown.items()} == {
        "c1": (False, None, None, None, "refund_order"),
        "c2": (False, None, None, None, "delete_account"),
    }
    assert all(p.problem for p in shown.values())
    item = next(i for i in state.get_interruptions() if i.call_id == "c1")
    assert approval_of(state, item).approval_id is None
    for approval_id in real.values():
        assert _status(swap_shop.gate, approval_id) == "pending"


def test_pending_approvals_does_not_show_an_edited_args_hash(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """A record whose args hash was edited is listed unverified, without the edited hash (or the
    approval id it sits beside); the untouched snapshot lists the call verified."""
    h = oa_harness(Script([call("refund_order", id="c1", **REFUND), say("Done.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    assert h.snapshot is not None
    assert _shown(h.restore()) == {"c1": _stored(shop_gate.gate, paused.approval_id)}
    data, records = _records(h.snapshot)
    records["c1"]["args_hash"] = "0" * 64
    assert _shown(_restore(h, json.dumps(data))) == {"c1": (False, None, None, None, "refund_order")}


def test_pending_approvals_checks_with_the_gate_it_is_given(swap_shop: Shop, tmp_path: Path) -> None:
    """Listed with another gate (another keyring, or the same keyring over a store without these
    approvals), an untouched snapshot's records are not verified and are shown without their
    details; an entry listed that way decides nothing
    (`DecisionMismatch`: list it again with the right gate), and the approval stays pending."""
    other = Shop(f"sqlite:///{tmp_path / 'other.db'}", [])
    same_key = EffectGate(swap_shop.gate.table, other.gate.store, keyring=swap_shop.gate.keyring)
    try:
        result = Runner.run_sync(swap_shop.agent, "Refund 1042 and delete my account", context=context("m1"))
        state = asyncio.run(RunState.from_string(swap_shop.agent, result.to_state().to_string()))
        for wrong in (other.gate, same_key):  # another keyring; the keyring but another store
            listed = {p.call_id: p for p in pending_approvals(state, gate=wrong)}
            assert {k: (p.verified, p.approval_id, p.version, p.args_hash) for k, p in listed.items()} == {
                "c1": (False, None, None, None),
                "c2": (False, None, None, None),
            }
        with pytest.raises(DecisionMismatch):
            approve_as(swap_shop.gate, state, listed["c1"], FINANCE)
        [refund] = [p for p in pending_approvals(state) if p.call_id == "c1"]
        assert refund.verified
        assert _status(swap_shop.gate, refund.approval_id or "") == "pending"
        assert _decisions(swap_shop.gate, refund.approval_id or "") == []
    finally:
        other.gate.close()
