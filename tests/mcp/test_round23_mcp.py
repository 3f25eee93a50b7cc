"""Round 23 of the review of the MCP proxy, `mcp serve` and the file tools, on SQLite and
PostgreSQL. Servers in process over memory streams; effects counted where they land."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.server.mcpserver import MCPServer

from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring
from effectgate._execution import EXEC_PREFIX
from effectgate.effects import Effect
from effectgate.mcp import Identity, gated_server
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tools import file_tools

from ._serving import outcome, run

CODER = Identity(user_id="u1", session_id="s-r23", agent_id="coder")
DESK = Identity(user_id="u1", session_id="s-r23-proxy", agent_id="desk")
SUPPORT = Approver("sam", "support")
MAIL = {"to": "ada@example.com", "body": "hello"}


def test_an_approved_call_the_client_cancels_runs_to_its_end_once(store: SQLStore, clock: FakeClock) -> None:
    """An approved send_mail is re-issued and the upstream starts it; the client then cancels its
    request (its own request timeout, or `notifications/cancelled`). The proxy awaited the upstream
    call as a coroutine tool, so the client's cancellation cancelled the proxy's side of it: the
    upstream sent the mail, but its answer was dropped and the ledger kept the call in flight, to
    end `needs_reconciliation` (a person asked to find out what a finished call did). The call
    now runs to its end (once), its outcome is stored, and the next re-issue gets its result."""
    sent: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()
    upstream = MCPServer("mail")

    @upstream.tool()
    async def send_mail(to: str, body: str) -> str:
        """Send an e-mail."""
        started.set()
        await release.wait()
        sent.append(to)
        return f"sent to {to}"

    config = Upstream(
        name="mail",
        target=InMemoryTransport(upstream, raise_exceptions=True),
        prefix="mail",
        tools={"send_mail": Row(effect=Effect.SEND, approver_role="support")},
    )

    async def scenario() -> tuple[types.CallToolResult, str | None]:
        proxy = GatedProxy([config], store, identity=DESK, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            waiting = await proxy.call_tool("mail__send_mail", MAIL)
            grant = proxy.gate.approve(outcome(waiting)["approval_id"], version=1, approver=SUPPORT)
            assert isinstance(grant, Grant)
            proxy.grants.deliver(grant)
            first = asyncio.create_task(proxy.call_tool("mail__send_mail", MAIL))
            await started.wait()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            release.set()
            key = f"{EXEC_PREFIX}{grant.approval_id}_v1"
            status = None
            for _ in range(5000):  # the worker thread stores the outcome once the upstream answers
                record = await asyncio.to_thread(store.get, key)
                status = record.status if record is not None else None
                if status != "in_progress":
                    break
                await asyncio.sleep(0)
            return await proxy.call_tool("mail__send_mail", MAIL), status

    again, status = run(scenario)
    assert sent == ["ada@example.com"]
    assert status == "succeeded"
    assert outcome(again)["status"] == "executed"
    assert [e.status for e in store.executions(tool="mail__send_mail")] == ["succeeded"]


@pytest.mark.xfail(
    strict=True,
    reason="design: MCP carries no message id, so `origin_for` makes the call itself the request "
    "for the whole session (mcp:AGENT:USER by default, across restarts): a write (or an approved "
    "call) repeated later with the same arguments is answered with its stored result and never "
    "runs. Telling a retry from a new request needs a per-connection or time-bounded origin in "
    "`_common.origin_for`, or a replay worded as such (existing tests pin the same text)",
)
def test_a_write_undone_by_the_same_call_is_written(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """write_file a.txt "v1", then "v2", then "v1" again (the model undoes its edit). The third
    call is the first one again (MCP's origin is the call itself), so it is answered with the
    first call's stored result, as if written, and a.txt keeps "v2"."""
    table = EffectTable(file_tools(tmp_path))
    table.allow_all("coder")
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> list[Any]:
        server = gated_server(gate, identity=CODER)
        async with (
            InMemoryTransport(server, raise_exceptions=True) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            answers = []
            for content in ("v1", "v2", "v1"):
                result = await session.call_tool("write_file", {"path": "a.txt", "content": content})
                answers.append(outcome(result)["status"])
            return answers

    try:
        answers = run(scenario)
    finally:
        gate.close()
    assert answers == ["executed"] * 3
    assert (tmp_path / "a.txt").read_text() == "v1"
