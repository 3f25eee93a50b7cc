"""Round 20 of the review of the MCP proxy and the file tools, on SQLite and PostgreSQL.
Upstreams in process over memory streams; effects counted at the upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.server import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring, PartialApproval, ToolSpec
from effectgate.effects import Effect
from effectgate.mcp import Grants, Identity, gated_server
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock
from effectgate.tools import file_tools

from ._serving import outcome, run, text
from .test_proxy import OPS, Rig, proxied
from .upstream_server import Effect as Done
from .upstream_server import _key

PATH = {"path": "a.txt"}


def _unclaim_truncate(rig: Rig) -> None:
    """truncate as an upgrade relists it: the same tool, no longer claiming destructiveHint, so
    the row is the write the table says again."""
    server: MCPServer = rig.upstream
    server.remove_tool("truncate")

    def truncate(path: str, ctx: Context) -> str:
        """Empty a file."""
        rig.effects.append(Done("truncate", {"path": path}, _key(ctx)))
        return f"truncated {path}"

    server.add_tool(truncate)


def test_an_approved_call_that_ran_does_not_run_again_once_its_hint_is_dropped(
    store: SQLStore, clock: FakeClock
) -> None:
    """truncate's row says write; its upstream claims destructiveHint, so a call waits for two
    approvers and runs once. Then the upstream drops the claim (the row is a write again) and the
    client re-issues the same call, which the README promises gets its stored result: it ran a
    second time, as a new write (the gate keys a write apart from an approval)."""

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(store, Keyring.generate(), clock) as rig:
            waiting = await rig.call("truncate", PATH)
            decision: Grant | PartialApproval | None = None
            for approver in OPS:
                decision = rig.proxy.gate.approve(
                    outcome(waiting)["approval_id"], version=1, approver=approver
                )
            assert isinstance(decision, Grant)
            rig.proxy.grants.deliver(decision)
            ran = await rig.call("truncate", PATH)
            _unclaim_truncate(rig)
            again = await rig.call("truncate", PATH)
            return [ran, again], rig

    (ran, again), rig = run(scenario)
    assert outcome(ran)["status"] == "executed"
    assert rig.count("truncate") == 1
    assert (outcome(again)["status"], outcome(again)["replay"]) == ("executed", True)
    assert text(again) == text(ran) == "truncated a.txt"
    assert store.executions(tool="files__truncate")[0].approval_id == outcome(ran)["approval_id"]


def test_a_waiting_call_does_not_run_unapproved_once_its_hint_is_dropped(
    store: SQLStore, clock: FakeClock
) -> None:
    """The same, before anyone approved: the re-issued call ran as a write while its card still
    waited in the inbox (a reviewer could deny a call that had already run). It is refused as a
    tool that changed since its proposal, recorded, and nothing reaches the upstream."""

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, Rig]:
        async with proxied(store, Keyring.generate(), clock) as rig:
            waiting = await rig.call("truncate", PATH)
            _unclaim_truncate(rig)
            return waiting, await rig.call("truncate", PATH), rig

    waiting, again, rig = run(scenario)
    assert rig.count("truncate") == 0
    assert again.is_error is True
    assert (outcome(again)["code"], outcome(again)["approval_id"]) == (
        "mismatch",
        outcome(waiting)["approval_id"],
    )
    [refused] = [e for e in store.events(kind="refused") if e.tool == "files__truncate"]
    assert json.loads(refused.detail_json)["code"] == "mismatch"
    assert store.get_approval(outcome(waiting)["approval_id"]).status == "pending"  # type: ignore[union-attr]


def test_a_refused_path_over_mcp_answers_its_code_for_programs(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """`PathRefused.code` says why for programs (`escapes`), its `reason` for people; the MCP
    result's `_meta` code (for programs) was the sentence, as was a ConfirmFailed's."""
    table = EffectTable(file_tools(tmp_path, approver_role="ops"))
    table.allow_all("coder")
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    server = gated_server(gate, identity=Identity(user_id="u1", session_id="s1", agent_id="coder"))

    async def scenario() -> types.CallToolResult:
        async with (
            InMemoryTransport(server, raise_exceptions=True) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool("read_file", {"path": "../secret.txt"})

    try:
        refused = run(scenario)
    finally:
        gate.close()
    assert refused.is_error is True
    assert outcome(refused) == {"status": "error", "code": "escapes"}
    assert "escapes the work directory" in text(refused)


def test_a_served_call_that_ran_approved_does_not_run_again_once_its_row_is_a_write(
    store: SQLStore, clock: FakeClock
) -> None:
    """`effectgate mcp serve`, the same way: a send approved and run, then the application's table
    makes the row a write (a restart with another table); the client's re-issue of the same call
    gets its stored result (the README's promise for MCP calls) rather than a second send."""
    recorder = EffectRecorder()

    def notify(to: str) -> str:
        """Tell someone."""
        return f"told {to}"

    keyring = Keyring.generate()
    who = Identity(user_id="u1", session_id="s1", agent_id="coder")

    def served(effect: Effect, grants: Grants) -> tuple[EffectGate, Server[Any]]:
        row = ToolSpec(name="notify", effect=effect, fn=recorder.wrap("notify", notify), approver_role="ops")
        table = EffectTable([row])
        table.allow_all("coder")
        gate = EffectGate(table, store, keyring=keyring, clock=clock)
        return gate, gated_server(gate, identity=who, grants=grants)

    async def call(server: Server[Any]) -> types.CallToolResult:
        async with (
            InMemoryTransport(server, raise_exceptions=True) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool("notify", {"to": "ada"})

    grants = Grants()
    sending, server = served(Effect.SEND, grants)
    try:
        waiting = run(lambda: call(server))
        grant = sending.approve(outcome(waiting)["approval_id"], version=1, approver=Approver("olga", "ops"))
        assert isinstance(grant, Grant)
        grants.deliver(grant)
        ran = run(lambda: call(server))
    finally:
        sending.close()
    writing, server = served(Effect.WRITE, Grants())
    try:
        again = run(lambda: call(server))
    finally:
        writing.close()
    assert outcome(ran)["status"] == "executed"
    assert len(recorder.effects) == 1
    assert (outcome(again)["status"], outcome(again)["replay"]) == ("executed", True)
    assert text(again) == text(ran) == "told ada"


def _stat_claiming(rig: Rig, *, destructive: bool) -> None:
    """stat relisted by its upstream, claiming destructiveHint (the read row raised) or not."""
    server: MCPServer = rig.upstream
    server.remove_tool("stat")
    hints = ToolAnnotations(read_only_hint=not destructive, destructive_hint=destructive)

    def stat(path: str, ctx: Context) -> str:
        """Size of a file."""
        rig.effects.append(Done("stat", {"path": path}, _key(ctx)))
        return f"{path}: 12 bytes"

    server.add_tool(stat, annotations=hints)


def test_a_waiting_read_does_not_run_once_the_hint_that_raised_it_is_dropped(
    store: SQLStore, clock: FakeClock
) -> None:
    """stat's row says read; its upstream then claims destructiveHint, so a call waits for
    approval. The upstream drops the claim again (the row is a read) and the client re-issues the
    call: reads look for no approval in the gate (they touch no table as they run), so the proxy
    does (`mcp._prior`): refused as changed since its proposal, and nothing reaches the upstream."""

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, Rig]:
        async with proxied(store, Keyring.generate(), clock) as rig:
            _stat_claiming(rig, destructive=True)
            waiting = await rig.call("stat", PATH)
            _stat_claiming(rig, destructive=False)
            return waiting, await rig.call("stat", PATH), rig

    waiting, again, rig = run(scenario)
    assert outcome(waiting)["status"] == "awaiting_approval"
    assert rig.count("stat") == 0
    assert (outcome(again)["code"], outcome(again)["approval_id"]) == (
        "mismatch",
        outcome(waiting)["approval_id"],
    )
