"""Round 10 review of the read and write paths: read records, write records, schema errors,
allowlists and erasure of what reads and writes record."""

from __future__ import annotations

import asyncio
import enum
import json
import multiprocessing
import os
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectGate, EffectTable, Invalid, Keyring, ToolSpec
from effectgate.errors import NeedsReconciliation, OutcomeUnknown, TableError
from effectgate.examples.shop import context
from effectgate.outcomes import Executed, Pending, Refused
from effectgate.redact import redact
from effectgate.stores import SQLStore

from .conftest import MakeGate, ShopGate

AGENT = "agent"


def ctx(message_id: str = "m1", user_id: str = "u1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id=user_id, agent_id=AGENT)


def lookup(item: str) -> dict[str, Any]:
    """Look an item up."""
    return {"item": item}


def read_gate(make_gate: MakeGate) -> EffectGate:
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow_all(AGENT)
    return make_gate(table)


# -- read records at a worker process's exit


def _worker(gate: EffectGate) -> None:  # pragma: no cover - runs in the child
    out = gate.call("lookup", {"item": "tea"}, ctx())
    if not isinstance(out, Executed):
        raise SystemExit(3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_multiprocessing_workers_last_read_is_written_when_it_ends(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """A pre-fork worker (a multiprocessing child, as a pool's) that reads and returns must
    leave its read record: the child ends in `os._exit`, which skips atexit, so the read
    buffered for the background writer (an `interval` not yet over) was lost with the process."""
    gate = read_gate(make_gate)
    gate._reads._interval = 3600  # the writer's next round never comes before the child ends
    child = multiprocessing.get_context("fork").Process(target=_worker, args=(gate,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    gate.flush()  # the parent has nothing buffered: what is stored is the child's
    assert [e.tool for e in store.events(kind="read")] == ["lookup"]


# -- what is hashed and recorded is what runs


class PriceBook:
    """A write tool (flat arguments: the canonical fast path) and its before/after snapshot, which
    the test uses as the point where the call's store work, in the async driver's worker thread,
    lets other coroutines run."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.in_store_work: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.go_on = threading.Event()

    def set_price(self, item: str, price: int) -> dict[str, Any]:
        """Set an item's price."""
        self.received.append({"item": item, "price": price})
        return {"item": item, "price": price}

    def snapshot(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self.loop is not None and self.in_store_work is not None:
            self.loop.call_soon_threadsafe(self.in_store_work.set)
            self.go_on.wait(10)
        return {"item": args["item"]}


def test_an_async_write_runs_the_arguments_it_hashed_though_the_caller_changes_its_dict(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`acall` does the call's store work (claim, snapshot) in a worker thread while the event loop
    runs other coroutines. With flat arguments (the fast path that takes the caller's dict as it
    is), the tool then received the caller's dict as it stood when the tool started: a coroutine
    that changed it meanwhile (an adapter reusing its parsed arguments) made the write run with a
    price the execution record, its args hash and its idempotency key never saw."""
    book = PriceBook()
    table = EffectTable(
        [ToolSpec(name="set_price", effect=Effect.WRITE, fn=book.set_price, snapshot=book.snapshot)]
    )
    table.allow_all(AGENT)
    gate = make_gate(table)
    args: dict[str, Any] = {"item": "tea", "price": 3}

    async def scenario() -> Any:
        book.loop, book.in_store_work = asyncio.get_running_loop(), asyncio.Event()
        task = asyncio.create_task(gate.acall("set_price", args, ctx()))
        await book.in_store_work.wait()  # the call was routed, hashed and claimed
        args["price"] = 3000  # the caller's dict, changed after the call
        book.go_on.set()
        return await task

    out = asyncio.run(scenario())
    assert isinstance(out, Executed)
    [execution] = store.executions()
    assert json.loads(execution.args_json) == {"item": "tea", "price": 3}
    assert book.received == [{"item": "tea", "price": 3}]  # what ran is what was recorded


class Tagger(PriceBook):
    """A write with a list argument (no flat fast path: arguments that are plain JSON as given)."""

    def tag(self, ticket: str, tags: list[str]) -> dict[str, Any]:
        """Tag a ticket."""
        self.received.append({"ticket": ticket, "tags": list(tags)})
        return {"ticket": ticket}

    def snapshot(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self.loop is not None and self.in_store_work is not None:
            self.loop.call_soon_threadsafe(self.in_store_work.set)
            self.go_on.wait(10)
        return {"ticket": args["ticket"]}


def test_an_async_write_with_nested_arguments_runs_what_it_hashed(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The same with a list argument: arguments already plain JSON were kept as the caller's own
    object, nested lists included, so the tool ran with tags the caller appended after the call
    was hashed and recorded."""
    tagger = Tagger()
    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tagger.tag, snapshot=tagger.snapshot)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    args: dict[str, Any] = {"ticket": "t-1", "tags": ["billing"]}

    async def scenario() -> Any:
        tagger.loop, tagger.in_store_work = asyncio.get_running_loop(), asyncio.Event()
        task = asyncio.create_task(gate.acall("tag", args, ctx()))
        await tagger.in_store_work.wait()
        args["tags"].append("refund-approved")  # the caller's list, changed after the call
        args["ticket"] = "t-2"
        tagger.go_on.set()
        return await task

    assert isinstance(asyncio.run(scenario()), Executed)
    [execution] = store.executions()
    assert json.loads(execution.args_json) == {"ticket": "t-1", "tags": ["billing"]}
    assert tagger.received == [{"ticket": "t-1", "tags": ["billing"]}]


# -- a step's calls named by a str subclass (an enum of tool names)


class ShopTool(enum.StrEnum):
    REFUND = "refund_order"


REFUND = {"order_id": "1042", "amount": 100, "currency": "GBP"}


def test_a_step_call_named_by_a_str_enum_is_routed_not_a_key_error(shop_gate: ShopGate) -> None:
    """A tool name given as a `StrEnum` member names its row (`call` routes it): in `call_step`
    the count of a gated tool's calls skipped it (only exact `str` names were counted), so the
    step raised a bare KeyError instead of proposing the call."""
    _, gate = shop_gate
    [out] = gate.call_step([(ShopTool.REFUND, REFUND)], context("m1"))
    assert isinstance(out, Pending)


def test_two_calls_of_a_gated_tool_in_a_step_register_neither_whatever_str_names_them(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Two calls of one gated tool in a step register neither (`parallel_calls`): one named by a
    `StrEnum` member was not counted, so the pair counted as one call and both were registered
    (the second amending the first), the rule bypassed."""
    _, gate = shop_gate
    outs = gate.call_step(
        [(ShopTool.REFUND, REFUND), ("refund_order", {**REFUND, "amount": 200})], context("m1")
    )
    assert [o.code for o in outs if isinstance(o, Refused)] == ["parallel_calls", "parallel_calls"]
    assert store.approvals() == []


# -- schema errors: what the full validator says


#: A price in cents' steps, beside an argument only the full validator checks (`prefixItems`, as
#: pydantic writes for a `tuple[...]`): the full validator alone decides these calls.
PRICED = {
    "type": "object",
    "properties": {
        "item": {"type": "string"},
        "price": {"type": "number", "multipleOf": 0.01},
        "size": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}]},
    },
    "required": ["item", "price"],
    "additionalProperties": False,
}


class Prices:
    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    def set_price(self, item: str, price: float, size: list[int] | None = None) -> dict[str, Any]:
        """Set an item's price."""
        self.received.append({"item": item, "price": price})
        return {"item": item, "price": price}


@pytest.mark.parametrize("price", [19.99, 0.07, 1234.56])
def test_a_decimal_multiple_is_valid_whichever_validator_decides(
    make_gate: MakeGate, store: SQLStore, price: float
) -> None:
    """19.99 is a multiple of 0.01 as JSON writes numbers (and as the fast validator reads them):
    the full validator divided binary floats (19.99 / 0.01 = 1998.9999999999998), so a row it
    alone validates refused most prices, telling the model a valid price is "not a multiple of
    0.01", and the write never ran."""
    book = Prices()
    table = EffectTable([ToolSpec(name="set_price", effect=Effect.WRITE, fn=book.set_price, schema=PRICED)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("set_price", {"item": "tea", "price": price}, ctx())
    assert isinstance(out, Executed)
    assert book.received == [{"item": "tea", "price": price}]


def test_a_price_between_steps_is_still_invalid_at_its_pointer(make_gate: MakeGate, store: SQLStore) -> None:
    """The exact check still refuses what is not a multiple (19.995 of 0.01), at /price."""
    book = Prices()
    table = EffectTable([ToolSpec(name="set_price", effect=Effect.WRITE, fn=book.set_price, schema=PRICED)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("set_price", {"item": "tea", "price": 19.995}, ctx())
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/price"]
    assert book.received == []
    assert store.executions() == []


# -- erasure of what a write recorded

PII = "ada@example.com"


def test_a_subject_erasure_reaches_the_refusals_of_its_write(make_gate: MakeGate, store: SQLStore) -> None:
    """A write whose outcome is unknown, called again, is refused (`needs_reconciliation`) with the
    reason, the tool's error, which quotes the arguments. That refusal named no args hash, so a
    redaction of the write's subject (`redact(subject=...)`, which finds a write's records by its
    tool, args hash, session and message) erased the write and left the refusal's copy of the
    personal text."""
    calls: list[dict[str, Any]] = []

    def send_note(order_id: str, note: str) -> dict[str, Any]:
        """Attach a note to an order."""
        calls.append({"order_id": order_id, "note": note})
        raise OutcomeUnknown(f"no reply for the note {note!r}")

    table = EffectTable([ToolSpec(name="send_note", effect=Effect.WRITE, fn=send_note)])
    table.allow_all(AGENT)
    keyring = Keyring.generate()
    gate = make_gate(table, keyring=keyring)
    args = {"order_id": "o1", "note": PII}
    with pytest.raises(NeedsReconciliation):
        gate.call("send_note", args, ctx())
    refused = gate.call("send_note", args, ctx())  # the same write again: refused, with the reason
    assert isinstance(refused, Refused)
    assert refused.code == "needs_reconciliation"
    [execution] = store.executions()
    gate.settle(execution.idempotency_key, happened=False, by="ops")  # closed: it may be erased
    redact(store, keyring, user_id="u1", subject={"order_id": "o1"}, by="dpo", reason="request 7")
    assert len(calls) == 1
    left = [e.kind for e in store.events() if PII in e.detail_json]
    assert left == []
    assert all(PII not in (x.args_json + (x.error or "")) for x in store.executions())


# -- a row's snapshot


async def _async_snapshot(args: Mapping[str, Any]) -> dict[str, Any]:
    return {"item": args["item"]}


@pytest.mark.parametrize("snapshot", [_async_snapshot, "the price list"], ids=["async", "not-callable"])
def test_a_snapshot_the_gate_cannot_take_is_refused_when_the_row_is_built(snapshot: Any) -> None:
    """The gate calls a row's `snapshot` before and after the tool, synchronously: an async one
    returned a coroutine (never awaited) that has no JSON form, so every call of the row failed as
    "snapshot failed: PydanticSerializationError ..." (raised raw to the caller; a gated call's
    approval spent and ended failed). A snapshot it cannot call is the table's error, named
    when the row is built, like a read that requires a ToolContext."""
    with pytest.raises(TableError) as raised:
        ToolSpec(name="set_price", effect=Effect.WRITE, fn=PriceBook().set_price, snapshot=snapshot)
    assert raised.value.field == "snapshot"


# -- a row whose function the gate cannot call by name


def _pay_positionally(order_id: str, /) -> dict[str, Any]:
    """Pay an order."""
    return {"order_id": order_id}


def _note_with_a_positional_default(order_id: str, note: str = "", /) -> dict[str, Any]:
    """Note an order."""
    return {"order_id": order_id, "note": note}


@pytest.mark.parametrize("schema", [None, {"type": "object", "properties": {"order_id": {"type": "string"}}}])
def test_a_function_with_positional_only_parameters_is_refused_when_the_row_is_built(
    schema: dict[str, Any] | None,
) -> None:
    """The gate calls a tool as `fn(**arguments)`: a positional-only parameter (`def f(x, /)`,
    as many builtins and C functions have) made every call fail with a TypeError, which for a
    write is a failure on every call, and for a gated row comes after the approval, as an unknown
    outcome (`needs_reconciliation`, the approver role notified) for a call that never started.
    Such a row is the table's error, named when it is built."""
    with pytest.raises(TableError) as raised:
        ToolSpec(
            name="pay", effect=Effect.MONEY, fn=_pay_positionally, approver_role="finance", schema=schema
        )
    assert raised.value.field == "fn"
    with pytest.raises(TableError):  # a defaulted one the schema names: the model may pass it
        ToolSpec(name="note", effect=Effect.WRITE, fn=_note_with_a_positional_default)


def _note_quietly(verbose: bool = False, /, *, order_id: str) -> dict[str, Any]:
    """Note an order."""
    return {"order_id": order_id, "verbose": verbose}


def test_a_defaulted_positional_only_parameter_the_schema_leaves_out_is_accepted() -> None:
    """One the gate never passes (not in the row's schema) keeps its default: the row is fine."""
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
    spec = ToolSpec(name="note", effect=Effect.WRITE, fn=_note_quietly, schema=schema)
    assert spec.name == "note"
