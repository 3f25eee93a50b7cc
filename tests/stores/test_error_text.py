"""A database error's text never carries the statement's parameters, on SQLite and PostgreSQL.
Such text is printed by the CLI, logged, and recorded (a failed reconciliation's reason): with
the parameters in it, an argument value or a tool's result (args_json, result_json) reached
places where only hashes and codes may go."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate import CallContext, Effect, EffectGate, EffectTable, Keyring, Pending, ToolSpec
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

SECRET = "4111-1111-1111-1111"


def test_a_statement_error_does_not_quote_its_parameters(store: SQLStore, clock: FakeClock) -> None:
    def pay(card: str) -> dict[str, bool]:
        """Charge a card."""
        return {"ok": True}

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow("desk", ["pay"])
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="desk")
    pending = gate.call("pay", {"card": SECRET}, ctx)
    assert isinstance(pending, Pending)
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert SECRET in row.args_json
    with pytest.raises(sa.exc.IntegrityError) as caught, store.transaction() as conn:
        store.insert_approval(conn, row)  # the same id again
    assert SECRET not in str(caught.value)
    gate.close()
