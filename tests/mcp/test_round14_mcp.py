"""Round 14 of the review of the MCP side (`mcp proxy`), on SQLite and PostgreSQL. Effects are
counted at the upstream (its own log file, for a subprocess upstream)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import mcp.types as types
import pytest

from effectgate import Keyring
from effectgate.effects import Effect
from effectgate.mcp._common import Identity
from effectgate.mcp._config import ProxyConfigError, Row, Stdio, Upstream, load_config
from effectgate.mcp._proxy import GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome

IDENTITY = Identity(user_id="u1", session_id="s-round14", agent_id="desk")

#: A stdio upstream that logs each start and each call; `crash` exits the process mid-call.
CRASHY = """
import os, anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

LOG = os.environ["CRASHY_LOG"]

def log(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")

log("start")
SCHEMA = {"type": "object", "properties": {}}

async def on_list(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name=n, input_schema=SCHEMA) for n in ("ping", "crash")])

async def on_call(ctx, params):
    log(params.name)
    if params.name == "crash":
        os._exit(1)
    return types.CallToolResult(content=[types.TextContent(text="pong")])

async def main():
    async with stdio_server() as (read, write):
        server = Server("crashy", on_list_tools=on_list, on_call_tool=on_call)
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""


def test_an_upstream_that_exited_is_started_again_for_the_next_call(
    store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """The upstream process exits in the middle of a write (`crash`): that write's outcome is
    unknown (needs_reconciliation, never run again). The proxy kept the dead session as its
    upstream's for good: every later call, of any tool, answered "listing its tools failed:
    Connection closed" until the proxy itself was restarted. A session that closed is not used
    again: the next call reaches the upstream (started again), and the crashed write still never
    runs a second time."""
    script, log = tmp_path / "crashy.py", tmp_path / "crashy.log"
    script.write_text(CRASHY)
    upstream = Upstream(
        name="c",
        target=Stdio(command=sys.executable, args=(str(script),), env={"CRASHY_LOG": str(log)}),
        prefix="c",
        tools={"ping": Row(effect=Effect.READ), "crash": Row(effect=Effect.WRITE)},
        timeout=30.0,
    )

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, types.CallToolResult]:
        proxy = GatedProxy([upstream], store, identity=IDENTITY, keyring=Keyring.generate(), clock=clock)
        async with proxy:
            crashed = await proxy.call_tool("c__crash", {})
            pinged = await proxy.call_tool("c__ping", {})
            again = await proxy.call_tool("c__crash", {})
            return crashed, pinged, again

    crashed, pinged, again = asyncio.run(asyncio.wait_for(scenario(), 120))
    calls = [line for line in log.read_text().splitlines() if line != "start"]
    assert calls == ["crash", "ping"]
    assert outcome(crashed)["code"] == "needs_reconciliation"
    assert outcome(pinged)["status"] == "executed"
    assert outcome(again)["status"] in ("error", "refused")


def test_a_configuration_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A configuration file with a byte that is not UTF-8 (saved in Latin-1: a path with an
    accent) raised the decoder's UnicodeDecodeError, a message naming neither the file nor the
    problem ("'utf-8' codec can't decode byte 0xe9 in position 40"). It is a
    `ProxyConfigError` naming the file, as a file that is not TOML is."""
    path = tmp_path / "proxy.toml"
    path.write_bytes(b'[servers.files]\ncommand = ["python", "/srv/caf\xe9.py"]\n')
    with pytest.raises(ProxyConfigError, match=r"proxy\.toml"):
        load_config(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("user_id", "u\x001"), ("agent_id", "desk\x00"), ("session_id", "s" * 3000)],
)
def test_an_identity_no_call_can_be_made_under_is_refused_when_configured(field: str, value: str) -> None:
    """The identity comes from the configuration (`[identity]`, flags, environment). One holding
    a NUL character (`user = "u\\u00001"` in TOML), or a session longer than an approval's index
    holds, was accepted: the proxy started and listed its tools, and then every call failed (a
    JSON-RPC internal error for the NUL, "session_id is longer than 2048 bytes" for each gated
    call). It is refused when the identity is made, naming the field, before anything serves."""
    identity = {"user_id": "u1", "session_id": "s-round14", "agent_id": "desk", field: value}
    with pytest.raises(ValueError, match=field):
        Identity(**identity)
