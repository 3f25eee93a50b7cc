"""`effectgate mcp serve`: the shop's effect table as an MCP server, driven by the SDK's own client.

In process, over memory streams, on SQLite and PostgreSQL (the command: test_serve_command.py): the
hints come from the table, reads run, gated calls answer NOT EXECUTED and run only after an
approval, once, and the gate enforces whatever the client does with the hints or the arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport

from effectgate import Approver, EffectGate, Grant, Keyring
from effectgate.effects import Effect
from effectgate.examples.shop import SUMMARY_AGENT, SUPPORT_AGENT, Shop, app
from effectgate.mcp._common import Grants, Identity, annotations_for, describe
from effectgate.mcp._serve import gated_server
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import FINANCE, REFUND, outcome, run, text

ADA = Identity(user_id="u1", session_id="s-mcp", agent_id=SUPPORT_AGENT)


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, shop: Shop) -> Iterator[EffectGate]:
    g = app(store, keyring=Keyring.generate(), clock=clock, shop=shop)
    yield g
    g.close()


@asynccontextmanager
async def client(gate: EffectGate, identity: Identity = ADA, **options: Any) -> AsyncIterator[ClientSession]:
    """A real MCP client session against `gated_server(gate, ...)` over memory streams."""
    server = gated_server(gate, identity=identity, **options)
    async with (
        InMemoryTransport(server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_tools_are_the_agents_rows_with_hints_from_the_table(gate: EffectGate) -> None:
    """The listed tools are the agent's allowlist; schema, hints and description come from the row."""

    async def scenario() -> tuple[list[types.Tool], list[types.Tool]]:
        async with client(gate) as support:
            everything = (await support.list_tools()).tools
        summarizer = Identity(user_id="u1", session_id="s-sum", agent_id=SUMMARY_AGENT)
        async with client(gate, summarizer) as summary:
            fewer = (await summary.list_tools()).tools
        return everything, fewer

    everything, fewer = run(scenario)
    assert [t.name for t in everything] == [s.name for s in gate.table]
    assert {t.name for t in fewer} == set(gate.table.allowlist(SUMMARY_AGENT))
    assert "refund_order" not in {t.name for t in fewer}
    hints = {t.name: t.annotations for t in everything}
    for tool in everything:
        spec = gate.table[tool.name]
        assert tool.input_schema == dict(spec.schema or {})
        assert tool.annotations == annotations_for(spec)
        assert tool.description == describe(spec, policy=gate.policy)
    assert hints["get_order"] is not None
    assert hints["get_order"].read_only_hint is True
    assert hints["update_ticket_tags"] is not None
    assert hints["update_ticket_tags"].read_only_hint is False
    assert hints["update_ticket_tags"].idempotent_hint is True
    refund = hints["refund_order"]
    assert refund is not None
    assert (refund.read_only_hint, refund.destructive_hint) == (False, False)
    assert refund.open_world_hint is True
    delete = hints["delete_customer_data"]
    assert delete is not None
    assert delete.destructive_hint is True
    assert delete.read_only_hint is False
    by_name = {t.name: t.description or "" for t in everything}
    assert by_name["refund_order"].startswith("[money: needs approval by finance")
    assert by_name["delete_customer_data"].startswith("[destructive: needs 2 distinct approvers")
    assert by_name["get_order"].startswith("[read] ")
    assert {gate.table[t.name].effect for t in everything} == set(Effect)


def test_a_read_runs_and_answers_structured(gate: EffectGate) -> None:
    """A read runs at once; a JSON object result is the structured content too."""

    async def scenario() -> types.CallToolResult:
        async with client(gate) as session:
            return await session.call_tool("get_order", {"order_id": "1042"})

    result = run(scenario)
    assert result.is_error is False
    assert result.structured_content == {
        "order_id": "1042",
        "status": "shipped",
        "total": 12000,
        "currency": "GBP",
    }
    assert outcome(result)["status"] == "executed"


def test_money_waits_and_an_approved_reissue_runs_exactly_once(
    gate: EffectGate, shop: Shop, store: SQLStore
) -> None:
    """A refund answers NOT EXECUTED; after approval the client's same call runs it once, and a
    third call gets the stored result. No result carries the grant token."""
    grants = Grants()
    tokens: list[str] = []

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants, inbox_url="http://127.0.0.1:8765/") as session:
            waiting = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            meta = outcome(waiting)
            decision = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(decision, Grant)
            tokens.append(decision.token)
            grants.deliver(decision)
            ran = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 1
            replayed = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 1
            return [waiting, ran, replayed]

    waiting, ran, replayed = run(scenario)
    assert waiting.is_error is False
    assert waiting.structured_content is None
    assert text(waiting).startswith("NOT EXECUTED: refund_order is awaiting approval by finance")
    meta = outcome(waiting)
    assert meta["status"] == "awaiting_approval"
    assert meta["version"] == 1
    assert meta["card_url"] == f"http://127.0.0.1:8765/approvals/{meta['approval_id']}"
    assert meta["card_url"] in text(waiting)
    assert outcome(ran) == {
        "status": "executed",
        "replay": False,
        "approval_id": meta["approval_id"],
        "version": 1,
    }
    assert outcome(replayed)["replay"] is True
    assert ran.structured_content == replayed.structured_content
    assert ran.structured_content is not None
    assert ran.structured_content["refund_id"] == "re_1"
    assert len(store.executions(tool="refund_order")) == 1
    [token] = tokens
    assert all(token not in r.model_dump_json(by_alias=True) for r in (waiting, ran, replayed))
    assert len(grants) == 0


def test_an_approval_whose_grant_did_not_arrive_does_not_run(
    gate: EffectGate, shop: Shop, store: SQLStore
) -> None:
    """Approved but its grant not delivered: the re-issue still answers NOT EXECUTED. Once the
    approver runs it (`effectgate serve --execute`), the re-issue gets the stored result."""

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=Grants()) as session:
            first = await session.call_tool("refund_order", REFUND)
            meta = outcome(first)
            grant = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            approved = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            gate.execute(grant.token)
            return [approved, await session.call_tool("refund_order", REFUND)]

    approved, stored = run(scenario)
    assert outcome(approved)["status"] == "approved"
    assert approved.is_error is False
    assert text(approved).startswith("NOT EXECUTED")
    assert outcome(stored)["status"] == "executed"
    assert outcome(stored)["replay"] is True
    assert shop.receiver.count("refund") == 1
    assert len(store.executions(tool="refund_order")) == 1


def test_a_grant_runs_only_the_arguments_it_approved(gate: EffectGate, shop: Shop) -> None:
    """The client amends a waiting refund (version 2) and version 2 is approved: re-issuing the
    first arguments runs nothing; the approved arguments run once."""
    grants = Grants()
    smaller = {**REFUND, "amount": 5000}

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            await session.call_tool("refund_order", REFUND)
            amended = outcome(await session.call_tool("refund_order", smaller))
            assert amended["version"] == 2
            grant = gate.approve(amended["approval_id"], version=2, approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            stale = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            assert len(grants) == 1
            return [stale, await session.call_tool("refund_order", smaller)]

    stale, ran = run(scenario)
    assert text(stale).startswith("NOT EXECUTED")
    assert outcome(stale)["version"] == 2
    assert outcome(ran)["status"] == "executed"
    assert [e.payload["amount"] for e in shop.receiver.effects if e.kind == "refund"] == [5000]


def test_a_tool_outside_the_allowlist_is_refused(gate: EffectGate, shop: Shop, store: SQLStore) -> None:
    """The summarizer is not listed refund_order; calling it anyway is refused and recorded."""
    summarizer = Identity(user_id="u1", session_id="s-sum", agent_id=SUMMARY_AGENT)

    async def scenario() -> types.CallToolResult:
        async with client(gate, summarizer) as session:
            return await session.call_tool("refund_order", REFUND)

    result = run(scenario)
    assert result.is_error is True
    assert outcome(result)["code"] == "not_allowed"
    assert text(result).startswith("Refused (not_allowed)")
    assert shop.receiver.count("refund") == 0
    assert gate.pending() == []
    assert [e.tool for e in store.events(kind="refused")] == ["refund_order"]


def test_model_written_identity_changes_nothing(gate: EffectGate, shop: Shop) -> None:
    """A user id in the arguments (or in _meta) is not identity: the configured user decides
    scope, and the approval is filed under the configured session and user."""

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate) as session:
            return [
                await session.call_tool("get_order", {"order_id": "2001", "user_id": "u2"}),
                await session.call_tool("get_order", {"order_id": "2001"}, meta={"user_id": "u2"}),
                await session.call_tool(
                    "refund_order", {**REFUND, "session_id": "s-other", "agent_id": "root"}
                ),
                await session.call_tool("refund_order", REFUND, meta={"user_id": "u2"}),
            ]

    smuggled, foreign, extra, refund = run(scenario)
    assert smuggled.is_error is True
    assert outcome(smuggled)["status"] == "invalid"
    assert foreign.is_error is True
    assert outcome(foreign)["code"] == "out_of_scope"
    assert extra.is_error is True
    assert outcome(extra)["status"] == "invalid"
    [card] = gate.pending()
    assert card.approval_id == outcome(refund)["approval_id"]
    assert (card.user_id, card.session_id) == ("u1", "s-mcp")
    assert shop.receiver.count("refund") == 0


def test_a_client_ignoring_the_hints_gains_nothing(gate: EffectGate, shop: Shop) -> None:
    """A client that treats every tool as read-only and retries freely, even concurrently,
    gets one waiting approval per call and no effect; the destructive one needs two approvers."""
    grants = Grants()
    delete = {"customer_id": "u1"}

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            tools = (await session.list_tools()).tools
            assert all(t.annotations is not None for t in tools)
            burst = await asyncio.gather(
                *(session.call_tool("delete_customer_data", delete) for _ in range(3))
            )
            meta = outcome(burst[0])
            partial = gate.approve(
                meta["approval_id"], version=meta["version"], approver=Approver("pia", "privacy")
            )
            assert not isinstance(partial, Grant)
            return [*burst, await session.call_tool("delete_customer_data", delete)]

    results = run(scenario)
    assert {outcome(r)["approval_id"] for r in results} == {outcome(results[0])["approval_id"]}
    assert all(text(r).startswith("NOT EXECUTED") for r in results)
    assert shop.receiver.count("delete") == 0
    assert "u1" not in shop.deleted
    assert len(gate.pending()) == 1


def test_an_unknown_outcome_is_an_error_and_never_runs_twice(gate: EffectGate, shop: Shop) -> None:
    """The provider times out after refunding: the client is told the outcome is unknown, and
    its re-issue does not refund again."""
    grants = Grants()
    shop.provider.timeouts_to_inject = 1

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            grant = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            return [
                await session.call_tool("refund_order", REFUND),
                await session.call_tool("refund_order", REFUND),
            ]

    unknown, again = run(scenario)
    assert unknown.is_error is True
    assert outcome(unknown)["code"] == "needs_reconciliation"
    assert again.is_error is True
    assert outcome(again)["code"] == "needs_reconciliation"
    assert shop.receiver.count("refund") == 1
