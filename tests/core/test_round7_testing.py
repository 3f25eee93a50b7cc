"""Round 7: the public testing helpers (the recorder, the scripted planner, the fake clock) count
and replay what really happened."""

from __future__ import annotations

import asyncio

import pytest

from effectgate import CallContext, Effect, EffectTable, ToolSpec
from effectgate.outcomes import Executed
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

AGENT = "agent"


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def test_a_wrapped_async_tool_is_counted_only_when_it_runs(make_gate: MakeGate, store: SQLStore) -> None:
    """`EffectRecorder.wrap` of an async tool stays async: called through the sync gate while an
    event loop runs (a notebook cell), the gate refuses it before claiming anything, as it does
    the tool itself, and the recorder counts nothing, as nothing ran. Through `acall` it runs and
    is counted once."""
    ran: list[str] = []

    async def send(to: str) -> str:
        """Send a message."""
        ran.append(to)
        return "sent"

    receiver = EffectRecorder()
    table = EffectTable([ToolSpec(name="send", effect=Effect.WRITE, fn=receiver.wrap("send", send))])
    table.allow_all(AGENT)
    gate = make_gate(table)

    async def in_a_cell() -> object:
        return gate.call("send", {"to": "ada"}, ctx())

    with pytest.raises(RuntimeError, match="event loop is running"):
        asyncio.run(in_a_cell())
    assert ran == []
    assert receiver.count("send") == 0
    assert store.idempotency_records() == []

    out = asyncio.run(gate.acall("send", {"to": "ada"}, ctx("m2")))
    assert isinstance(out, Executed), out
    assert ran == ["ada"]
    assert receiver.count("send", to="ada") == 1


def test_a_field_named_kind_can_be_recorded_and_counted(make_gate: MakeGate) -> None:
    """A tool with an argument named `kind` (a ticket's kind): the recorder records the field and
    counts by it like any other, instead of taking it for the effect's kind (TypeError)."""

    def file_ticket(kind: str, title: str) -> str:
        """File a ticket."""
        receiver.record("filed", kind=kind, title=title)
        return "filed"

    receiver = EffectRecorder()
    table = EffectTable(
        [ToolSpec(name="file_ticket", effect=Effect.WRITE, fn=receiver.wrap("file_ticket", file_ticket))]
    )
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("file_ticket", {"kind": "bug", "title": "t"}, ctx())
    assert isinstance(out, Executed), out
    assert receiver.count("file_ticket", kind="bug") == 1
    assert receiver.count("filed", kind="bug", title="t") == 1
    assert receiver.count("filed", kind="feature") == 0
