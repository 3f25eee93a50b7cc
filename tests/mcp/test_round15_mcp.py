"""Round 15 of the review of the MCP side (`mcp proxy`), on SQLite and PostgreSQL. Effects are
counted at the upstream (its own log file: a subprocess upstream)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp.types as types

from effectgate import Approver, Keyring
from effectgate.effects import Effect
from effectgate.mcp._common import Identity
from effectgate.mcp._config import Http, Row, Stdio, Upstream
from effectgate.mcp._proxy import GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import free_port, listening, outcome

IDENTITY = Identity(user_id="u1", session_id="s-round15", agent_id="desk")
FINANCE = Approver("fiona", "finance")

#: A stdio upstream that logs its pid at each start and each call by name; a tool whose name
#: starts with "crash" exits the process in the middle of its call (after its effect).
UPSTREAM = """
import os, anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

LOG = os.environ["R15_LOG"]

def log(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")

log(f"start {os.getpid()}")
SCHEMA = {"type": "object", "properties": {}}
NAMES = ("ping", "note", "pay", "crash_read", "crash_note", "crash_pay")

async def on_list(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name=n, input_schema=SCHEMA) for n in NAMES])

async def on_call(ctx, params):
    log(params.name)
    if params.name.startswith("crash"):
        os._exit(1)
    return types.CallToolResult(content=[types.TextContent(text="ok")])

async def main():
    async with stdio_server() as (read, write):
        server = Server("r15", on_list_tools=on_list, on_call_tool=on_call)
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""

ROWS = {
    "ping": Row(effect=Effect.READ),
    "crash_read": Row(effect=Effect.READ),
    "note": Row(effect=Effect.WRITE),
    "crash_note": Row(effect=Effect.WRITE),
    "pay": Row(effect=Effect.MONEY, approver_role="finance"),
    "crash_pay": Row(effect=Effect.MONEY, approver_role="finance"),
}


def _upstream(tmp_path: Path) -> tuple[Upstream, Path]:
    script, log = tmp_path / "r15.py", tmp_path / "r15.log"
    script.write_text(UPSTREAM)
    upstream = Upstream(
        name="u",
        target=Stdio(command=sys.executable, args=(str(script),), env={"R15_LOG": str(log)}),
        prefix="u",
        tools=ROWS,
        timeout=30.0,
    )
    return upstream, log


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _calls(log: Path) -> list[str]:
    """The calls the upstream ran, in order (its starts left out)."""
    return [line for line in _lines(log) if not line.startswith("start ")]


def _starts(log: Path) -> int:
    return sum(1 for line in _lines(log) if line.startswith("start "))


async def _kill_upstream(log: Path) -> None:
    """Kill the upstream process now running (the last one started) and wait until it is gone
    (reaped, or a zombie): an upstream that exited on its own between two calls."""
    pid = int([line for line in _lines(log) if line.startswith("start ")][-1].split()[1])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it exited and was reaped already: gone, as wanted
        return
    for _ in range(2000):  # a condition polled, bounded: no timing is assumed
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"upstream {pid} did not exit")


def _run(
    upstream: Upstream,
    store: SQLStore,
    clock: FakeClock,
    scenario: Callable[[GatedProxy], Awaitable[Any]],
) -> Any:
    async def main() -> Any:
        proxy = GatedProxy([upstream], store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            return await scenario(proxy)

    return asyncio.run(asyncio.wait_for(main(), 120))


def test_a_read_after_the_upstream_exited_is_answered_by_a_restarted_upstream(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """The upstream process exits between two calls (idle, upgraded, killed). The first call
    after that was answered with an error ("listing its tools failed: Connection closed") and only
    the call after it reached a restarted upstream. A session that is gone is noticed before
    anything is sent on it: the read is answered by the upstream, started again, and runs once."""
    upstream, log = _upstream(tmp_path)

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        first = await proxy.call_tool("u__ping", {})
        await _kill_upstream(log)
        second = await proxy.call_tool("u__ping", {"n": 2})
        third = await proxy.call_tool("u__ping", {"n": 3})
        return [first, second, third]

    results = _run(upstream, store, clock, scenario)
    assert [outcome(r)["status"] for r in results] == ["executed"] * 3
    assert _calls(log) == ["ping", "ping", "ping"]
    assert _starts(log) == 2  # started again once, and that session kept: not a process per call


def test_a_write_after_the_upstream_exited_runs_once_on_a_restarted_upstream(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """A write after the upstream exited is not sent on the dead session (it would be an unknown
    outcome for nothing): the exit is noticed by the listing every call reads first, the upstream
    is started again, and the write runs there exactly once; its re-issue is a replay."""
    upstream, log = _upstream(tmp_path)

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        await proxy.call_tool("u__ping", {})
        await _kill_upstream(log)
        written = await proxy.call_tool("u__note", {})
        replayed = await proxy.call_tool("u__note", {})
        return [written, replayed]

    written, replayed = _run(upstream, store, clock, scenario)
    assert outcome(written)["status"] == "executed"
    assert outcome(replayed)["status"] == "executed"
    assert _calls(log) == ["ping", "note"]


def test_a_read_whose_upstream_exits_during_it_is_not_resent_unchecked(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """A read whose upstream exits while it runs answers an error and is not resent on the
    restarted upstream (a process no listing was read from: it may list the tool as something
    else now); the next call lists the restarted upstream first and runs there."""
    upstream, log = _upstream(tmp_path)

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        crashed = await proxy.call_tool("u__crash_read", {})
        pinged = await proxy.call_tool("u__ping", {})
        return [crashed, pinged]

    crashed, pinged = _run(upstream, store, clock, scenario)
    assert crashed.is_error
    assert outcome(pinged)["status"] == "executed"
    assert _calls(log) == ["crash_read", "ping"]
    assert _starts(log) == 2


def test_a_write_whose_upstream_exits_during_it_is_never_sent_again(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """A write whose upstream exits while it runs may have happened: needs_reconciliation, and
    neither the call nor its re-issue sends it again (a retry on a fresh session is for reads)."""
    upstream, log = _upstream(tmp_path)

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        crashed = await proxy.call_tool("u__crash_note", {})
        again = await proxy.call_tool("u__crash_note", {})
        pinged = await proxy.call_tool("u__ping", {})
        return [crashed, again, pinged]

    crashed, again, pinged = _run(upstream, store, clock, scenario)
    assert outcome(crashed)["code"] == "needs_reconciliation"
    assert outcome(again)["status"] in ("error", "refused")
    assert outcome(pinged)["status"] == "executed"
    assert _calls(log) == ["crash_note", "ping"]


def test_an_approved_payment_whose_upstream_exits_during_it_runs_once(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """An approved money call whose upstream exits while it runs is an unknown outcome
    (needs_reconciliation): the grant is spent, and re-issuing the call never pays again. A money
    call approved while the upstream was down and restarted runs exactly once."""
    upstream, log = _upstream(tmp_path)

    async def approve_and_run(proxy: GatedProxy, name: str) -> types.CallToolResult:
        waiting = await proxy.call_tool(name, {})
        approval_id = outcome(waiting)["approval_id"]
        version = outcome(waiting)["version"]
        grant = await asyncio.to_thread(proxy.gate.approve, approval_id, version=version, approver=FINANCE)
        proxy.grants.deliver(grant)
        return await proxy.call_tool(name, {})

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        crashed = await approve_and_run(proxy, "u__crash_pay")
        again = await proxy.call_tool("u__crash_pay", {})
        await proxy.call_tool("u__ping", {})
        await _kill_upstream(log)
        paid = await approve_and_run(proxy, "u__pay")
        replayed = await proxy.call_tool("u__pay", {})
        return [crashed, again, paid, replayed]

    crashed, again, paid, replayed = _run(upstream, store, clock, scenario)
    assert outcome(crashed)["code"] == "needs_reconciliation"
    assert outcome(again)["status"] != "executed"
    assert outcome(paid)["status"] == "executed"
    assert outcome(replayed)["status"] == "executed"
    assert _calls(log) == ["crash_pay", "ping", "pay"]


def _http_upstream(tmp_path: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    errlog = (tmp_path / "http-upstream.err").open("a")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("upstream_server.py")), "http", str(port)],
        env={**os.environ, "EFFECTS_LOG": str(log)},
        stdin=subprocess.DEVNULL,
        stdout=errlog,
        stderr=errlog,
    )
    errlog.close()
    listening(proc, port)
    return proc


def test_a_read_after_an_http_upstream_restarted_reaches_it(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """An HTTP upstream restarted between two calls (a deploy) no longer knows the proxy's
    session. A session it refuses as gone is started again: the next read reaches the new
    process, and so does every later call."""
    log, port = tmp_path / "effects.jsonl", free_port()
    upstream = Upstream(
        name="f",
        target=Http(url=f"http://127.0.0.1:{port}/mcp"),
        prefix="f",
        tools={"stat": Row(effect=Effect.READ)},
        default=Row(effect=Effect.WRITE),
        timeout=30.0,
    )
    procs = [_http_upstream(tmp_path, port, log)]

    async def scenario(proxy: GatedProxy) -> list[types.CallToolResult]:
        first = await proxy.call_tool("f__stat", {"path": "a"})
        procs[0].terminate()
        await asyncio.to_thread(procs[0].wait, 30)
        procs.append(await asyncio.to_thread(_http_upstream, tmp_path, port, log))
        second = await proxy.call_tool("f__stat", {"path": "b"})
        third = await proxy.call_tool("f__stat", {"path": "c"})
        return [first, second, third]

    try:
        results = _run(upstream, store, clock, scenario)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    stats = [json.loads(line)["args"]["path"] for line in log.read_text().splitlines() if '"stat"' in line]
    assert [outcome(r)["status"] for r in results] == ["executed"] * 3
    assert stats == ["a", "b", "c"]
