"""The proxy with real processes, on SQLite and PostgreSQL: upstreams started as subprocesses (stdio
and streamable HTTP on 127.0.0.1), and `effectgate mcp proxy` itself as the child process an MCP
client starts, its upstream a child of its own. Effects are counted in the upstreams' log files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from effectgate import Approver, Grant, Keyring, open_store
from effectgate.effects import Effect
from effectgate.mcp._common import Identity
from effectgate.mcp._config import ENV_CONFIG, Http, Row, Stdio, Upstream
from effectgate.mcp._proxy import GRANT_META, GatedProxy
from effectgate.mcp._upstream import proxy_app

from .._helpers import ROOT
from ._serving import free_port, listening, outcome, run, text

UPSTREAM = str(Path(__file__).with_name("upstream_server.py"))
SUPPORT = Approver("sam", "support")
MAIL = {"to": "ada@example.com", "body": "hello"}
ROWS = {
    "stat": Row(effect=Effect.READ),
    "delete": Row(effect=Effect.DESTRUCTIVE, approver_role="ops"),
    "send_mail": Row(effect=Effect.SEND, approver_role="support"),
}


def effects(log: Path, tool: str) -> list[dict[str, Any]]:
    """The effects an upstream process logged for `tool`."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in lines if e["tool"] == tool]


@pytest.fixture
def http_upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The files server as a subprocess on streamable HTTP (127.0.0.1): its URL and effects log."""
    log, port = tmp_path / "http-effects.jsonl", free_port()
    with (tmp_path / "http-upstream.err").open("w") as errlog:
        proc = subprocess.Popen(
            [sys.executable, UPSTREAM, "http", str(port)],
            env={**os.environ, "EFFECTS_LOG": str(log)},
            stdin=subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
        )
    try:
        listening(proc, port)
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_upstreams_in_subprocesses_over_stdio_and_http(
    store_url: str, tmp_path: Path, http_upstream: tuple[str, Path]
) -> None:
    """Two upstream processes behind one proxy: files over stdio, mail over streamable HTTP. Each
    serves under its prefix; a read runs once at its upstream; a lying read-only hint stays
    destructive; a send waits, and once approved runs exactly once, its key in the upstream's
    log; the re-issue after that gets the stored result."""
    url, http_log = http_upstream
    stdio_log = tmp_path / "stdio-effects.jsonl"
    upstreams = [
        Upstream(
            name="files",
            target=Stdio(
                command=sys.executable, args=(UPSTREAM, "stdio"), env={"EFFECTS_LOG": str(stdio_log)}
            ),
            prefix="files",
            tools=ROWS,
        ),
        Upstream(name="mail", target=Http(url=url), prefix="mail", tools=ROWS),
    ]
    store = open_store(store_url)
    store.setup()
    identity = Identity(user_id="u1", session_id="s-sub", agent_id="desk")
    proxy = GatedProxy(upstreams, store, identity=identity, keyring=Keyring.generate())

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with (
            proxy,
            InMemoryTransport(proxy.server, raise_exceptions=True) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            seen["tools"] = [t.name for t in (await session.list_tools()).tools]
            seen["stat"] = await session.call_tool("files__stat", {"path": "a.txt"})
            seen["delete"] = await session.call_tool("files__delete", {"path": "a.txt"})
            waiting = await session.call_tool("mail__send_mail", MAIL)
            seen["before"] = len(effects(http_log, "send_mail"))
            meta = outcome(waiting)
            grant = proxy.gate.approve(meta["approval_id"], version=meta["version"], approver=SUPPORT)
            assert isinstance(grant, Grant)
            proxy.grants.deliver(grant)
            seen["ran"] = await session.call_tool("mail__send_mail", MAIL)
            seen["again"] = await session.call_tool("mail__send_mail", MAIL)
            seen["approval_id"] = meta["approval_id"]
        return seen

    try:
        seen = run(scenario)
    finally:
        store.close()
    assert seen["tools"] == [f"{p}__{n}" for p in ("files", "mail") for n in ROWS]
    assert text(seen["stat"]) == "a.txt: 12 bytes"
    assert text(seen["delete"]).startswith("NOT EXECUTED: files__delete is awaiting approval by ops")
    assert seen["before"] == 0
    assert (outcome(seen["ran"])["replay"], outcome(seen["again"])["replay"]) == (False, True)
    assert [e["key"] for e in effects(http_log, "send_mail")] == [f"eg_{seen['approval_id']}_v1"]
    assert [e["tool"] for e in effects(stdio_log, "stat") + effects(stdio_log, "delete")] == ["stat"]


def _config(tmp_path: Path, log: Path, *, variant: int) -> Path:
    """The proxy's TOML file: one stdio upstream (the files server, at `variant`)."""
    path = tmp_path / "proxy.toml"
    command = json.dumps([sys.executable, UPSTREAM, "stdio"])
    path.write_text(
        f"""
[identity]
agent = "desk"
user = "u1"
session = "s-cmd"

[servers.files]
command = {command}
env = {{ EFFECTS_LOG = {json.dumps(str(log))}, UPSTREAM_VARIANT = "{variant}" }}

[servers.files.tools.stat]
effect = "read"

[servers.files.tools.send_mail]
effect = "send"
approver_role = "support"
"""
    )
    return path


def _proxy_command(url: str, keyring: Keyring, config: Path) -> StdioServerParameters:
    args = ["-m", "effectgate.cli", "--db", url, "mcp", "proxy", "--config", str(config)]
    env = {"EFFECTGATE_KEYRING": keyring.dumps(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=ROOT)


async def _session_calls(
    params: StdioServerParameters, errlog: Any, *calls: tuple[str, dict[str, Any], dict[str, Any] | None]
) -> list[types.CallToolResult]:
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return [await session.call_tool(name, args, meta=meta) for name, args, meta in calls]  # type: ignore[arg-type]


def test_the_command_over_stdio_runs_an_approved_call_once_and_refuses_a_changed_tool(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`effectgate mcp proxy --config` as the child process of an MCP client, its upstream a
    child of its own. The approver's gate is built the same way (`proxy_app`). A send waits,
    is approved, and the client's re-issue with the grant in `_meta` runs it once; again, the
    stored result. A second send is approved, then the upstream is upgraded (its description
    reworded) and the proxy restarted: the re-issue is refused, nothing is sent, and
    `effectgate audit` reports the approval (exit 1)."""
    keyring = Keyring.generate()
    store = open_store(store_url)
    store.setup()
    store.close()
    log = tmp_path / "effects.jsonl"
    config = _config(tmp_path, log, variant=1)
    monkeypatch.setenv(ENV_CONFIG, str(config))
    bob = {**MAIL, "to": "bob@example.com"}
    with (tmp_path / "proxy.err").open("w") as errlog:
        first = run(
            lambda: _session_calls(
                _proxy_command(store_url, keyring, config),
                errlog,
                ("files__send_mail", MAIL, None),
                ("files__send_mail", bob, None),
            )
        )
        approver_store = open_store(store_url)
        approver = proxy_app(approver_store, keyring=keyring)
        try:
            grants = [approver.approve(outcome(r)["approval_id"], version=1, approver=SUPPORT) for r in first]
        finally:
            approver.close()
            approver_store.close()
        ada_grant, bob_grant = grants
        assert isinstance(ada_grant, Grant)
        assert isinstance(bob_grant, Grant)
        ran, again = run(
            lambda: _session_calls(
                _proxy_command(store_url, keyring, config),
                errlog,
                ("files__send_mail", MAIL, {GRANT_META: ada_grant.token}),
                ("files__send_mail", MAIL, None),
            )
        )
        _config(tmp_path, log, variant=2)  # the upstream is upgraded: send_mail is reworded
        [refused] = run(
            lambda: _session_calls(
                _proxy_command(store_url, keyring, config),
                errlog,
                ("files__send_mail", bob, {GRANT_META: bob_grant.token}),
            )
        )
    assert [text(r).split(":")[0] for r in first] == ["NOT EXECUTED"] * 2
    assert (outcome(ran)["status"], outcome(again)["replay"]) == ("executed", True)
    assert outcome(refused)["code"] == "mismatch"
    assert [e["args"]["to"] for e in effects(log, "send_mail")] == ["ada@example.com"]
    started = effects(log, "_started")
    assert started
    assert not any(e["args"]["keyring"] for e in started)  # the upstream never saw the keyring
    audited = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "--db", store_url, "audit", "--json"],
        env={**os.environ, "EFFECTGATE_KEYRING": keyring.dumps()},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert audited.returncode == 1, audited.stderr
    findings = json.loads(audited.stdout)["findings"]
    assert [(f["kind"], f["tool"], f["approval_id"]) for f in findings] == [
        ("reclassified", "files__send_mail", bob_grant.approval_id)
    ]


def test_the_command_serves_streamable_http_on_loopback(store_url: str, tmp_path: Path) -> None:
    """`--transport http`: the proxy's tools over streamable HTTP on 127.0.0.1; a read runs at the
    upstream, a send waits and sends nothing."""
    keyring = Keyring.generate()
    store = open_store(store_url)
    store.setup()
    log = tmp_path / "effects.jsonl"
    port = free_port()
    params = _proxy_command(store_url, keyring, _config(tmp_path, log, variant=1))
    with (tmp_path / "proxy.err").open("w") as errlog:
        proc = subprocess.Popen(
            [params.command, *params.args, "--transport", "http", "--port", str(port)],
            env={**os.environ, **(params.env or {})},
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
        )
    try:
        listening(proc, port)

        async def scenario() -> list[Any]:
            async with (
                streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                tools = (await session.list_tools()).tools
                return [
                    tools,
                    await session.call_tool("files__stat", {"path": "a.txt"}),
                    await session.call_tool("files__send_mail", MAIL),
                ]

        tools, stat, waiting = run(scenario)
        assert [t.name for t in tools] == ["files__stat", "files__send_mail"]
        assert text(stat) == "a.txt: 12 bytes"
        assert text(waiting).startswith("NOT EXECUTED")
        assert [e["tool"] for e in effects(log, "stat") + effects(log, "send_mail")] == ["stat"]
        [approval] = store.approvals()
        assert (approval.user_id, approval.session_id, approval.agent_id) == ("u1", "s-cmd", "desk")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        store.close()
