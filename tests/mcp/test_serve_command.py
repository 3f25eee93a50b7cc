"""`effectgate mcp serve` as an MCP client starts it: a child process over stdio, or over
streamable HTTP on 127.0.0.1, on SQLite and PostgreSQL; and the identity it refuses to run without.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from effectgate import Grant, Keyring, open_store
from effectgate.examples.shop import SUPPORT_AGENT, Shop, app
from effectgate.mcp._common import annotations_for

from .._helpers import ROOT
from ._serving import FINANCE, REFUND, free_port, listening, outcome, run, text


def _server_params(url: str, keyring: Keyring, *extra: str) -> StdioServerParameters:
    command = ["-m", "effectgate.cli", "--db", url, "mcp", "serve"]
    command += ["--app", "effectgate.examples.shop:app", "--agent", SUPPORT_AGENT, "--user", "u1", *extra]
    env = {"EFFECTGATE_KEYRING": keyring.dumps(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return StdioServerParameters(command=sys.executable, args=command, env=env, cwd=ROOT)


def test_the_command_serves_the_table_over_stdio(store_url: str, tmp_path: Path) -> None:
    """`effectgate mcp serve` as a child process: hints from the table, a read runs, a refund
    waits and runs nothing; once approved and run by the approver, the re-issue gets the stored
    result, and the execution is recorded once."""
    keyring = Keyring.generate()
    store = open_store(store_url)
    store.setup()
    approver_gate = app(store, keyring=keyring)
    errlog = (tmp_path / "server.err").open("w")

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        params = _server_params(store_url, keyring, "--session", "s-stdio")
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            seen["tools"] = (await session.list_tools()).tools
            seen["read"] = await session.call_tool("get_order", {"order_id": "1042"})
            seen["waiting"] = await session.call_tool("refund_order", REFUND)
            seen["ran_before"] = len(store.executions(tool="refund_order"))
            meta = outcome(seen["waiting"])
            grant = approver_gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            seen["executed"] = approver_gate.execute(grant.token)  # `effectgate serve --execute`
            seen["again"] = await session.call_tool("refund_order", REFUND)
            seen["third"] = await session.call_tool("refund_order", REFUND)
            seen["foreign"] = await session.call_tool("get_order", {"order_id": "2001"})
        return seen

    try:
        seen = run(scenario)
        tools = {t.name: t for t in seen["tools"]}
        assert set(tools) == {s.name for s in approver_gate.table}
        for name, tool in tools.items():
            assert tool.annotations == annotations_for(approver_gate.table[name])
        assert seen["read"].structured_content["order_id"] == "1042"
        assert text(seen["waiting"]).startswith("NOT EXECUTED")
        assert seen["ran_before"] == 0
        for key in ("again", "third"):
            assert outcome(seen[key]) | {"replay": True} == outcome(seen[key])
            assert seen[key].structured_content == seen["executed"].result
        assert outcome(seen["foreign"])["code"] == "out_of_scope"
        assert len(store.executions(tool="refund_order")) == 1
        [approval] = store.approvals()
        assert (approval.session_id, approval.user_id, approval.agent_id) == ("s-stdio", "u1", SUPPORT_AGENT)
    finally:
        errlog.close()
        approver_gate.close()
        store.close()


def test_the_command_serves_streamable_http_on_loopback(store_url: str, tmp_path: Path) -> None:
    """`--transport http`: the same table over streamable HTTP on 127.0.0.1; a refund waits."""
    keyring = Keyring.generate()
    store = open_store(store_url)
    store.setup()
    app(store, keyring=keyring).close()
    port = free_port()
    params = _server_params(store_url, keyring, "--transport", "http", "--port", str(port))
    with (tmp_path / "server.err").open("w") as errlog:
        proc = subprocess.Popen(
            [params.command, *params.args],
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
                return [tools, await session.call_tool("refund_order", REFUND)]

        tools, waiting = run(scenario)
        assert {t.name for t in tools} == set(Shop().table().allowlist(SUPPORT_AGENT))
        assert text(waiting).startswith("NOT EXECUTED")
        assert store.executions(tool="refund_order") == []
        [approval] = store.approvals()
        assert (approval.user_id, approval.session_id) == ("u1", f"mcp:{SUPPORT_AGENT}:u1")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        store.close()


def test_the_command_refuses_a_missing_identity_or_a_public_address(tmp_path: Path) -> None:
    """No --agent or --user is a usage error (identity is configured), and so is HTTP on a
    non-local address: every client would act as the configured user."""
    from effectgate.cli import main

    url = f"sqlite:///{tmp_path}/x.db"
    base = ["--db", url, "mcp", "serve", "--app", "effectgate.examples.shop:app"]
    assert main([*base, "--agent", SUPPORT_AGENT]) == 2
    assert main([*base, "--user", "u1"]) == 2
    assert (
        main([*base, "--agent", SUPPORT_AGENT, "--user", "u1", "--transport", "http", "--host", "0.0.0.0"])
        == 2
    )
    assert main([*base, "--agent", SUPPORT_AGENT, "--user", "u1"]) == 3  # no database at that path


def test_the_command_refuses_a_bad_or_taken_http_port(tmp_path: Path, capsys: Any) -> None:
    """--port outside 1-65535 is a usage error; a port in use is one line and exit 5, both before
    the start-up line and before the database is opened."""
    import socket

    from effectgate.cli import main

    url = f"sqlite:///{tmp_path}/x.db"
    base = ["--db", url, "mcp", "serve", "--app", "effectgate.examples.shop:app", "--agent", SUPPORT_AGENT]
    base += ["--user", "u1", "--transport", "http"]
    assert main([*base, "--port", "99999"]) == 2
    assert "1 to 65535" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*base, "--port", str(port)]) == 5
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "mcp serve:" not in err
    assert len(err.strip().splitlines()) == 1
