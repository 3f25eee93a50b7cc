"""Round 4 of the review of the MCP side (`mcp serve`, `mcp proxy`), on SQLite and PostgreSQL:
the grants a server holds for approved calls awaiting their re-issue (a late, lapsed grant, grants
that can no longer run, a store failure before the claim), and the proxy command's HTTP port and
the session it takes from its configuration file."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Grant, Keyring, open_store
from effectgate.cli._mcp_proxy import _identity
from effectgate.effects import Effect
from effectgate.examples.shop import Shop
from effectgate.mcp._common import Grants, context_for
from effectgate.mcp._config import ProxyConfig, Stdio, Upstream
from effectgate.mcp._proxy import GRANT_META
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec
from effectgate.testing import FakeClock

from ._serving import FINANCE, REFUND, outcome, run
from .test_proxy import MAIL, SUPPORT, Rig, proxied
from .test_serve import client, gate, shop

__all__ = ["gate", "shop"]  # the fixtures of test_serve.py


def test_a_late_delivery_of_a_lapsed_grant_does_not_replace_its_regrant(
    gate: EffectGate, shop: Shop, clock: FakeClock
) -> None:
    """The first grant lapsed before it reached the server; the approver granted again, and that
    grant was delivered. The first one's delivery then arrives late (a retried `on_grant`). It
    held the same approval and version, so it replaced the live regrant: the re-issue presented
    the lapsed token (refused, expired), the live one was gone, and the approved call could not
    run until that grant lapsed too. The later grant must stay; the call runs once."""
    grants = Grants()

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            first = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(first, Grant)
            clock.advance(first.expires_at - clock.now() + 1)
            again = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(again, Grant)
            grants.deliver(again)
            grants.deliver(first)  # late
            return [await session.call_tool("refund_order", REFUND)]

    [ran] = run(scenario)
    assert shop.receiver.count("refund") == 1
    assert outcome(ran)["status"] == "executed"
    assert len(grants) == 0


def test_grants_that_can_no_longer_run_are_not_held_forever(
    gate: EffectGate, shop: Shop, clock: FakeClock
) -> None:
    """Grants were delivered for a refund the reviewer then denied, and for one the approver ran
    itself (`effectgate serve --execute`): neither is ever taken by a re-issue (a denied or
    executed approval is answered without its grant). They stayed in `Grants` for the life of the
    process, a live token each, however long ago they expired. Once expired they are dropped."""
    grants = Grants()
    other = {**REFUND, "order_id": "1043", "amount": 3500}

    async def scenario() -> None:
        async with client(gate, grants=grants) as session:
            denied = outcome(await session.call_tool("refund_order", REFUND))
            executed = outcome(await session.call_tool("refund_order", other))
            grant = gate.approve(denied["approval_id"], version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            gate.deny(denied["approval_id"], approver=FINANCE, reason="not eligible")
            ran = gate.approve(executed["approval_id"], version=1, approver=FINANCE)
            assert isinstance(ran, Grant)
            grants.deliver(ran)
            gate.execute(ran.token)
            assert outcome(await session.call_tool("refund_order", REFUND))["code"] == "denied"
            assert outcome(await session.call_tool("refund_order", other))["replay"] is True
            clock.advance(max(grant.expires_at, ran.expires_at) - clock.now() + 1)
            await session.call_tool("get_order", {"order_id": "1042"})

    run(scenario)
    assert shop.receiver.count("refund") == 1
    assert len(grants) == 0


def test_the_proxy_drops_a_delivered_grant_the_client_already_spent(
    store: SQLStore, clock: FakeClock
) -> None:
    """The approving side delivered send_mail's grant to the proxy, and the client application sent
    the same token with its re-issue (`_meta`): the call ran once with the sent token, and the
    delivered copy was held for the life of the proxy. Once expired it is dropped."""
    grants = Grants()

    async def scenario() -> Rig:
        async with proxied(store, Keyring.generate(), clock, grants=grants) as rig:
            waiting = await rig.call("send_mail", MAIL)
            grant = rig.approve(waiting, SUPPORT)
            grants.deliver(grant)
            ran = await rig.call("send_mail", MAIL, meta={GRANT_META: grant.token})
            assert outcome(ran)["status"] == "executed"
            clock.advance(grant.expires_at - clock.now() + 1)
            await rig.call("stat", {"path": "a.txt"})
            return rig

    rig = run(scenario)
    assert rig.count("send_mail") == 1
    assert len(grants) == 0


def _proxy_config(tmp_path: Path) -> Path:
    """A proxy configuration whose one upstream is upstream_server.py over stdio."""
    path = tmp_path / "proxy.toml"
    command = json.dumps([sys.executable, str(Path(__file__).with_name("upstream_server.py")), "stdio"])
    log = json.dumps(str(tmp_path / "effects.jsonl"))
    path.write_text(
        f"""
[identity]
agent = "desk"
user = "u1"

[servers.files]
command = {command}
env = {{ EFFECTS_LOG = {log} }}

[servers.files.tools.stat]
effect = "read"
"""
    )
    return path


def test_the_proxy_command_refuses_a_bad_or_taken_http_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`effectgate mcp proxy --transport http` with a port outside 1-65535 ended in exit 70 ("a
    bug") after uvicorn's traceback, and with a port in use in uvicorn's SystemExit inside an
    exception group (a traceback), each after the start-up line had said it was serving. As
    `mcp serve` does: a usage error (2), and one line with exit 5, before the start-up line."""
    from effectgate.cli import main

    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    url = f"sqlite:///{tmp_path}/x.db"
    store = open_store(url)
    store.setup()
    store.close()
    base = ["--db", url, "mcp", "proxy", "--config", str(_proxy_config(tmp_path)), "--transport", "http"]
    assert main([*base, "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "1 to 65535" in err
    assert len(err.strip().splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*base, "--port", str(port)]) == 5
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "mcp proxy:" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_files_session_is_not_handed_to_a_user_or_agent_it_does_not_name(store: SQLStore) -> None:
    """The file's [identity] names agent desk, user u-42 and session desk-u-42 (as the config's
    documented example does). Another user runs the proxy with the same file and their own user
    (--user, or $EFFECTGATE_MCP_USER): the file's session was kept, so their calls were made in
    u-42's session, and a write with u-42's arguments replayed u-42's stored result (their own
    write never ran). The file's session is the file's identity's: another user or agent gets
    a session of their own (an explicit --session is still used as given)."""
    config = ProxyConfig(
        servers=(Upstream(name="x", target=Stdio(command="true"), prefix="x"),),
        agent="desk",
        user="u-42",
        session="desk-u-42",
    )
    own = _identity(argparse.Namespace(agent=None, user=None, session=None), config)
    other = _identity(argparse.Namespace(agent=None, user="u-43", session=None), config)
    bot = _identity(argparse.Namespace(agent="bot", user=None, session=None), config)
    given = _identity(argparse.Namespace(agent=None, user="u-43", session="s-43"), config)
    assert own.session_id == "desk-u-42"
    assert given.session_id == "s-43"
    notes: list[str] = []

    def note(order_id: str, text: str) -> str:
        """Add a note to an order."""
        notes.append(text)
        return f"note {len(notes)} for {order_id}"

    table = EffectTable()
    table.register(ToolSpec(name="note", effect=Effect.WRITE, fn=note))
    table.allow_all("desk")
    table.allow_all("bot")
    gate = EffectGate(table, store, keyring=Keyring.generate())
    args = {"order_id": "1", "text": "card ends 4242"}
    try:
        for who in (own, other, bot):
            gate.call("note", args, context_for(who, "note", args))
    finally:
        gate.close()
    assert len(notes) == 3
    assert len(store.executions(tool="note")) == 3
    assert len({own.session_id, other.session_id, bot.session_id}) == 3


def test_a_grant_survives_a_store_failure_before_its_claim(
    gate: EffectGate, shop: Shop, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client re-issued an approved refund and the store failed while the gate was checking
    the grant, before anything was claimed (a dropped connection): nothing ran and the token is
    still good. The server had already taken it out of `Grants`, so every later re-issue answered
    "its grant has not reached this server" and the approved refund could not run until the
    grant lapsed and someone granted it again. The grant is kept; the next re-issue runs once."""
    grants = Grants()
    spent = store.grant_spent
    failures: list[int] = []

    def failing_once(conn: Any, approval_id: str, version: int) -> bool:
        if not failures:
            failures.append(1)
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError("SELECT", None, lost)
        return spent(conn, approval_id, version)

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            grant = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(grant, Grant)
            grants.deliver(grant)
            monkeypatch.setattr(store, "grant_spent", failing_once)
            failed = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            return [failed, await session.call_tool("refund_order", REFUND)]

    failed, ran = run(scenario)
    assert failures == [1]
    assert failed.is_error is True
    assert outcome(ran)["status"] == "executed"
    assert shop.receiver.count("refund") == 1
    assert len(store.executions(tool="refund_order")) == 1
