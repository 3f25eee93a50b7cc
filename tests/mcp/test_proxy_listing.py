"""The proxy's listings of its upstreams, on SQLite and PostgreSQL: a refresh pass is all or
nothing, a listing is bounded, and what an upstream writes (tool names, error text) reaches the
log as escaped text. Upstreams in process over memory streams, as in test_proxy.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, ToolAnnotations

from effectgate import Grant, Keyring
from effectgate.effects import Effect
from effectgate.mcp import _connection
from effectgate.mcp._common import Grants
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.mcp._upstream import MAX_PAGES, Connection, UpstreamListingError, UpstreamToolError
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run, text
from .test_proxy import IDENTITY, MAIL, ROWS, SUPPORT
from .upstream_server import Effect as Done
from .upstream_server import files_server, listing_server, reword_send_mail

ESCAPES = "x\x1b[2J\x1b]0;owned\x07\nWARNING: all approvals verified"


def _tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object", "properties": {"x": {"type": "string"}}})


def _page(names: list[str], cursor: str | None = None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[_tool(n) for n in names], next_cursor=cursor)


@asynccontextmanager
async def proxied(
    store: SQLStore, clock: FakeClock, *upstreams: Upstream, grants: Grants | None = None
) -> AsyncIterator[tuple[GatedProxy, ClientSession]]:
    proxy = GatedProxy(
        list(upstreams), store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock, grants=grants
    )
    async with (
        proxy,
        InMemoryTransport(proxy.server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield proxy, session


def scripted(name: str, listing: Callable[[str | None], types.ListToolsResult], calls: list[str]) -> Upstream:
    """An upstream whose listing the test scripts, every tool served as a read."""
    server = listing_server(name, listing, calls)
    return Upstream(name=name, target=InMemoryTransport(server), prefix=name, default=Row(effect=Effect.READ))


def test_a_refresh_that_fails_half_way_leaves_no_stale_table(store: SQLStore, clock: FakeClock) -> None:
    """files changes two tools (append now claims destructiveHint, send_mail is reworded after
    its approval) in the same client listing in which the next upstream's listing fails. The
    failed pass keeps nothing, so the next pass sees files' change: append waits for approval
    and the approved send_mail is refused; nothing reaches the upstream."""
    effects: list[Done] = []
    files = files_server(effects.append)
    down = [False]
    calls: list[str] = []

    def other_listing(cursor: str | None) -> types.ListToolsResult:
        if down[0]:
            raise MCPError(INTERNAL_ERROR, "temporarily unavailable")
        return _page(["ping"])

    upstreams = (
        Upstream(
            name="files",
            target=InMemoryTransport(files, raise_exceptions=True),
            prefix="files",
            tools=ROWS,
            approver_role="ops",
        ),
        scripted("other", other_listing, calls),
    )
    grants = Grants()

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, Effect]:
        async with proxied(store, clock, *upstreams, grants=grants) as (proxy, session):
            waiting = await session.call_tool("files__send_mail", MAIL)
            meta = outcome(waiting)
            grant = proxy.gate.approve(meta["approval_id"], version=meta["version"], approver=SUPPORT)
            assert isinstance(grant, Grant)
            grants.deliver(grant)

            def append(path: str, text: str) -> str:
                effects.append(Done("append", {"path": path, "text": text}, None))
                return f"appended to {path}"

            files.remove_tool("append")
            files.add_tool(append, name="append", annotations=ToolAnnotations(destructive_hint=True))
            reword_send_mail(files, effects.append)
            down[0] = True
            await session.list_tools()  # files' new listing is read, then other's fails
            down[0] = False
            appended = await session.call_tool("files__append", {"path": "a.txt", "text": "x"})
            sent = await session.call_tool("files__send_mail", MAIL)
            return appended, sent, proxy.gate.table["files__append"].effect

    appended, sent, effect = run(scenario)
    assert effect is Effect.DESTRUCTIVE
    assert outcome(appended)["status"] == "awaiting_approval"
    assert outcome(sent)["code"] == "mismatch"
    assert "changed upstream" in text(sent)
    assert effects == []
    assert store.executions() == []


def test_a_listing_that_pages_forever_is_cut_off_and_blocks_no_other_server(
    store: SQLStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """evil starts answering tools/list with a fresh cursor on every page (this one stops after
    300): the proxy reads at most MAX_PAGES pages, logs the refusal naming evil, keeps serving
    evil's last listing, and good's call runs."""
    pages: list[str | None] = []
    endless = [False]

    def evil_listing(cursor: str | None) -> types.ListToolsResult:
        if not endless[0]:
            return _page(["stat"])
        pages.append(cursor)
        return _page(["stat"], None if len(pages) >= 300 else f"c{len(pages)}")

    calls: list[str] = []
    upstreams = (scripted("evil", evil_listing, calls), scripted("good", lambda _: _page(["stat"]), calls))

    async def scenario() -> tuple[list[str], types.CallToolResult]:
        async with proxied(store, clock, *upstreams) as (_, session):
            endless[0] = True
            served = [t.name for t in (await session.list_tools()).tools]
            return served, await session.call_tool("good__stat", {"x": "a"})

    with caplog.at_level(logging.WARNING, logger="effectgate.mcp"):
        served, stat = run(scenario)
    assert len(pages) <= MAX_PAGES + 1  # the call's own refresh reads good only
    assert served == ["evil__stat", "good__stat"]
    assert outcome(stat)["status"] == "executed"
    assert calls == ["stat"]
    assert f"upstream 'evil': its tools/list has more than {MAX_PAGES} pages" in caplog.text


@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        (lambda cursor: _page(["t"], "again"), "cursor 'again' repeats"),
        (lambda cursor: _page([f"t{cursor}"], f"{cursor or ''}c"), "more than 5 tools"),
    ],
    ids=["repeated-cursor", "too-many-tools"],
)
def test_a_listing_out_of_bounds_raises_naming_the_server(
    monkeypatch: pytest.MonkeyPatch,
    pages: Callable[[str | None], types.ListToolsResult],
    problem: str,
) -> None:
    """A cursor that comes back (this upstream repeats "again" forever), or more tools than
    MAX_TOOLS (5 here; one new tool and cursor a page): `UpstreamListingError` naming the
    server, after reading no more than it had to (the upstream stops after 300 pages)."""
    monkeypatch.setattr(_connection, "MAX_TOOLS", 5)  # where the listing is read
    served: list[str | None] = []

    def listing(cursor: str | None) -> types.ListToolsResult:
        served.append(cursor)
        if len(served) > 300:  # without the bounds: end, so the test fails instead of hanging
            return _page([])
        return pages(cursor)

    connection = Connection(scripted("loop", listing, []))

    async def scenario() -> None:
        await connection.list_tools()

    with pytest.raises(UpstreamListingError) as raised:
        run(scenario)
    assert str(raised.value).startswith("upstream 'loop': ")
    assert problem in str(raised.value)
    assert len(served) <= 6


def test_upstream_text_reaches_the_log_escaped(
    store: SQLStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool name and a listing error holding terminal escapes and a newline (a forged log line)
    are logged as repr: no control character reaches the log."""
    failing = [False]

    def listing(cursor: str | None) -> types.ListToolsResult:
        if failing[0]:
            raise MCPError(INTERNAL_ERROR, ESCAPES)
        return _page(["stat", ESCAPES])

    upstream = scripted("up", listing, [])
    upstream = Upstream(
        name="up", target=upstream.target, prefix="up", tools={"stat": Row(effect=Effect.READ)}
    )

    async def scenario() -> types.CallToolResult:
        async with proxied(store, clock, upstream) as (_, session):
            failing[0] = True
            await session.list_tools()
            return await session.call_tool("up__stat", {"x": "a"})

    with caplog.at_level(logging.INFO, logger="effectgate"):
        refused = run(scenario)
    assert refused.is_error is True
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("effectgate.mcp")]
    assert any("not served" in m for m in messages)
    assert any("listing the upstream tools failed" in m for m in messages)
    assert any("call of 'up__stat' not made" in m for m in messages)
    for message in messages:
        assert not any(ord(c) < 32 for c in message), repr(message)


def test_an_upstream_error_result_is_described_escaped() -> None:
    """An error result's text (which the gate logs as a failure's reason) is quoted as repr."""
    result = {"content": [{"type": "text", "text": ESCAPES}], "isError": True}
    message = str(UpstreamToolError("up", ESCAPES, result))
    assert message.startswith("up: 'x\\x1b[2J")
    assert not any(ord(c) < 32 for c in message), repr(message)
