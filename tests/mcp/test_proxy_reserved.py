"""Through the MCP proxy, on SQLite and PostgreSQL: an upstream's schema admits extra keys, so a
model can write a "$redacted" argument. The call is Invalid at /$redacted before anything is
stored or reaches the upstream, and the audit stays clean."""

from __future__ import annotations

import json

import mcp.types as types

from effectgate import Keyring
from effectgate.audit import audit
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run, text
from .test_proxy import MAIL, Rig, proxied


def test_a_reserved_key_is_invalid_and_never_reaches_the_upstream(store: SQLStore, clock: FakeClock) -> None:
    """send_mail with {"$redacted": ...} beside its arguments: Invalid at /$redacted (the model is
    told the key is reserved), recorded as invalid, no approval, no effect."""
    keyring = Keyring.generate()

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(store, keyring, clock) as rig:
            return await rig.call("send_mail", {"$redacted": "r-0000", **MAIL}), rig

    result, rig = run(scenario)
    assert result.is_error is True
    assert outcome(result)["status"] == "invalid"
    assert "/$redacted" in text(result)
    assert "reserved" in text(result)
    assert rig.effects == []
    assert store.approvals() == []
    assert store.executions() == []
    [event] = store.events(kind="invalid")
    assert json.loads(event.detail_json)["errors"][0]["pointer"] == "/$redacted"
    assert MAIL["to"] not in event.detail_json
    assert audit(store, keyring=keyring).clean
