"""Round 3 of the review of `effectgate mcp serve`, on SQLite and PostgreSQL: a grant that
reached the server but expired before the client re-issued the call runs nothing; the approver's
regrant, delivered the same way, runs the call once, and no result carries either token."""

from __future__ import annotations

import mcp.types as types

from effectgate import EffectGate, Grant
from effectgate.examples.shop import Shop
from effectgate.mcp._common import Grants
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import FINANCE, REFUND, outcome, run
from .test_serve import client, gate, shop

__all__ = ["gate", "shop"]  # the fixtures of test_serve.py


def test_an_expired_grant_runs_nothing_and_the_regrant_runs_once(
    gate: EffectGate, shop: Shop, store: SQLStore, clock: FakeClock
) -> None:
    grants = Grants()
    tokens: list[str] = []

    async def scenario() -> list[types.CallToolResult]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            first = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(first, Grant)
            grants.deliver(first)
            clock.advance(first.expires_at - clock.now() + 1)
            expired = await session.call_tool("refund_order", REFUND)
            assert shop.receiver.count("refund") == 0
            again = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(again, Grant)
            grants.deliver(again)
            tokens.extend([first.token, again.token])
            ran = await session.call_tool("refund_order", REFUND)
            return [expired, ran, await session.call_tool("refund_order", REFUND)]

    expired, ran, replayed = run(scenario)
    assert (outcome(expired)["status"], outcome(expired)["code"]) == ("refused", "expired")
    assert (outcome(ran)["status"], outcome(ran)["replay"]) == ("executed", False)
    assert outcome(replayed)["replay"] is True
    assert shop.receiver.count("refund") == 1
    assert len(store.executions(tool="refund_order")) == 1
    dumped = [r.model_dump_json(by_alias=True) for r in (expired, ran, replayed)]
    assert not any(token in d for token in tokens for d in dumped)
