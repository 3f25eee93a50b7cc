"""Round 12 (lead): a tool result the store can write but not read back."""

from __future__ import annotations

from typing import Any

from effectgate import CallContext, Effect, EffectTable, Executed, ToolSpec
from effectgate.stores import SQLStore

from .conftest import MakeGate

CTX = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent")


def test_a_write_whose_result_holds_an_integer_past_the_digit_limit_is_settled(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """Python reads no integer of more than 4300 digits back from JSON text: a write that returned
    one ran, and its record must say so (succeeded, as a result with no JSON form is), not stay
    in flight, answered "running now" and later put to a person as an unknown outcome."""
    runs: list[int] = []

    def grow(n: int) -> dict[str, Any]:
        """Grow a number."""
        runs.append(n)
        return {"value": 10**5000}

    table = EffectTable([ToolSpec(name="grow", effect=Effect.WRITE, fn=grow)])
    table.allow("agent", ["grow"])
    gate = make_gate(table)
    out = gate.call("grow", {"n": 1}, CTX)
    assert isinstance(out, Executed), out
    again = gate.call("grow", {"n": 1}, CTX)  # the same message again: a replay of the stored result
    assert isinstance(again, Executed), again
    assert again.replay
    assert runs == [1]
    [record] = [r for r in store.idempotency_records() if r.key == out.idempotency_key]
    assert record.status == "succeeded"
