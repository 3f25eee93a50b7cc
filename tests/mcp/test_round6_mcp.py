"""Round 6 of the review of the MCP side (`mcp serve`, `mcp proxy`), on SQLite and PostgreSQL:
an approved call's grant when the store fails while the grant is being bound to the call, an
upstream whose listing holds an integer beyond JSON's exact range, and a re-issue answered with
a result a person settled."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import mcp.types as types
import pytest
import sqlalchemy as sa
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from effectgate import EffectGate, Grant, Keyring
from effectgate.effects import Effect
from effectgate.examples.shop import Shop
from effectgate.mcp._common import Grants, Identity
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import FINANCE, REFUND, outcome, run, text
from .test_proxy import SUPPORT, proxied
from .test_serve import client, gate, shop

__all__ = ["gate", "shop"]  # the fixtures of test_serve.py

IDENTITY = Identity(user_id="u1", session_id="s-round6", agent_id="desk")


@asynccontextmanager
async def served(proxy: GatedProxy) -> AsyncIterator[ClientSession]:
    """A real MCP client session in front of a running proxy."""
    async with (
        InMemoryTransport(proxy.server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_a_grant_survives_a_store_failure_while_it_is_bound(
    gate: EffectGate, shop: Shop, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client re-issued an approved refund, and the store failed while the server checked
    the delivered grant against the approval's card (`bind_decision` reads it: a dropped
    connection), before the gate saw the token: nothing ran, and the token is still good. The
    server had taken it out of `Grants` first and never put it back, so every later re-issue
    answered "its grant has not reached this server" until the grant lapsed and someone granted
    it again. The grant is kept; the next re-issue runs once."""
    grants = Grants()
    card = gate.card
    failures: list[int] = []

    def failing_once(approval_id: str) -> Any:
        if not failures:
            failures.append(1)
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("SELECT", None, lost)
        return card(approval_id)

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            grant = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            monkeypatch.setattr(gate, "card", failing_once)
            failed = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            return [failed, await session.call_tool("refund_order", REFUND)]

    failed, ran = run(scenario)
    assert failures == [1]
    assert failed.is_error is True
    assert outcome(ran)["status"] == "executed"
    assert shop.receiver.count("refund") == 1
    assert len(store.executions(tool="refund_order")) == 1


def test_an_int64_bound_in_one_tools_schema_leaves_the_others_served(
    store: SQLStore, clock: FakeClock
) -> None:
    """An upstream lists a tool whose schema bounds an argument by int64's maximum (as schemas
    generated from OpenAPI do: 9223372036854775807, beyond JSON's exact range). That row cannot be
    fingerprinted, so that tool alone is not served. But the proxy hashed the whole listing
    canonically to see whether it changed, and that hash refused the integer: the proxy did not
    start (a raw ArgumentError), and every call of the upstream's other tools failed. The tool is
    left out; the others are served and run."""
    done: list[str] = []
    upstream = MCPServer("ledger")

    @upstream.tool(annotations=ToolAnnotations(read_only_hint=True))
    def balance(account: str) -> str:
        """The balance of an account."""
        done.append(account)
        return "42"

    @upstream.tool()
    def seek(offset: Annotated[int, Field(ge=0, le=2**63 - 1)]) -> str:
        """Seek to an offset."""
        return "ok"

    config = Upstream(
        name="ledger",
        target=InMemoryTransport(upstream, raise_exceptions=True),
        prefix="ledger",
        tools={"balance": Row(effect=Effect.READ), "seek": Row(effect=Effect.WRITE)},
    )

    async def scenario() -> tuple[list[str], types.CallToolResult]:
        proxy = GatedProxy([config], store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock)
        async with proxy, served(proxy) as session:
            names = [t.name for t in (await session.list_tools()).tools]
            return names, await session.call_tool("ledger__balance", {"account": "a1"})

    names, result = run(scenario)
    assert names == ["ledger__balance"]
    assert result.is_error is False
    assert done == ["a1"]


def test_a_settled_result_that_is_not_mcp_content_is_answered_not_raised(
    store: SQLStore, clock: FakeClock
) -> None:
    """bounce's outcome was unknown (its upstream answered with an error result), and a person
    settled it: it happened, with the result they wrote (`settle(result=...)`), a "content" list
    of plain text rather than MCP content blocks. The client's re-issue gets the stored result,
    which the proxy took for the upstream's answer: the content failed the SDK's validation in
    the handler, and the client's call ended in a protocol error ("Invalid request parameters")
    instead of a result. The settled result is answered as the gate's text; nothing ran again."""
    grants = Grants()

    async def scenario() -> types.CallToolResult:
        async with proxied(store, Keyring.generate(), clock, grants=grants) as rig:
            waiting = await rig.call("bounce", {"to": "nobody@example.com"})
            grants.deliver(rig.approve(waiting, SUPPORT))
            unknown = await rig.call("bounce", {"to": "nobody@example.com"})
            assert outcome(unknown)["code"] == "needs_reconciliation"
            settled = {"content": ["bounced; the mailbox was recreated by hand"]}
            rig.proxy.gate.settle(outcome(waiting)["approval_id"], happened=True, result=settled, by="sam")
            return await rig.call("bounce", {"to": "nobody@example.com"})

    again = run(scenario)
    assert outcome(again)["status"] == "executed"
    assert again.is_error is False
    assert "recreated by hand" in text(again)
    assert [e.status for e in store.executions(tool="files__bounce")] == ["needs_reconciliation", "succeeded"]
