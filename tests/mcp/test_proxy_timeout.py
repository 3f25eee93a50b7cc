"""The MCP proxy's bounded wait on its upstreams (`[servers.X] timeout`), on SQLite and PostgreSQL.

An in-process upstream (the SDK's low-level `Server` over memory streams) whose tools wait on an
event that is never set: with a small configured timeout, a money call that reached the upstream
ends needs_reconciliation (never failed, never run again), a read answers an error, and a listing
that never answers is bounded too. The assertions are on the records and on the upstream's own
counters, never on timing. Each scenario also runs under a generous outer bound, so a regression
fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.server import Server

from effectgate import Approver, Grant, Keyring
from effectgate.effects import Effect
from effectgate.mcp._common import META_KEY, Grants, Identity
from effectgate.mcp._config import DEFAULT_TIMEOUT, ProxyConfigError, Row, Upstream, parse_config
from effectgate.mcp._proxy import GatedProxy
from effectgate.mcp._upstream import Connection, UpstreamUnreachable
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

T = TypeVar("T")
IDENTITY = Identity(user_id="u1", session_id="s-timeout", agent_id="desk")
FINANCE = Approver("fiona", "finance")
PAY = {"to": "acct-7", "amount": 12000}
TIMEOUT = 0.3
#: Far above TIMEOUT: only a wait that is not bounded at all reaches it.
OUTER = 30.0

ROWS = {
    "pay": Row(effect=Effect.MONEY, approver_role="finance"),
    "note": Row(effect=Effect.WRITE),
    "balance": Row(effect=Effect.READ),
    "ping": Row(effect=Effect.READ),
}


def _tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object", "additionalProperties": True})


@dataclass
class Bank:
    """The upstream: what each tool received, and a switch that makes its listing hang."""

    received: dict[str, int] = field(default_factory=dict[str, int])
    listing_hangs: bool = False
    never: asyncio.Event = field(default_factory=asyncio.Event)  # never set

    def server(self) -> Server[Any]:
        async def on_list(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
            if self.listing_hangs:
                await self.never.wait()
            return types.ListToolsResult(tools=[_tool(name) for name in ROWS])

        async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            self.received[params.name] = self.received.get(params.name, 0) + 1
            if params.name != "ping":  # every other tool hangs, after it received the call
                await self.never.wait()
            return types.CallToolResult(content=[types.TextContent(text="pong")])

        return Server("bank", on_list_tools=on_list, on_call_tool=on_call)


def _run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(scenario(), OUTER)

    return asyncio.run(main())


def _code(result: types.CallToolResult) -> str:
    return str(dict((result.meta or {})[META_KEY])["code"])


@asynccontextmanager
async def proxied(
    store: SQLStore, clock: FakeClock, bank: Bank, *, grants: Grants | None = None
) -> AsyncIterator[tuple[GatedProxy, ClientSession]]:
    upstream = Upstream(
        name="bank",
        target=InMemoryTransport(bank.server()),
        prefix="bank",
        tools=ROWS,
        timeout=TIMEOUT,
    )
    proxy = GatedProxy(
        [upstream], store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock, grants=grants
    )
    async with (
        proxy,
        InMemoryTransport(proxy.server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield proxy, session


def test_a_money_call_whose_upstream_never_answers_needs_reconciliation(
    store: SQLStore, clock: FakeClock
) -> None:
    """The approved payment reached the upstream, which never answers: after the configured
    timeout the call is an unknown outcome (needs_reconciliation, not failed), its idempotency
    record says so, and a re-issue does not reach the upstream again. The session stays usable."""
    bank = Bank()
    grants = Grants()

    async def scenario() -> tuple[list[types.CallToolResult], str]:
        async with proxied(store, clock, bank, grants=grants) as (proxy, session):
            waiting = await session.call_tool("bank__pay", PAY)
            meta = dict((waiting.meta or {})[META_KEY])
            grant = proxy.gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            timed_out = await session.call_tool("bank__pay", PAY)
            again = await session.call_tool("bank__pay", PAY)
            ping = await session.call_tool("bank__ping", {})
            return [waiting, timed_out, again, ping], meta["approval_id"]

    (waiting, timed_out, again, ping), approval_id = _run(scenario)
    assert dict((waiting.meta or {})[META_KEY])["status"] == "awaiting_approval"
    assert timed_out.is_error is True
    assert _code(timed_out) == "needs_reconciliation"
    assert _code(again) == "needs_reconciliation"
    assert bank.received.get("pay") == 1  # it reached the upstream once, and only once
    record = store.get(f"eg_{approval_id}_v1")
    assert record is not None
    assert record.status == "needs_reconciliation"
    [execution] = store.executions(tool="bank__pay")
    assert execution.status == "needs_reconciliation"
    assert ping.is_error is not True  # the upstream session is still usable
    assert bank.received.get("ping") == 1


def test_a_write_whose_upstream_never_answers_needs_reconciliation(store: SQLStore, clock: FakeClock) -> None:
    """A write (no approval) that never answers is needs_reconciliation, never re-run."""
    bank = Bank()

    async def scenario() -> list[types.CallToolResult]:
        async with proxied(store, clock, bank) as (_, session):
            return [await session.call_tool("bank__note", {"text": "x"}) for _ in range(2)]

    first, again = _run(scenario)
    assert (_code(first), _code(again)) == ("needs_reconciliation", "needs_reconciliation")
    assert bank.received.get("note") == 1
    [execution] = store.executions(tool="bank__note")
    assert execution.status == "needs_reconciliation"


def test_a_read_whose_upstream_never_answers_is_an_error(store: SQLStore, clock: FakeClock) -> None:
    """A read that never answers returns an error to the client, names the upstream, and leaves
    no record of success."""
    bank = Bank()

    async def scenario() -> types.CallToolResult:
        async with proxied(store, clock, bank) as (_, session):
            return await session.call_tool("bank__balance", {})

    result = _run(scenario)
    assert result.is_error is True
    assert _code(result) == "UpstreamUnreachable"
    assert bank.received.get("balance") == 1
    assert [e for e in store.executions(tool="bank__balance") if e.status == "succeeded"] == []


def test_a_listing_that_never_answers_is_bounded(store: SQLStore, clock: FakeClock) -> None:
    """The upstream lists its tools at start, then its listing hangs: the listing read before a
    call is bounded (UpstreamUnreachable naming the server), so the call is not made, and the
    client's listing still answers with the last one."""
    bank = Bank()
    raised: list[BaseException] = []

    async def scenario() -> tuple[types.CallToolResult, list[str]]:
        async with proxied(store, clock, bank) as (proxy, session):
            bank.listing_hangs = True
            result = await session.call_tool("bank__ping", {})
            try:
                await proxy.refresh("bank")
            except UpstreamUnreachable as exc:
                raised.append(exc)
            listed = [t.name for t in (await session.list_tools()).tools]
            return result, listed

    result, listed = _run(scenario)
    assert result.is_error is True
    assert bank.received == {}
    assert len(raised) == 1
    assert str(raised[0]).startswith("upstream 'bank': listing its tools failed")
    assert sorted(listed) == sorted(f"bank__{name}" for name in ROWS)
    assert store.executions() == []


def test_an_unopened_connection_is_bounded_too() -> None:
    """The approving side's connection (a session of its own per request) is bounded by the same
    timeout, for a call and for a listing."""
    bank = Bank()

    async def scenario() -> list[BaseException]:
        upstream = Upstream(name="bank", target=bank.server(), prefix="bank", tools=ROWS, timeout=TIMEOUT)
        errors: list[BaseException] = []
        try:
            await Connection(upstream).call("pay", PAY, key="k-1")
        except UpstreamUnreachable as exc:
            errors.append(exc)
        bank.listing_hangs = True
        try:
            await Connection(upstream).list_tools()
        except UpstreamUnreachable as exc:
            errors.append(exc)
        return errors

    errors = _run(scenario)
    assert [str(e).split(":")[0] for e in errors] == ["upstream 'bank'", "upstream 'bank'"]
    assert bank.received == {"pay": 1}


def _config(**server: Any) -> dict[str, Any]:
    return {"servers": {"bank": {"url": "https://bank.example/mcp", **server}}}


@pytest.mark.parametrize("value", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "60", [60]])
def test_a_bad_timeout_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(ProxyConfigError, match=r"\[servers\.bank\]\.timeout"):
        parse_config(_config(timeout=value))


def test_a_bad_timeout_given_in_code_is_refused_too() -> None:
    upstream = Upstream(name="bank", target=None, prefix="bank", timeout=0.0)
    with pytest.raises(ProxyConfigError, match=r"\[servers\.bank\]\.timeout"):
        GatedProxy([upstream], None, identity=IDENTITY, keyring=Keyring.generate())  # type: ignore[arg-type]


def test_a_timeout_is_read_as_seconds() -> None:
    assert parse_config(_config(timeout=2)).servers[0].timeout == 2.0
    assert parse_config(_config(timeout=0.25)).servers[0].timeout == 0.25
    assert parse_config(_config()).servers[0].timeout == DEFAULT_TIMEOUT
    assert math.isfinite(DEFAULT_TIMEOUT)
    assert DEFAULT_TIMEOUT > 0
