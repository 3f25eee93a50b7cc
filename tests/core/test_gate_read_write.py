"""Reads and writes: the autonomous classes run without a person, and leave records behind."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from typing import Any

import pytest

from effectgate import (
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Invalid,
    Keyring,
    Policy,
    Refused,
    ToolSpec,
)
from effectgate.canonical import args_hash, key_of
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import SUMMARY_AGENT, Shop, app, context
from effectgate.outcomes import Executed
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate, ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}
AGENT = "agent"


def detail(event: Any) -> dict[str, Any]:
    return json.loads(event.detail_json)  # type: ignore[no-any-return]


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


class Flaky:
    """A read tool that fails `failures` times with `error`, then answers."""

    def __init__(self, failures: int, error: type[Exception] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def lookup(self, item: str) -> dict[str, Any]:
        """Look an item up."""
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"attempt {self.calls} failed")
        return {"item": item, "stock": 3}


class Writer:
    """Write tools whose failures the tests choose."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.fail_next: list[Exception] = []

    def set_price(self, item: str, price: float) -> dict[str, Any]:
        """Set an item's price."""
        if self.fail_next:
            raise self.fail_next.pop(0)
        self.receiver.record("price", item=item, price=price)
        return {"item": item, "price": price}


def flaky_gate(make_gate: MakeGate, flaky: Flaky, policy: Policy | None = None) -> EffectGate:
    table = EffectTable(
        [ToolSpec(name="lookup", effect=Effect.READ, fn=flaky.lookup, transient=(ConnectionError,))]
    )
    table.allow_all(AGENT)
    return make_gate(table, policy=policy)


def writer_gate(make_gate: MakeGate, writer: Writer) -> EffectGate:
    table = EffectTable([ToolSpec(name="set_price", effect=Effect.WRITE, fn=writer.set_price)])
    table.allow_all(AGENT)
    return make_gate(table)


def write_key(call: CallContext, tool: str, args: dict[str, Any]) -> str:
    """The gate's dedupe key of a write (session, tool, origin message, args hash)."""
    return f"w_{tool}_" + key_of(
        "write", call.session_id, tool, call.origin_message_id, args_hash(tool, args)
    )


# -- reads


def test_read_runs_without_approval(shop_gate: ShopGate, store: SQLStore) -> None:
    """A read returns the tool's result at once and creates no approval."""
    _, gate = shop_gate
    out = gate.call("get_order", {"order_id": "1042"}, context("m1"))
    assert isinstance(out, Executed)
    assert out.result["total"] == 12000
    assert store.approvals() == []


def test_read_is_logged_after_flush(shop_gate: ShopGate, store: SQLStore) -> None:
    """After `flush`, a read is in the log with its tool, args hash and originating message."""
    _, gate = shop_gate
    gate.call("get_order", {"order_id": "1042"}, context("m1"))
    gate.flush()
    [event] = store.events(kind="read")
    assert event.tool == "get_order"
    assert event.effect == "read"
    assert event.args_hash == args_hash("get_order", {"order_id": "1042"})
    assert (event.session_id, event.origin_message_id, event.user_id) == ("s-ada", "m1", "u1")
    assert detail(event)["attempts"] == 1


def test_close_writes_buffered_reads(shop_gate: ShopGate, store: SQLStore) -> None:
    """Closing the gate writes every buffered read record."""
    _, gate = shop_gate
    gate.call("get_order", {"order_id": "1042"}, context("m1"))
    gate.call("get_order", {"order_id": "1043"}, context("m1"))
    gate.close()
    assert sorted(e.args_hash or "" for e in store.events(kind="read")) == sorted(
        [args_hash("get_order", {"order_id": "1042"}), args_hash("get_order", {"order_id": "1043"})]
    )


def test_flush_includes_a_batch_the_background_writer_is_writing(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush() returns only when every read made before it is written, even one in the writer's hands."""
    _, gate = shop_gate
    entered, release = threading.Event(), threading.Event()
    append = store.append_reads

    def slow_append(conn: Any, events: Any) -> None:
        if threading.current_thread().name == "effectgate-readlog":
            entered.set()
            release.wait(timeout=2)  # a slow commit, bounded so that a waiting flush() returns
        append(conn, events)

    monkeypatch.setattr(store, "append_reads", slow_append)
    gate.call("get_order", {"order_id": "1042"}, context("m1"))
    assert entered.wait(timeout=10), "the background writer never picked the read up"
    try:
        gate.flush()
        assert len(store.events(kind="read")) == 1
    finally:
        release.set()


def _lookup_gate(make_gate: MakeGate, **options: Any) -> EffectGate:
    def lookup(item: str) -> str:
        """Look an item up."""
        return item

    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow(AGENT, ["lookup"])
    return make_gate(table, **options)


def test_reads_made_from_many_threads_while_flushing_are_each_written_once(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """Callers append without a lock while the writer takes batches: no record is lost or doubled."""
    gate = _lookup_gate(make_gate, read_log_batch=3)
    done = threading.Event()

    def flusher() -> None:
        while not done.is_set():
            gate.flush()

    def caller(n: int) -> None:
        for i in range(150):
            gate.call("lookup", {"item": f"{n}-{i}"}, ctx())

    flushing = threading.Thread(target=flusher)
    flushing.start()
    callers = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    done.set()
    flushing.join()
    gate.flush()
    hashes = [e.args_hash for e in store.events(kind="read")]
    expected = {args_hash("lookup", {"item": f"{n}-{i}"}) for n in range(4) for i in range(150)}
    assert len(hashes) == 600
    assert set(hashes) == expected


def test_a_flush_of_many_reads_writes_each_once_in_order(make_gate: MakeGate, store: SQLStore) -> None:
    """Reads are written 64 to a statement and the rest one by one: every record, in call order."""
    gate = _lookup_gate(make_gate)
    items = [f"item-{i}" for i in range(2 * 64 + 5)]
    for item in items:
        gate.call("lookup", {"item": item}, ctx())
    gate.flush()
    events = store.events(kind="read")
    assert [e.args_hash for e in events] == [args_hash("lookup", {"item": item}) for item in items]
    assert {(e.tool, e.session_id, e.agent_id) for e in events} == {("lookup", "s1", AGENT)}


def test_a_batch_whose_write_fails_is_written_later_in_its_order(
    make_gate: MakeGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _lookup_gate(make_gate)
    append = store.append_reads
    failures = [OSError("disk full")]

    def failing_once(conn: Any, rows: Any) -> None:
        if failures:
            gate.call("lookup", {"item": "c"}, ctx())  # a read made while the batch is written
            raise failures.pop()
        append(conn, rows)

    monkeypatch.setattr(store, "append_reads", failing_once)
    for item in ("a", "b"):
        gate.call("lookup", {"item": item}, ctx())
    with pytest.raises(OSError, match="disk full"):
        gate.flush()
    assert store.events(kind="read") == []
    gate.flush()
    assert [e.args_hash for e in store.events(kind="read")] == [
        args_hash("lookup", {"item": item}) for item in ("a", "b", "c")
    ]


def test_transient_read_error_is_retried_with_exponential_backoff(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """Two transient failures are retried after 0.05 s and 0.1 s (on the injected clock)."""
    flaky = Flaky(2)
    gate = flaky_gate(make_gate, flaky, Policy(read_retries=3, retry_backoff=0.05))
    out = gate.call("lookup", {"item": "a"}, ctx())
    assert isinstance(out, Executed)
    assert out.result == {"item": "a", "stock": 3}
    assert flaky.calls == 3
    assert clock.slept == [0.05, 0.1]
    gate.flush()
    [event] = store.events(kind="read")
    assert detail(event)["attempts"] == 3


def test_transient_read_error_past_the_retries_is_raised(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """A read that keeps failing is tried 1 + read_retries times, backing off 0.05, 0.1, 0.2 s."""
    flaky = Flaky(10)
    gate = flaky_gate(make_gate, flaky, Policy(read_retries=3, retry_backoff=0.05))
    with pytest.raises(ConnectionError, match="attempt 4 failed"):
        gate.call("lookup", {"item": "a"}, ctx())
    assert flaky.calls == 4
    assert clock.slept == [0.05, 0.1, 0.2]
    gate.flush()
    assert store.events(kind="read") == []
    [failed] = store.events(kind="read_failed")
    assert detail(failed)["attempts"] == 4


def test_read_backoff_follows_the_policy(make_gate: MakeGate, store: SQLStore, clock: FakeClock) -> None:
    """The backoff doubles from Policy.retry_backoff and stops at Policy.read_retries."""
    flaky = Flaky(10)
    gate = flaky_gate(make_gate, flaky, Policy(read_retries=2, retry_backoff=1.5))
    with pytest.raises(ConnectionError):
        gate.call("lookup", {"item": "a"}, ctx())
    assert flaky.calls == 3
    assert clock.slept == [1.5, 3.0]


def test_read_retries_zero_raises_at_the_first_failure(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """With read_retries=0 a transient failure is raised at once, without sleeping."""
    flaky = Flaky(1)
    gate = flaky_gate(make_gate, flaky, Policy(read_retries=0))
    with pytest.raises(ConnectionError):
        gate.call("lookup", {"item": "a"}, ctx())
    assert flaky.calls == 1
    assert clock.slept == []


def test_non_transient_read_error_is_raised_once(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """An error the row does not list as transient is raised on the first attempt, never retried."""
    flaky = Flaky(1, error=KeyError)
    gate = flaky_gate(make_gate, flaky)
    with pytest.raises(KeyError):
        gate.call("lookup", {"item": "a"}, ctx())
    assert flaky.calls == 1
    assert clock.slept == []


# -- refusals before anything runs


def test_unknown_tool_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """A tool that is not a row of the table is refused with unknown_tool and the refusal logged."""
    shop, gate = shop_gate
    out = gate.call("wire_money", {"to": "x"}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "unknown_tool"
    [event] = store.events(kind="refused")
    assert event.tool is None  # the name is model-written: only in the detail, which erasure reaches
    assert (detail(event)["code"], detail(event)["tool_name"]) == ("unknown_tool", "wire_money")
    assert store.approvals() == []
    assert shop.receiver.effects == []


def test_tool_off_the_agents_allowlist_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """The queue summariser may not call refund_order: not_allowed, no approval, nothing ran."""
    shop, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m1", agent_id=SUMMARY_AGENT))
    assert isinstance(out, Refused)
    assert out.code == "not_allowed"
    assert store.approvals() == []
    [event] = store.events(kind="refused")
    assert detail(event)["code"] == "not_allowed"
    assert event.agent_id == SUMMARY_AGENT
    assert shop.receiver.count("refund") == 0


def test_summary_agent_may_call_what_its_allowlist_keeps(shop_gate: ShopGate) -> None:
    """The queue summariser's allowlist still holds get_order, which runs."""
    _, gate = shop_gate
    out = gate.call("get_order", {"order_id": "1042"}, context("m1", agent_id=SUMMARY_AGENT))
    assert isinstance(out, Executed)


def test_agent_without_an_allowlist_may_call_nothing(shop_gate: ShopGate) -> None:
    """Deny by default: an agent the table does not know is refused even a read."""
    _, gate = shop_gate
    out = gate.call("get_order", {"order_id": "1042"}, context("m1", agent_id="stranger"))
    assert isinstance(out, Refused)
    assert out.code == "not_allowed"


def test_out_of_scope_read_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """u1 reading u2's order 2001 is refused out_of_scope and no read is logged."""
    _, gate = shop_gate
    out = gate.call("get_order", {"order_id": "2001"}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    gate.flush()
    assert store.events(kind="read") == []
    assert detail(store.events(kind="refused")[0])["code"] == "out_of_scope"


# -- schema errors: nothing runs, nothing is registered


def assert_nothing_happened(shop_gate: ShopGate, store: SQLStore) -> None:
    assert store.approvals() == []
    assert store.executions() == []
    assert shop_gate.shop.receiver.effects == []


def test_amount_as_string_is_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """A string amount is Invalid at /amount, before any approval exists."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "amount": "12000"}, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/amount"]
    assert_nothing_happened(shop_gate, store)
    [event] = store.events(kind="invalid")
    assert detail(event)["errors"][0]["pointer"] == "/amount"


def test_missing_argument_is_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """A missing currency is Invalid at the root pointer, naming the property."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 12000}, context("m1"))
    assert isinstance(out, Invalid)
    [error] = out.errors
    assert error.pointer == ""
    assert "currency" in error.message
    assert_nothing_happened(shop_gate, store)


def test_extra_argument_is_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """An argument the tool does not take is Invalid; extras are never silently dropped."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "reason": "goodwill"}, context("m1"))
    assert isinstance(out, Invalid)
    [error] = out.errors
    assert error.pointer == ""
    assert "reason" in error.message
    assert_nothing_happened(shop_gate, store)


def test_nested_schema_error_points_at_the_element(shop_gate: ShopGate, store: SQLStore) -> None:
    """A non-string tag is Invalid at /tags/1, and the ticket keeps its tags."""
    shop, gate = shop_gate
    out = gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["ok", 7]}, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/tags/1"]
    assert shop.tickets["t-17"]["tags"] == ["billing"]
    assert_nothing_happened(shop_gate, store)


def test_arguments_that_are_not_an_object_are_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """Arguments given as a list are Invalid at the root."""
    _, gate = shop_gate
    out = gate.call("get_order", ["1042"], context("m1"))  # type: ignore[arg-type]
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == [""]
    assert_nothing_happened(shop_gate, store)


@pytest.mark.parametrize("amount", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_amount_is_invalid(shop_gate: ShopGate, store: SQLStore, amount: float) -> None:
    """NaN and ±Infinity as the refund amount are Invalid at /amount; no approval is created."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "amount": amount}, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/amount"]
    assert_nothing_happened(shop_gate, store)


@pytest.mark.parametrize("amount", [True, 12000.5], ids=["bool", "fraction"])
def test_non_integer_amount_is_invalid(shop_gate: ShopGate, store: SQLStore, amount: object) -> None:
    """A boolean or fractional amount is not an integer amount: Invalid at /amount."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "amount": amount}, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/amount"]
    assert_nothing_happened(shop_gate, store)


def test_integer_beyond_exact_json_range_is_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """An amount of 2**60 (not exactly representable in canonical JSON) is Invalid; nothing registered."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "amount": 2**60}, context("m1"))
    assert isinstance(out, Invalid)
    assert "2**53" in out.message
    assert_nothing_happened(shop_gate, store)


def test_integer_beyond_exact_json_range_points_into_the_arguments(shop_gate: ShopGate) -> None:
    """The Invalid for amount=2**60 points at /amount, a JSON pointer into the arguments."""
    _, gate = shop_gate
    out = gate.call("refund_order", {**REFUND, "amount": 2**60}, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/amount"]


@pytest.mark.parametrize("price", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_number_in_a_float_field_is_invalid(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock, price: float
) -> None:
    """NaN or Infinity in a float-typed argument passes the schema but is still Invalid; nothing runs."""
    writer = Writer()
    gate = writer_gate(make_gate, writer)
    out = gate.call("set_price", {"item": "tea", "price": price}, ctx())
    assert isinstance(out, Invalid)
    assert len(out.errors) == 1
    assert writer.receiver.effects == []
    assert store.executions() == []


def test_non_finite_number_in_a_float_field_points_into_the_arguments(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """The Invalid for price=NaN points at /price."""
    gate = writer_gate(make_gate, Writer())
    out = gate.call("set_price", {"item": "tea", "price": math.nan}, ctx())
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/price"]


LONE_SURROGATE = json.loads('"\\ud800"')  # valid JSON text, but no Unicode scalar value


def test_lone_surrogate_in_a_gated_call_is_invalid(shop_gate: ShopGate, store: SQLStore) -> None:
    """An email subject holding a lone surrogate is Invalid at /subject; no approval is created."""
    _, gate = shop_gate
    args = {"to": ["ada@example.com"], "subject": LONE_SURROGATE, "body": "x"}
    out = gate.call("send_email", args, context("m1"))
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/subject"]
    assert store.approvals() == []


def test_lone_surrogate_in_a_read_is_invalid_and_the_log_keeps_working(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read query with a lone surrogate is Invalid at /query, and later reads are still logged."""
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop())
    try:
        out = gate.call("search_tickets", {"query": LONE_SURROGATE}, context("m1"))
        assert isinstance(out, Invalid)
        assert [e.pointer for e in out.errors] == ["/query"]
        gate.call("get_order", {"order_id": "1042"}, context("m2"))
        gate.flush()
        assert [e.tool for e in store.events(kind="read")] == ["get_order"]
    finally:
        with contextlib.suppress(Exception):  # a broken log must not hide the assertion above
            gate.close()


# -- writes


def test_write_runs_once_and_records_before_and_after(shop_gate: ShopGate, store: SQLStore) -> None:
    """Tagging a ticket runs without approval; the execution row holds the old and new tags."""
    shop, gate = shop_gate
    out = gate.call("update_ticket_tags", TAGS, context("m2"))
    assert isinstance(out, Executed)
    assert not out.replay
    assert (out.before, out.after) == (["billing"], ["billing", "urgent"])
    assert shop.receiver.count("ticket_tags", ticket_id="t-17") == 1
    [row] = store.executions()
    assert row.status == "succeeded"
    assert row.approval_id is None
    assert json.loads(row.before_json or "null") == ["billing"]
    assert json.loads(row.after_json or "null") == ["billing", "urgent"]
    assert row.args_hash == args_hash("update_ticket_tags", TAGS)
    assert row.idempotency_key == out.idempotency_key
    assert store.approvals() == []
    assert len(store.events(kind="write")) == 1


def test_write_replay_returns_the_stored_result(shop_gate: ShopGate, store: SQLStore) -> None:
    """The same message replayed gets replay=True and the stored result; the receiver counts 1."""
    shop, gate = shop_gate
    first = gate.call("update_ticket_tags", TAGS, context("m2"))
    shop.tickets["t-17"]["tags"] = ["changed by a person"]
    again = gate.call("update_ticket_tags", TAGS, context("m2"))
    assert isinstance(first, Executed)
    assert isinstance(again, Executed)
    assert again.replay
    assert again.result == first.result
    assert again.idempotency_key == first.idempotency_key
    assert shop.receiver.count("ticket_tags", ticket_id="t-17") == 1
    assert shop.tickets["t-17"]["tags"] == ["changed by a person"]
    assert len(store.executions()) == 1
    assert len(store.events(kind="replay")) == 1


def test_write_from_a_later_message_runs_again(shop_gate: ShopGate, store: SQLStore) -> None:
    """A new message with the same arguments is a legitimate repeat: it writes again, under a new key."""
    shop, gate = shop_gate
    first = gate.call("update_ticket_tags", TAGS, context("m2"))
    second = gate.call("update_ticket_tags", TAGS, context("m3"))
    assert isinstance(first, Executed)
    assert isinstance(second, Executed)
    assert not second.replay
    assert second.idempotency_key != first.idempotency_key
    assert shop.receiver.count("ticket_tags", ticket_id="t-17") == 2
    assert [r.status for r in store.executions()] == ["succeeded", "succeeded"]


def test_write_in_another_session_is_not_a_replay(shop_gate: ShopGate) -> None:
    """The same message id in another session is a different write."""
    shop, gate = shop_gate
    gate.call("update_ticket_tags", TAGS, context("m2"))
    out = gate.call("update_ticket_tags", TAGS, context("m2", session_id="s-other"))
    assert isinstance(out, Executed)
    assert not out.replay
    assert shop.receiver.count("ticket_tags") == 2


def test_out_of_scope_write_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """u1 tagging u2's ticket t-18 is refused out_of_scope; the ticket is untouched."""
    shop, gate = shop_gate
    out = gate.call("update_ticket_tags", {"ticket_id": "t-18", "tags": ["spam"]}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "out_of_scope"
    assert shop.tickets["t-18"]["tags"] == []
    assert store.executions() == []


def test_failed_write_is_recorded_and_may_run_again(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """A write that raises is recorded failed (not deleted), and the same call may run again."""
    writer = Writer()
    writer.fail_next.append(ValueError("price service refused"))
    gate = writer_gate(make_gate, writer)
    args = {"item": "tea", "price": 2.5}
    with pytest.raises(ValueError, match="price service refused"):
        gate.call("set_price", args, ctx())
    record = store.get(write_key(ctx(), "set_price", args))
    assert record is not None
    assert record.status == "failed"
    assert [r.status for r in store.executions()] == ["failed"]
    out = gate.call("set_price", args, ctx())
    assert isinstance(out, Executed)
    assert not out.replay
    assert writer.receiver.count("price") == 1
    again = store.get(write_key(ctx(), "set_price", args))
    assert again is not None
    assert (again.status, again.attempts) == ("succeeded", 2)


class Snapshotted:
    """A write tool whose before-snapshot fails the first time it is taken."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.snapshot_failures = 1

    def rename(self, item: str, name: str) -> str:
        """Rename an item."""
        self.receiver.record("rename", item=item, name=name)
        return name

    def names(self, args: Any) -> str:
        if self.snapshot_failures:
            self.snapshot_failures -= 1
            raise ConnectionError("snapshot source unavailable")
        return "old"


def test_failed_snapshot_before_a_write_leaves_it_free_to_run(make_gate: MakeGate, store: SQLStore) -> None:
    """A snapshot that fails before the tool runs does not hold the write's key: the retry runs it."""
    tool = Snapshotted()
    table = EffectTable([ToolSpec(name="rename", effect=Effect.WRITE, fn=tool.rename, snapshot=tool.names)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    args = {"item": "tea", "name": "green tea"}
    with pytest.raises(ConnectionError):
        gate.call("rename", args, ctx())
    assert tool.receiver.effects == []
    out = gate.call("rename", args, ctx())
    assert isinstance(out, Executed), out
    assert tool.receiver.count("rename") == 1


def test_write_with_unknown_outcome_needs_reconciliation(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """A write that times out is parked as needs_reconciliation, and a retry is refused, not re-run."""
    writer = Writer()
    writer.fail_next.append(TimeoutError("no reply"))
    gate = writer_gate(make_gate, writer)
    args = {"item": "tea", "price": 2.5}
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("set_price", args, ctx())
    assert raised.value.key == write_key(ctx(), "set_price", args)
    record = store.get(write_key(ctx(), "set_price", args))
    assert record is not None
    assert record.status == "needs_reconciliation"
    out = gate.call("set_price", args, ctx())
    assert isinstance(out, Refused)
    assert out.code == "needs_reconciliation"
    assert writer.receiver.effects == []


def test_write_held_by_a_live_lease_is_refused_in_progress(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """While another worker holds the write's lease, the same call is refused in_progress."""
    writer = Writer()
    gate = writer_gate(make_gate, writer)
    args = {"item": "tea", "price": 2.5}
    store.claim(write_key(ctx(), "set_price", args), args_hash("set_price", args), lease_seconds=60)
    out = gate.call("set_price", args, ctx())
    assert isinstance(out, Refused)
    assert out.code == "in_progress"
    assert writer.receiver.effects == []


def test_write_whose_lease_expired_in_flight_is_not_rerun(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock
) -> None:
    """A write whose worker vanished (lease expired) is refused needs_reconciliation, never re-run."""
    writer = Writer()
    gate = writer_gate(make_gate, writer)
    args = {"item": "tea", "price": 2.5}
    key = write_key(ctx(), "set_price", args)
    store.claim(key, args_hash("set_price", args), lease_seconds=60)
    clock.advance(61)
    out = gate.call("set_price", args, ctx())
    assert isinstance(out, Refused)
    assert out.code == "needs_reconciliation"
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert writer.receiver.effects == []


def test_read_record_hashes_the_arguments_as_they_ran(shop_gate: ShopGate, store: SQLStore) -> None:
    """The read record's args hash is taken at call time: a caller mutating its dict afterwards
    (before the batch is written) does not change what is recorded."""
    from effectgate.canonical import args_hash

    _, gate = shop_gate
    args = {"order_id": "1042"}
    gate.call("get_order", args, context("m1"))
    args["order_id"] = "2001"
    gate.flush()
    [event] = store.events(kind="read")
    assert event.args_hash == args_hash("get_order", {"order_id": "1042"})


def test_a_schema_default_is_not_written_into_the_arguments(make_gate: MakeGate) -> None:
    """Validation never changes the arguments: a schema `default` is not filled into the caller's
    dict, nor into what is hashed and recorded (the tool's own default applies when it runs)."""
    seen: list[dict[str, Any]] = []

    def note(ticket_id: str, body: str, pinned: bool = False) -> dict[str, Any]:
        """Add a note."""
        seen.append({"ticket_id": ticket_id, "body": body, "pinned": pinned})
        return {"ok": True}

    schema = {
        "type": "object",
        "properties": {
            "ticket_id": {"type": "string"},
            "body": {"type": "string"},
            "pinned": {"type": "boolean", "default": False},
        },
        "required": ["ticket_id", "body"],
        "additionalProperties": False,
    }
    table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note, schema=schema)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    args = {"ticket_id": "t-1", "body": "hello"}
    out = gate.call("note", args, ctx())
    gate.flush()
    assert isinstance(out, Executed)
    assert args == {"ticket_id": "t-1", "body": "hello"}
    assert seen == [{"ticket_id": "t-1", "body": "hello", "pinned": False}]
    [record] = gate.store.executions(tool="note")
    assert json.loads(record.args_json) == args
    assert record.args_hash == args_hash("note", args)
