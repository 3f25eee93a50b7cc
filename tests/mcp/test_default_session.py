"""The session an MCP process uses when none is configured is one per agent and user
("mcp:AGENT:USER"), for `mcp proxy` and `mcp serve` alike: two agents of one user never share a
request, so neither is handed the other's stored result."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from effectgate import EffectGate, Executed, Keyring
from effectgate.cli._mcp_proxy import _identity
from effectgate.cli._mcp_serve import identity_of
from effectgate.effects import Effect
from effectgate.mcp._common import Identity, context_for
from effectgate.mcp._config import ProxyConfig, Stdio, Upstream
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec

CONFIG = ProxyConfig(servers=(Upstream(name="x", target=Stdio(command="true"), prefix="x"),))


def _proxy(agent: str) -> Identity:
    return _identity(argparse.Namespace(agent=agent, user="u1", session=None), CONFIG)


def _serve(agent: str) -> Identity:
    return identity_of(argparse.Namespace(agent=agent, user="u1", session=None))


@pytest.mark.parametrize("identity", [_proxy, _serve], ids=["mcp proxy", "mcp serve"])
def test_two_agents_of_one_user_get_sessions_of_their_own(
    identity: Callable[[str], Identity], store: SQLStore
) -> None:
    """Agents a and b of user u1, no session configured: sessions mcp:a:u1 and mcp:b:u1, and b's
    write with a's arguments runs for b instead of replaying a's stored result."""
    a, b = identity("a"), identity("b")
    assert (a.session_id, b.session_id) == ("mcp:a:u1", "mcp:b:u1")

    def note(order_id: str, text: str) -> str:
        """Add a note to an order."""
        return f"note for {order_id}: {text}"

    table = EffectTable()
    table.register(ToolSpec(name="note", effect=Effect.WRITE, fn=note))
    table.allow_all("a")
    table.allow_all("b")
    gate = EffectGate(table, store, keyring=Keyring.generate())
    args = {"order_id": "1", "text": "card ends 4242"}
    first = gate.call("note", args, context_for(a, "note", args))
    second = gate.call("note", args, context_for(b, "note", args))
    gate.close()
    assert isinstance(first, Executed)
    assert isinstance(second, Executed)
    assert (first.replay, second.replay) == (False, False)
    assert len(store.executions(tool="note")) == 2


def test_a_configured_session_is_kept() -> None:
    """--session (or the file's, for the proxy) is used as given."""
    args = argparse.Namespace(agent="a", user="u1", session="desk-1")
    assert _identity(args, CONFIG).session_id == identity_of(args).session_id == "desk-1"
