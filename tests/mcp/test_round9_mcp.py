"""Round 9 of the review of the MCP side (`mcp serve`, `mcp proxy`), on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import mcp.types as types
import pytest
from mcp.server.stdio import stdio_server
from starlette.testclient import TestClient

from effectgate import CallContext, EffectGate, Keyring, Pending, open_store
from effectgate.effects import Effect, Policy
from effectgate.examples.shop import Shop, app, context
from effectgate.mcp._approving import ApprovingGate, current_row
from effectgate.mcp._common import Identity
from effectgate.mcp._config import Http, ProxyConfig, Row, Upstream
from effectgate.mcp._serve import gated_server
from effectgate.mcp._upstream import Connection, spec_for
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec
from effectgate.testing import FakeClock
from effectgate.tokens import keyring_for
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

from ._serving import REFUND, free_port, outcome, run, text
from .test_round7_serve import over_the_wire


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


def test_a_read_whose_result_is_keyed_by_dates_answers_its_result(store: SQLStore, clock: FakeClock) -> None:
    """A read returned totals keyed by day ({date: amount}), as a report tool does. The server
    printed the result with `json.dumps`, which refuses a key that is not text (`default=str`
    reaches values only): every call of the tool ran it and answered an "Internal server error"
    instead of its result. It is answered (date keys written as the store writes them, ISO
    text), the same in its text and its structured form."""
    runs: list[str] = []

    def sales_by_day(month: str) -> dict[Any, Any]:
        runs.append(month)
        return {datetime.date(2026, 1, 1): 120.5, datetime.date(2026, 1, 2): 80}

    table = EffectTable([ToolSpec(name="sales_by_day", effect=Effect.READ, fn=sales_by_day)])
    table.allow_all("a9")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> types.CallToolResult:
        identity = Identity(user_id="u1", session_id="s9", agent_id="a9")
        async with over_the_wire(g, identity) as session:
            return await session.call_tool("sales_by_day", {"month": "2026-01"})

    try:
        result = run(scenario)
    finally:
        g.close()
    assert runs == ["2026-01"]
    assert result.is_error is False, text(result)
    assert outcome(result)["status"] == "executed"
    assert result.structured_content == {"2026-01-01": 120.5, "2026-01-02": 80}
    assert json.loads(text(result)) == result.structured_content


def test_an_approval_whose_upstream_is_down_is_refused_in_the_inbox_not_a_server_error(
    store: SQLStore, clock: FakeClock
) -> None:
    """The inbox runs over the approving side's gate (`--app effectgate.mcp:proxy_app`), which
    re-lists an approval's upstream before approving it. The upstream was down when the reviewer
    pressed Approve: the listing's `UpstreamUnreachable` is no refusal the inbox knows, so the
    reviewer got a bare "Internal Server Error" (a traceback in the server's log) for an ordinary
    outage. It is a refusal naming the upstream; nothing is decided, and the approval waits."""
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nobody listens there
    upstream = Upstream(
        name="mail",
        target=Http(url=url),
        prefix="mail",
        tools={"send": Row(effect=Effect.SEND, approver_role="support")},
    )
    listed = types.Tool(
        name="send", input_schema={"type": "object", "properties": {"to": {"type": "string"}}}
    )
    spec = spec_for(upstream, Connection(upstream), listed, Policy())
    table = EffectTable([spec])
    table.allow_all("desk")
    config = ProxyConfig(servers=(upstream,))
    gate = ApprovingGate(
        table, store, keyring=Keyring.generate(), clock=clock, current_row=current_row(config, Policy())
    )
    registry = ApproverRegistry([RegisteredApprover("sam", "support", hash_secret("sam-pw"))])
    app = create_app(gate, registry, secret_key="test-secret")
    try:
        ctx = CallContext(session_id="s", origin_message_id="m1", user_id="u1", agent_id="desk")
        pending = gate.call("mail__send", {"to": "ada@example.com"}, ctx)
        assert isinstance(pending, Pending)
        with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            csrf = csrf_of(client.get("/login").text)
            client.post("/login", data={"csrf": csrf, "approver": "sam", "secret": "sam-pw"})
            csrf = csrf_of(client.get("/").text)
            answer = client.post(
                f"/approvals/{pending.approval_id}/approve",
                data={"csrf": csrf, "version": 1, "args_hash": pending.card.args_hash},
            )
        assert answer.status_code == 409, answer.text
        assert "upstream 'mail'" in html.unescape(answer.text)
        assert gate.card(pending.approval_id).status == "pending"
        assert store.all_decisions() == []
    finally:
        gate.close()


def test_the_proxy_command_never_mints_a_key_for_a_ledger_that_holds_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite ledger holding an approval was moved without its development key file. `mcp
    proxy` created a new key file beside it at start (the other commands refuse: a new key
    verifies nothing stored), so every stored approval and decision then read as tampered, to
    the proxy and to every later command that found the new file. It exits 2 naming the fix, and
    creates no key file; `mcp serve` already did."""
    from effectgate.cli import main

    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    db = tmp_path / "shop.db"
    url = f"sqlite:///{db}"
    store = open_store(url)
    store.setup()
    gate = app(store, keyring=keyring_for(url), shop=Shop())
    assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    gate.close()
    store.close()
    keys = Path(f"{db}.keys")
    keys.unlink()
    config = tmp_path / "proxy.toml"
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    config.write_text(f'[identity]\nagent = "desk"\nuser = "u1"\n[servers.files]\nurl = "{closed}"\n')
    capsys.readouterr()
    assert main(["--db", url, "mcp", "proxy", "--config", str(config)]) == 2
    assert "EFFECTGATE_KEYRING" in capsys.readouterr().err
    assert not keys.exists()


class Wire:
    """stdin and stdout of `serve_stdio`: the client's lines in, the server's lines out. Input
    ends once the tool call is answered (or the server stops)."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self.lines = [json.dumps(line) + "\n" for line in lines]
        self.out: list[dict[str, Any]] = []
        self.answered = anyio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._read()

    async def _read(self) -> AsyncIterator[str]:
        for line in self.lines:
            yield line
        await self.answered.wait()

    async def write(self, text: str) -> None:
        self.out.append(json.loads(text))
        if self.out[-1].get("id") == 2:
            self.answered.set()

    async def flush(self) -> None:
        return None


def test_a_result_holding_a_lone_surrogate_is_answered_and_the_server_keeps_serving(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read listed a directory with `os.listdir`, which decodes a file name that is not UTF-8
    with surrogateescape (`report-\\udcff.txt`). The server answered with that text as it is,
    which UTF-8 JSON cannot hold: over stdio, the SDK's writer failed to encode the answer and
    the whole server stopped (every later call of every tool was lost). The name is written out
    (as the gate stores such text: `\\udcff`), the answer is sent, and the server goes on."""
    runs: list[str] = []

    def list_reports(folder: str) -> dict[str, Any]:
        runs.append(folder)
        return {"folder": folder, "files": [b"report-\xff.txt".decode("utf-8", "surrogateescape")]}

    table = EffectTable([ToolSpec(name="list_reports", effect=Effect.READ, fn=list_reports)])
    table.allow_all("a9")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    server = gated_server(g, identity=Identity(user_id="u1", session_id="s9", agent_id="a9"))
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    wire = Wire(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "list_reports", "arguments": {"folder": "q1"}},
            },
        ]
    )

    async def scenario() -> None:
        async with stdio_server(cast(Any, wire), cast(Any, wire)) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        run(scenario)
    finally:
        g.close()
    assert runs == ["q1"]
    [answer] = [line for line in wire.out if line.get("id") == 2]
    result = types.CallToolResult.model_validate(answer["result"])
    assert result.is_error is False
    assert result.structured_content == {"folder": "q1", "files": ["report-\\udcff.txt"]}
    assert json.loads(text(result)) == result.structured_content
