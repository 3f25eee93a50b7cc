"""`effectgate mcp serve` over a ledger someone edited behind effectgate's back: a waiting call
whose unsealed card columns (subject, notes) were edited into text that is not JSON is still
answered as waiting (its card re-derived from the table row), and runs once after approval; the
client is never handed a raw decoding error (on SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from effectgate import EffectGate, Grant
from effectgate.examples.shop import Shop
from effectgate.mcp._common import Grants
from effectgate.stores import SQLStore

from ._serving import FINANCE, REFUND, outcome, run, text
from .test_serve import client, gate, shop

__all__ = ["gate", "shop"]  # the fixtures of test_serve.py


@pytest.mark.parametrize("column", ["subject_json", "notes_json"])
def test_a_waiting_call_whose_card_columns_were_edited_still_waits_and_runs_once(
    gate: EffectGate, shop: Shop, store: SQLStore, column: str
) -> None:
    grants = Grants()

    async def scenario() -> list[str]:
        async with client(gate, grants=grants) as session:
            meta = outcome(await session.call_tool("refund_order", REFUND))
            with store.transaction() as conn:
                assert store.update_approval(
                    conn, meta["approval_id"], expect_status=["pending"], values={column: "not json"}
                )
            again = await session.call_tool("refund_order", REFUND)
            assert outcome(again)["status"] == "awaiting_approval", text(again)
            decision = gate.approve(meta["approval_id"], version=meta["version"], approver=FINANCE)
            assert isinstance(decision, Grant)
            grants.deliver(decision)
            ran = await session.call_tool("refund_order", REFUND)
            replayed = await session.call_tool("refund_order", REFUND)
            return [outcome(ran)["status"], str(outcome(replayed)["replay"])]

    assert run(scenario) == ["executed", "True"]
    assert shop.receiver.count("refund") == 1
    assert len(store.executions(tool="refund_order")) == 1
