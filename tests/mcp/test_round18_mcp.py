"""Round 18 of the review of the MCP proxy, on SQLite and PostgreSQL: what an upstream's listing
makes the proxy's event loop do. Upstreams in process over memory streams; effects counted at
the upstream (the names of the calls it ran)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import mcp.types as types
import pytest
from mcp.client._memory import InMemoryTransport

from effectgate.effects import Effect
from effectgate.mcp import _proxy
from effectgate.mcp._config import Row, Upstream
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run
from .test_proxy_listing import proxied
from .upstream_server import listing_server

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}


def test_a_changed_listing_is_built_off_the_loop_and_outside_the_lock(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building an upstream's rows compiles two validators per tool (about 26 ms for a tool of
    20 string properties: 200 such tools took 4 s), and it ran on the proxy's event loop, under
    the lock every call takes: an upstream that changed its listing (one description) stalled
    every client of every upstream for as long. Here the rows of "slow" wait for a coroutine on
    the same loop while another client calls "fast": that call runs (so the build runs in a
    worker thread, and no lock it needs is held meanwhile), then the rebuild completes and the
    call of "slow"'s changed tool is routed by its new row. Were the build on the loop, its wait
    would run out (guarded: 5 s) and `stalled` says so."""
    calls: list[str] = []
    version = [1]
    started, released, stalled = threading.Event(), threading.Event(), []
    build = _proxy.specs_for

    def slow_build(upstream: Upstream, *args: Any) -> Any:
        if upstream.name == "slow" and version[0] == 2:
            started.set()
            if not released.wait(5):
                stalled.append(upstream.name)
        return build(upstream, *args)

    monkeypatch.setattr(_proxy, "specs_for", slow_build)

    def slow_listing(cursor: str | None) -> types.ListToolsResult:
        tool = types.Tool(name="lookup", description=f"v{version[0]}", input_schema=SCHEMA)
        return types.ListToolsResult(tools=[tool])

    def fast_listing(cursor: str | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="ping", input_schema=SCHEMA)])

    upstreams = [
        Upstream(
            name=name,
            target=InMemoryTransport(listing_server(name, listing, calls)),
            prefix=name,
            default=Row(effect=Effect.READ),
        )
        for name, listing in (("slow", slow_listing), ("fast", fast_listing))
    ]

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, list[str]]:
        async with proxied(store, clock, *upstreams) as (proxy, _):
            version[0] = 2
            slow = asyncio.create_task(proxy.call_tool("slow__lookup", {"x": "a"}))
            assert await asyncio.to_thread(started.wait, 5)
            fast = await proxy.call_tool("fast__ping", {"x": "b"})
            during = list(calls)
            released.set()
            return await slow, fast, during

    slow, fast, during = run(scenario)
    assert stalled == []
    assert during == ["ping"]  # the other upstream's call ran while the rebuild waited
    assert outcome(fast)["status"] == outcome(slow)["status"] == "executed"
    assert calls == ["ping", "lookup"]
