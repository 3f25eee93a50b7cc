"""Round 28 of the review of the MCP proxy, on SQLite and PostgreSQL. Upstream and proxy in process
(the SDK's `MCPServer` over memory streams); effects counted where they land."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp.types as types
import pytest
from mcp.client._memory import InMemoryTransport
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

from effectgate import Approver, EffectGate, Grant, Keyring
from effectgate.effects import Effect
from effectgate.mcp import Grants, Identity
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GRANT_META, GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run
from .test_proxy import MAIL, SUPPORT, Rig, proxied

DESK = Identity(user_id="u1", session_id="s-r28", agent_id="desk")
LINE = {"path": "app.log", "text": "hello"}
OPS = (Approver("olga", "ops"), Approver("omar", "ops"))


def _slow_files(done: list[str], started: asyncio.Event, release: asyncio.Event) -> MCPServer:
    """An upstream whose append (a write) waits for `release` once it has started."""
    upstream = MCPServer("files")

    @upstream.tool()
    async def append(path: str, text: str) -> str:
        """Append a line to a file."""
        started.set()
        await release.wait()
        done.append(path)
        return f"appended to {path}"

    return upstream


@pytest.mark.parametrize("closer", ["listing", "other_call"])
def test_a_gate_is_not_closed_under_a_cancelled_call_whose_work_still_runs(
    store: SQLStore, clock: FakeClock, closer: str
) -> None:
    """A client cancels its append once the upstream started it: the call runs to its end in the
    gate's worker thread, which renews its lease until its outcome is stored. The proxy then
    replaces its gate (the upstream lists a new tool) and, once no call held the old one, closed
    it: the cancelled call no longer counted as holding it, so the lease renewal stopped under a
    live run (`recover` in another worker then takes a slow but live call over: its outcome is
    recorded unknown). Either way (`listing`: the cancelled call was the only one on the gate;
    `other_call`: a second call on the replaced gate ends first), the old gate is closed only
    once no work runs on it (at exit), and the append is stored once, succeeded."""
    done: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()
    other_started, other_release = asyncio.Event(), asyncio.Event()
    upstream = _slow_files(done, started, release)

    @upstream.tool()
    async def note(text: str) -> str:
        """Write a note."""
        other_started.set()
        await other_release.wait()
        return "noted"

    config = Upstream(
        name="files",
        target=InMemoryTransport(upstream, raise_exceptions=True),
        prefix="files",
        tools={"append": Row(effect=Effect.WRITE), "note": Row(effect=Effect.WRITE)},
        default=Row(effect=Effect.READ),
    )
    closed_while_running: list[bool] = []

    async def scenario() -> str:
        proxy = GatedProxy([config], store, identity=DESK, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            old: EffectGate = proxy.gate
            real_close = old.close

            def close() -> None:
                closed_while_running.append(not done)
                real_close()

            old.close = close  # type: ignore[method-assign]
            other = None
            if closer == "other_call":
                other = asyncio.create_task(proxy.call_tool("files__note", {"text": "x"}))
                await other_started.wait()
            first = asyncio.create_task(proxy.call_tool("files__append", LINE))
            await started.wait()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first

            @upstream.tool()
            def later(x: str) -> str:
                """A tool the upstream lists from now on."""
                return x

            await proxy.refresh()  # the listing changed: a new gate
            assert proxy.gate is not old
            if other is not None:
                other_release.set()
                await other
            release.set()
            for _ in range(5000):  # the worker thread stores the outcome once the upstream answers
                if await asyncio.to_thread(store.executions, tool="files__append"):
                    break
                await asyncio.sleep(0)
            again = await proxy.call_tool("files__append", LINE)
            return outcome(again)["status"]

    again = run(scenario)
    assert closed_while_running == [False]  # closed once, at exit, after the append ended
    assert done == ["app.log"]
    assert [e.status for e in store.executions(tool="files__append")] == ["succeeded"]
    assert again == "executed"


def test_a_subject_left_out_is_sent_upstream_as_the_default_the_reviewer_saw(
    store: SQLStore, clock: FakeClock
) -> None:
    """delete's subject is its path, and the upstream's schema declares path's default
    ("scratch.txt"). A call that leaves path out names that default as its subject (what the gate
    keys and the reviewers approve), but the proxy sent the arguments as given, so the upstream
    ran with a default of its own ("important.db" here): two ops approved deleting scratch.txt
    and important.db was deleted. The subject's default is now sent with the call."""
    deleted: list[str] = []
    schema = {"type": "object", "properties": {"path": {"type": "string", "default": "scratch.txt"}}}

    async def on_list(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="delete", input_schema=schema)])

    async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        deleted.append(str((params.arguments or {}).get("path", "important.db")))
        return types.CallToolResult(content=[types.TextContent(text="deleted")])

    config = Upstream(
        name="files",
        target=Server("files", on_list_tools=on_list, on_call_tool=on_call),
        prefix="files",
        tools={"delete": Row(effect=Effect.DESTRUCTIVE, approver_role="ops", subject=("path",))},
    )

    async def scenario() -> tuple[dict[str, Any] | None, str]:
        proxy = GatedProxy([config], store, identity=DESK, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            waiting = outcome(await proxy.call_tool("files__delete", {}))
            subject = proxy.gate.card(waiting["approval_id"]).subject
            for approver in OPS:
                grant = proxy.gate.approve(waiting["approval_id"], version=1, approver=approver)
            assert isinstance(grant, Grant)
            proxy.grants.deliver(grant)
            return subject, outcome(await proxy.call_tool("files__delete", {}))["status"]

    subject, status = run(scenario)
    assert subject == {"path": "scratch.txt"}
    assert status == "executed"
    assert deleted == ["scratch.txt"]


def test_a_lapsed_grant_sent_with_the_call_does_not_hold_back_the_delivered_one(
    store: SQLStore, clock: FakeClock
) -> None:
    """send_mail is approved, and the client application keeps the grant `effectgate approve`
    printed; it lapses unused. A second approver grants it again (a new round) and that grant is
    delivered to the proxy. The client re-issues the call with the lapsed token in `_meta`: it is
    refused as expired, and the proxy answered that (the model told "expired") while the
    delivered grant, for the same approval version, stayed unused; every re-issue that carried
    the old token was refused so. The delivered grant now runs the call, once."""
    grants = Grants()

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(store, Keyring.generate(), clock, grants=grants) as rig:
            waiting = await rig.call("send_mail", MAIL)
            lapsed = rig.approve(waiting, SUPPORT)
            clock.advance(rig.proxy.gate.policy.token_ttl + 1)
            grants.deliver(rig.approve(waiting, Approver("sue", "support")))
            meta = {GRANT_META: lapsed.token}
            return [await rig.call("send_mail", MAIL, meta=meta) for _ in range(2)], rig

    (ran, again), rig = run(scenario)
    assert rig.count("send_mail") == 1
    assert [e.status for e in store.executions(tool="files__send_mail")] == ["succeeded"]
    assert (outcome(ran)["status"], outcome(again)["replay"]) == ("executed", True)
