"""MCP proxy, review round 2: each test reproduces a defect found in review."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp.types as types
import pytest
from mcp.client._memory import InMemoryTransport
from mcp.server import Server

from effectgate import Keyring
from effectgate.effects import Effect
from effectgate.mcp._common import Identity
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run

IDENTITY = Identity(user_id="u1", session_id="s-round2", agent_id="desk")


@pytest.mark.xfail(
    strict=True,
    reason="ApprovingGate compares the approval with the upstream now, then decides with the table "
    "read at start: a tool upgraded since start can never be approved until the process restarts "
    "(replacing a running gate's rows is a design decision)",
)
def test_an_approving_process_started_before_an_upgrade_approves_calls_proposed_after_it(
    store: SQLStore,
) -> None:
    """The approving side (`proxy_app`'s gate) read the upstream when it started; the upstream is
    then upgraded (send_mail reworded), and the proxy, which re-lists on every call, proposes a
    send under the tool as it is now. The reviewer approves it in the running inbox: the approval
    is checked against the upstream now (unchanged since the proposal), so it is approved and
    runs once, however long the approving process has been up."""
    from effectgate import Approver, Grant, Pending
    from effectgate.context import CallContext
    from effectgate.effects import Policy
    from effectgate.mcp._approving import ApprovingGate, current_row
    from effectgate.mcp._config import ProxyConfig
    from effectgate.mcp._upstream import Connection, specs_for, table_of

    from .upstream_server import Effect as Done
    from .upstream_server import files_server, reword_send_mail

    effects: list[Done] = []
    upstream = files_server(effects.append)
    config = ProxyConfig(
        servers=(
            Upstream(
                name="files",
                target=upstream,
                prefix="files",
                tools={"send_mail": Row(effect=Effect.SEND, approver_role="support")},
            ),
        )
    )
    policy, keyring = Policy(), Keyring.generate()

    async def rows() -> list[list[Any]]:
        server = config.servers[0]
        connection = Connection(server)
        return [specs_for(server, connection, await connection.list_tools(), policy)]

    approving = ApprovingGate(
        table_of(run(rows), "desk"),
        store,
        policy=policy,
        keyring=keyring,
        current_row=current_row(config, policy),
    )
    reword_send_mail(upstream, effects.append)  # upgraded after the approving side started
    proposing = ApprovingGate(
        table_of(run(rows), "desk"),
        store,
        policy=policy,
        keyring=keyring,
        current_row=current_row(config, policy),
    )
    ctx = CallContext(session_id="s", origin_message_id="m-1", user_id="u1", agent_id="desk")
    mail = {"to": "eve@example.com", "body": "hi"}
    pending = proposing.call("files__send_mail", mail, ctx)
    assert isinstance(pending, Pending)
    grant = approving.approve(pending.approval_id, version=1, approver=Approver("sam", "support"))
    assert isinstance(grant, Grant)
    approving.execute(grant.token)
    assert [e.tool for e in effects] == ["send_mail"]
    approving.close()
    proposing.close()


def test_an_upstream_whose_listing_hangs_does_not_hold_another_servers_calls(
    store: SQLStore, clock: FakeClock
) -> None:
    """Every call re-lists its upstream under the proxy's table lock. slow's tools/list hangs
    (after its first listing); a call to fast, another upstream, must still run (its upstream
    counts it) while slow's listing is outstanding, not wait behind it for ever."""
    entered, release = asyncio.Event(), asyncio.Event()
    listings = [0]
    calls: dict[str, list[str]] = {"slow": [], "fast": []}

    def server(name: str, hangs: bool) -> Server[Any]:
        async def on_list(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
            if hangs:
                listings[0] += 1
                if listings[0] > 1:
                    entered.set()
                    await release.wait()
            tool = types.Tool(name="ping", input_schema={"type": "object", "properties": {}})
            return types.ListToolsResult(tools=[tool])

        async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            calls[name].append(params.name)
            return types.CallToolResult(content=[types.TextContent(text="ok")])

        return Server(name, on_list_tools=on_list, on_call_tool=on_call)

    upstreams = [
        Upstream(
            name=name,
            target=InMemoryTransport(server(name, name == "slow")),
            prefix=name,
            default=Row(effect=Effect.WRITE),
        )
        for name in ("slow", "fast")
    ]

    async def scenario() -> types.CallToolResult | None:
        proxy = GatedProxy(upstreams, store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            hung = asyncio.create_task(proxy.call_tool("slow__ping", {}, call_id="c-1"))
            await entered.wait()
            try:
                return await asyncio.wait_for(proxy.call_tool("fast__ping", {}, call_id="c-2"), 10)
            except TimeoutError:
                return None
            finally:
                release.set()
                await hung

    result = run(scenario)
    assert calls["fast"] == ["ping"]
    assert result is not None
    assert outcome(result)["status"] == "executed"
    assert calls["slow"] == ["ping"]
