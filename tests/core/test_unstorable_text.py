"""Text no database keeps (a lone surrogate, what JSON's "\\ud800" decodes to; a NUL) given as a
denial reason or an approver's identity, on SQLite and PostgreSQL: a clear refusal that changes
nothing, not the database layer's UnicodeEncodeError (StatementError) out of deny or approve."""

from __future__ import annotations

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Pending, ToolSpec
from effectgate.errors import PolicyViolation

from .conftest import MakeGate


def _pending(make_gate: MakeGate) -> tuple[object, Pending]:
    def pay(ref: str) -> dict[str, bool]:
        """Pay a reference."""
        return {"ok": True}

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow("desk", ["pay"])
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="desk")
    pending = gate.call("pay", {"ref": "r1"}, ctx)
    assert isinstance(pending, Pending)
    return gate, pending


def test_a_denial_reason_with_a_lone_surrogate_is_refused(make_gate: MakeGate) -> None:
    gate, pending = _pending(make_gate)
    with pytest.raises(PolicyViolation, match="lone surrogate"):
        gate.deny(  # type: ignore[attr-defined]
            pending.approval_id, approver=Approver("fiona", "finance"), reason="no \ud800", version=1
        )
    row = gate.store.get_approval(pending.approval_id)  # type: ignore[attr-defined]
    assert row is not None
    assert row.status == "pending"
    assert gate.store.all_decisions() == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("approver_id", ["fi\ud800ona", "fi\x00ona"])
def test_an_approver_whose_id_no_database_keeps_is_refused_when_built(approver_id: str) -> None:
    with pytest.raises(ValueError, match="NUL or a lone surrogate"):
        Approver(approver_id, "finance")
    with pytest.raises(ValueError, match="NUL or a lone surrogate"):
        Approver("fiona", approver_id)
