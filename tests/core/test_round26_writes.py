"""Round 26: the write and read paths of the core."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import types
import weakref
from typing import Any

import pytest

from effectgate import (
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Invalid,
    Keyring,
    ToolSpec,
    _readlog,
)
from effectgate.canonical import args_hash
from effectgate.errors import TableError
from effectgate.rows import NativeTool, spec_of, write
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate

AGENT = "agent"
GUARD = 10.0


def _ctx(message: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message, user_id="u1", agent_id=AGENT)


def test_write_runs_the_arguments_it_recorded_while_the_caller_changes_its_dict(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """An acall runs its store work in a worker thread; the caller's other task changing the dict
    it passed (nested, non-scalar arguments: the full path) meanwhile must not change what runs."""
    receiver = EffectRecorder()

    def tag(ticket_id: str, tags: list[str]) -> dict[str, Any]:
        """Tag a ticket."""
        receiver.record("tag", ticket_id=ticket_id, tags=list(tags))
        return {"ok": True}

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    claimed, changed = threading.Event(), threading.Event()
    claim = store.claim

    def claim_then_wait(*a: Any, **k: Any) -> Any:
        out = claim(*a, **k)
        claimed.set()
        assert changed.wait(GUARD)
        return out

    store.claim = claim_then_wait  # type: ignore[method-assign]
    args: dict[str, Any] = {"ticket_id": "t-1", "tags": ["urgent"]}

    async def main() -> Any:
        task = asyncio.create_task(gate.acall("tag", args, _ctx()))
        assert await asyncio.to_thread(claimed.wait, GUARD)
        args["tags"].append("refund-approved")
        args["ticket_id"] = "t-2"
        changed.set()
        return await task

    out = asyncio.run(main())
    assert isinstance(out, Executed), out
    [execution] = store.executions()
    assert json.loads(execution.args_json) == {"ticket_id": "t-1", "tags": ["urgent"]}
    assert execution.args_hash == args_hash("tag", {"ticket_id": "t-1", "tags": ["urgent"]})
    assert [e.payload for e in receiver.effects] == [{"ticket_id": "t-1", "tags": ["urgent"]}]


def test_a_read_after_the_exit_hook_is_written(make_gate: MakeGate, store: SQLStore) -> None:
    """The exit hook closes every read log and no writer starts after it: a read made later (an
    atexit hook registered before effectgate's, a daemon thread) was buffered and lost, unlogged.
    Now it is written as it is made."""
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lambda item: item)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    gate.call("lookup", {"item": "tea"}, _ctx("early"))
    _readlog._close_at_exit(weakref.ref(gate._reads))  # this log's part of `_close_all`
    assert [e.origin_message_id for e in store.events(kind="read")] == ["early"]
    gate.call("lookup", {"item": "tea"}, _ctx("late"))  # no flush, no close: written already
    assert [e.origin_message_id for e in store.events(kind="read")] == ["early", "late"]


def test_a_read_made_while_the_interpreter_joins_threads_is_written(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The shutdown hook (`threading._shutdown`, which a multiprocessing child runs before its
    `os._exit`, skipping atexit) flushed each log and left its writer running: a read that a
    thread still being joined made afterwards waited for a writer the child's `os._exit` then
    ended, and was lost. Now the hook closes the log and later reads are written as made."""
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lambda item: item)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    gate._reads._interval = 3600  # a writer an hour away: only the exit path writes
    gate.call("lookup", {"item": "tea"}, _ctx("early"))
    _readlog._flush_at_exit(weakref.ref(gate._reads))  # this log's part of `_flush_all`
    gate.call("lookup", {"item": "tea"}, _ctx("late"))  # a thread the interpreter is joining
    assert [e.origin_message_id for e in store.events(kind="read")] == ["early", "late"]


def test_deeply_nested_write_arguments_are_invalid(make_gate: MakeGate, store: SQLStore) -> None:
    """A write's arguments are copied before they are checked: nesting far past the limit is still
    `Invalid` (a JSON pointer), never a RecursionError, and nothing runs or is claimed."""
    receiver = EffectRecorder()

    def put(doc: dict[str, Any]) -> None:
        """Store a document."""
        receiver.record("put")

    table = EffectTable([ToolSpec(name="put", effect=Effect.WRITE, fn=put)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["a"] = node = {}
    out = gate.call("put", {"doc": deep}, _ctx())
    assert isinstance(out, Invalid), out
    assert receiver.effects == []
    assert store.executions() == []


def test_a_rows_own_schema_is_compared_as_json() -> None:
    """`row_schema` pins the schema a row was reviewed with; Python's `==` took `{"const": 1}` for
    `{"const": true}`, so a tool whose schema differs in a boolean passed the check. 1 and 1.0
    are one JSON number, and still match."""
    tool = NativeTool(
        name="flag",
        description="Set a flag.",
        schema={"type": "object", "properties": {"on": {"const": 1}}},
        fn=lambda on: on,
    )
    pinned = {"type": "object", "properties": {"on": {"const": True}}}
    with pytest.raises(TableError):
        spec_of(tool, write(row_schema=pinned))
    same = {"type": "object", "properties": {"on": {"const": 1.0}}}
    assert spec_of(tool, write(row_schema=same)).name == "flag"


def test_a_write_that_returns_an_iterator_keeps_its_result(make_gate: MakeGate, store: SQLStore) -> None:
    """A result was serialised twice (the execution row's text, then the idempotency record's):
    an iterator (`map`, `iter`) was spent by the first, so the record, the caller and every replay
    got `[]` while the execution row said what ran. One text now serves both."""
    receiver = EffectRecorder()

    def tag(ticket_id: str) -> object:
        """Tag a ticket; returns the tags set."""
        receiver.record("tag", ticket_id=ticket_id)
        return map(str.upper, ["urgent", "vip"])

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    first = gate.call("tag", {"ticket_id": "t-1"}, _ctx())
    again = gate.call("tag", {"ticket_id": "t-1"}, _ctx())
    assert isinstance(first, Executed)
    assert isinstance(again, Executed)
    assert first.result == again.result == ["URGENT", "VIP"]
    assert again.replay
    [execution] = store.executions()
    assert json.loads(execution.result_json or "null") == ["URGENT", "VIP"]
    assert len(receiver.effects) == 1


def test_reads_a_failed_close_kept_outlive_the_gate(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close()` that cannot write keeps the records buffered and raises; the log was held only
    weakly (and by the gate), so a gate dropped after that took its records with it, silently:
    the exit hook never saw them, nor said they were lost. The log is now held until written."""
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lambda item: item)])
    table.allow_all(AGENT)
    gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)  # no fixture holds it
    gate.call("lookup", {"item": "tea"}, _ctx())
    append = store.append_reads

    def down(conn: Any, rows: Any) -> None:
        raise OSError("database unreachable")

    store.append_reads = down  # type: ignore[method-assign]
    quiet = types.SimpleNamespace(warning=lambda *a, **k: None, error=lambda *a, **k: None)
    monkeypatch.setattr(_readlog, "_log", quiet)  # a captured record's traceback would hold the log
    try:
        gate.close()
    except OSError:
        pass  # raised, and dropped as a caller that goes on does
    else:
        pytest.fail("close() wrote nothing and did not say so")
    log = weakref.ref(gate._reads)
    del gate
    gc.collect()
    kept = log()
    assert kept is not None  # still there for the exit hook (`_close_all`)
    store.append_reads = append  # type: ignore[method-assign]
    kept.close()
    assert [e.tool for e in store.events(kind="read")] == ["lookup"]


@pytest.mark.parametrize(("value", "valid"), [("acct-1", True), ("acct\ufeff1", False), ("acct 1", False)])
def test_a_pattern_s_class_is_ecma_white_space(make_gate: MakeGate, value: str, valid: bool) -> None:
    """`\\s` in a pattern is ECMA-262's white space, which holds U+FEFF (Python's does not): an
    account id with a zero-width no-break space passed `^\\S+$` and reached the write."""
    receiver = EffectRecorder()

    def close_account(account: str) -> None:
        """Close an account."""
        receiver.record("close", account=account)

    schema = {
        "type": "object",
        "properties": {"account": {"type": "string", "pattern": "^\\S+$"}},
        "required": ["account"],
        "additionalProperties": False,
    }
    table = EffectTable(
        [ToolSpec(name="close_account", effect=Effect.WRITE, fn=close_account, schema=schema)]
    )
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("close_account", {"account": value}, _ctx())
    assert isinstance(out, Executed if valid else Invalid), out
    assert len(receiver.effects) == (1 if valid else 0)


def test_a_write_that_changes_its_arguments_changes_no_snapshot(make_gate: MakeGate, store: SQLStore) -> None:
    """The after-snapshot was taken with the arguments the tool had run with, the same lists: a
    tool that consumed its list of ids (`ids.pop()`) left the snapshot nothing to look at, and the
    record said the write changed nothing."""
    stock = {"a": 1, "b": 1}

    def clear(ids: list[str]) -> int:
        """Clear items."""
        done = 0
        while ids:
            stock[ids.pop()] = 0
            done += 1
        return done

    def snapshot(args: dict[str, Any]) -> dict[str, int]:
        return {i: stock[i] for i in args["ids"]}

    table = EffectTable([ToolSpec(name="clear", effect=Effect.WRITE, fn=clear, snapshot=snapshot)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("clear", {"ids": ["a", "b"]}, _ctx())
    assert isinstance(out, Executed), out
    assert out.before == {"a": 1, "b": 1}
    assert out.after == {"a": 0, "b": 0}
    [execution] = store.executions()
    assert json.loads(execution.after_json or "null") == {"a": 0, "b": 0}


@pytest.mark.parametrize(("key", "valid"), [("12", True), ("12\n", False), ("\u0661\u0662", False)])
def test_pattern_property_names_match_as_ecma(make_gate: MakeGate, key: str, valid: bool) -> None:
    """A `patternProperties` name is a regex too, and was matched as Python's: beside
    `additionalProperties: false`, "12\\n" matched `^[0-9]+$` (Python's `$` matches before a final
    newline) and Arabic-Indic digits matched `^\\d+$`, so the write ran with a key the schema refuses."""
    receiver = EffectRecorder()

    def restock(counts: dict[str, int]) -> None:
        """Restock items by line number."""
        receiver.record("restock", counts=counts)

    lines = {"type": "object", "patternProperties": {"^[0-9]+$": {"type": "integer"}, "^\\d+$": {}}}
    schema = {
        "type": "object",
        "properties": {"counts": {**lines, "additionalProperties": False}},
        "required": ["counts"],
        "additionalProperties": False,
    }
    table = EffectTable([ToolSpec(name="restock", effect=Effect.WRITE, fn=restock, schema=schema)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("restock", {"counts": {key: 3}}, _ctx())
    assert isinstance(out, Executed if valid else Invalid), out
    assert len(receiver.effects) == (1 if valid else 0)
