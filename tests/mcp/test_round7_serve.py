"""Round 7 of the review of `effectgate mcp serve`, on SQLite and PostgreSQL: a read whose result
holds a value with no JSON form, and an earlier call of a subject whose approval was amended by
a later call with other arguments and then ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport

from effectgate import EffectGate, Executed, Grant, Keyring, Pending
from effectgate.effects import Effect
from effectgate.examples.shop import Shop
from effectgate.mcp._common import Grants, Identity, context_for, gated_call
from effectgate.mcp._serve import gated_server
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec
from effectgate.testing import FakeClock

from ._serving import FINANCE, REFUND, outcome, run
from .test_serve import ADA, client, gate, shop

__all__ = ["gate", "shop"]  # the fixtures of test_serve.py


@asynccontextmanager
async def over_the_wire(gate: EffectGate, identity: Identity) -> AsyncIterator[ClientSession]:
    """A client of `gated_server(gate)` whose server answers a handler's failure as the SDK does
    in production (a JSON-RPC error, not an exception raised in the test)."""
    server = gated_server(gate, identity=identity)
    async with (
        InMemoryTransport(server, raise_exceptions=False) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


class Stamp:
    """A value a tool returns that has no JSON form of its own (it prints as text)."""

    def __str__(self) -> str:
        return "stamp-7"


def test_a_read_whose_result_holds_a_value_without_a_json_form_answers_it(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read returned a JSON object holding an application object. The gate answers such a
    result as text (`Executed.for_model` prints what has no JSON form), but the server also handed
    the raw object to the SDK as the result's structured content, which the SDK could not
    serialise: every call of the tool ended in an "Internal server error" instead of its result,
    although the tool ran. The result is answered, the same in its text and structured form."""
    runs: list[str] = []

    def inspect(doc: str) -> dict[str, Any]:
        runs.append(doc)
        return {"doc": doc, "stamp": Stamp()}

    table = EffectTable([ToolSpec(name="inspect", effect=Effect.READ, fn=inspect)])
    table.allow_all("a7")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> types.CallToolResult:
        async with over_the_wire(g, Identity(user_id="u1", session_id="s7", agent_id="a7")) as session:
            return await session.call_tool("inspect", {"doc": "d1"})

    try:
        result = run(scenario)
    finally:
        g.close()
    assert runs == ["d1"]
    assert result.is_error is False
    assert outcome(result)["status"] == "executed"
    assert result.structured_content == {"doc": "d1", "stamp": "stamp-7"}


@pytest.mark.xfail(
    strict=True,
    reason="design decision: the origin of an MCP call is its arguments, but the core hands a "
    "call whose origin keyed an approval the result of whatever version of it ran (right for a "
    "reviewer's edit, wrong for another call of the model's that amended it)",
)
def test_a_call_whose_approval_ran_other_arguments_is_not_told_it_ran(
    gate: EffectGate, shop: Shop, store: SQLStore
) -> None:
    """The model asked for a refund of 120.00 (version 1), then for 50.00 of the same order: the
    second call amended the waiting approval (version 2), which finance approved and which ran.
    The model re-issued its first call (120.00): the server answered it "executed" (a replay, the
    50.00 refund's result), so a client reading the outcome believes 120.00 was refunded. Only
    50.00 was; the 120.00 call never ran and was never approved."""
    grants = Grants()
    smaller = {**REFUND, "amount": 5000}

    async def scenario() -> types.CallToolResult:
        async with client(gate, grants=grants) as session:
            await session.call_tool("refund_order", REFUND)
            amended = outcome(await session.call_tool("refund_order", smaller))
            assert amended["version"] == 2
            grant = gate.approve(amended["approval_id"], version=2, approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            ran = outcome(await session.call_tool("refund_order", smaller))
            assert ran["status"] == "executed"
            return await session.call_tool("refund_order", REFUND)

    first_again = run(scenario)
    assert shop.receiver.count("refund") == 1
    [approval] = store.approvals()
    assert (approval.version, approval.status) == (2, "executed")
    assert outcome(first_again)["status"] != "executed"


def test_a_reissue_cancelled_before_its_grant_was_claimed_keeps_the_grant(
    gate: EffectGate, shop: Shop, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client re-issued an approved refund and cancelled it (its request timed out, or it
    reconnected) while the server was presenting the grant, before the gate claimed it: nothing
    ran and the token was still good. The server had taken the grant out of `Grants` and kept it
    only for an `Exception`, not for the task's cancellation: every later re-issue answered "its
    grant has not reached this server" until the grant lapsed. The grant is kept; the next
    re-issue runs once."""
    grants = Grants()
    ctx = context_for(ADA, "refund_order", REFUND, spec=gate.table.get("refund_order"))
    real = gate.aexecute
    entered, cancelled = asyncio.Event(), [0]

    async def stalled(token: str, args: Any = None) -> Any:
        if not cancelled[0]:
            cancelled[0] = 1
            entered.set()
            await asyncio.Event().wait()  # the claim waits for a store connection: cancelled here
        return await real(token, args)

    async def scenario() -> Any:
        waiting = await gated_call(gate, "refund_order", REFUND, ctx, grants=grants)
        assert isinstance(waiting, Pending)
        grant = gate.approve(waiting.approval_id, version=waiting.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        grants.deliver(grant)
        monkeypatch.setattr(gate, "aexecute", stalled)
        first = asyncio.create_task(gated_call(gate, "refund_order", REFUND, ctx, grants=grants))
        await entered.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert shop.receiver.count("refund") == 0
        return await gated_call(gate, "refund_order", REFUND, ctx, grants=grants)

    again = run(scenario)
    assert isinstance(again, Executed)
    assert shop.receiver.count("refund") == 1
    assert [e.status for e in store.executions(tool="refund_order")] == ["succeeded"]
