"""Round 3 review of the async and multi-call paths. A tool's exception whose `str()` or `repr()`
raises must still settle the record it ran under (and be the exception the caller gets), and a
coroutine closed unrun on a running loop is no unknown outcome. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from effectgate import Effect, EffectGate, EffectTable, Refused, ToolSpec
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import MakeGate
from .test_lease_edges import _cancel_while, _finish
from .test_lease_renewal import _granted, _table


def _run_on_a_loop(coro: Any) -> Any:
    """`asyncio.run` without its SIGINT check, which formats the task (and its exception's repr)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _runner(gate: EffectGate, run: str, name: str, args: dict[str, Any]) -> Callable[[], Any]:
    if run == "sync":
        return lambda: gate.call(name, args, context("m1"))
    if run == "async":
        return lambda: _run_on_a_loop(gate.acall(name, args, context("m1")))
    return lambda: gate.call_step([(name, args)], context("m1"))


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Unrepresentable(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize("run", ["sync", "async", "step"])
def test_a_write_whose_exception_has_no_text_is_recorded_failed(
    make_gate: MakeGate, store: SQLStore, run: str
) -> None:
    ran: list[int] = []

    def save(note: str) -> None:
        """Save a note."""
        ran.append(1)
        raise Unprintable()

    table = EffectTable([ToolSpec(name="save", effect=Effect.WRITE, fn=save)])
    table.allow("support", ["save"])
    call = _runner(make_gate(table), run, "save", {"note": "x"})
    with pytest.raises(Unprintable):
        call()
    assert ran == [1]
    [record] = store.idempotency_records()
    assert record.status == "failed"  # was left in flight: str() raised while it was settled
    [execution] = store.executions(tool="save")
    assert execution.status == "failed"


def test_an_approved_call_whose_exception_has_no_text_is_parked(make_gate: MakeGate, store: SQLStore) -> None:
    ran: list[int] = []

    def pay(account: str, amount: int) -> None:
        """Pay."""
        ran.append(amount)
        raise Unprintable()

    gate = make_gate(_table(pay))
    grant = _granted(gate)
    with pytest.raises(NeedsReconciliation):
        _run_on_a_loop(gate.aexecute(grant.token))
    assert ran == [5]
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert len(store.events(kind="needs_reconciliation")) == 1


@pytest.mark.parametrize("run", ["sync", "async", "step"])
def test_a_read_whose_exception_has_no_repr_raises_it_and_is_recorded(
    make_gate: MakeGate, store: SQLStore, run: str
) -> None:
    ran: list[int] = []

    def look(note: str) -> None:
        """Look a note up."""
        ran.append(1)
        raise Unrepresentable()

    table = EffectTable([ToolSpec(name="look", effect=Effect.READ, fn=look)])
    table.allow("support", ["look"])
    gate = make_gate(table)
    call = _runner(gate, run, "look", {"note": "x"})
    with pytest.raises(Unrepresentable):  # was RuntimeError from repr(), and no record
        call()
    gate.flush()
    assert ran == [1]
    assert len(store.events(kind="read_failed")) == 1
    assert store.events(kind="read") == []


def test_a_sync_wrapper_of_a_coroutine_executed_on_a_loop_is_no_unknown_outcome(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """A tool that is a plain function returning a coroutine (a decorator that is not async-aware)
    cannot be refused before its claim; `execute` on a running loop closes the coroutine unrun.
    Nothing happened: the record is a definite failure, not an unknown outcome for a person to
    reconcile."""
    ran: list[int] = []

    async def pay_now(account: str, amount: int) -> dict[str, int]:
        ran.append(amount)
        return {"paid": amount}

    def pay(account: str, amount: int) -> Any:
        """Pay."""
        return pay_now(account=account, amount=amount)

    gate = make_gate(_table(pay))
    grant = _granted(gate)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="aexecute"):
            gate.execute(grant.token)

    _run_on_a_loop(main())
    assert ran == []
    [record] = store.idempotency_records()
    assert record.status == "failed"
    assert store.events(kind="needs_reconciliation") == []


def test_a_coroutine_a_cancelled_calls_sync_tool_returned_unrun_is_no_unknown_outcome(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`aexecute` cancelled while a plain function tool runs in its worker thread; the function
    then returns a coroutine, which nobody will await: it is closed unrun. Nothing happened, so
    the record is a definite failure, not left in flight for `recover` to ask a person about."""
    ran: list[int] = []
    in_tool, go_on = threading.Event(), threading.Event()

    async def pay_now(account: str, amount: int) -> dict[str, int]:
        ran.append(amount)
        return {"paid": amount}

    def pay(account: str, amount: int) -> Any:
        """Pay."""
        in_tool.set()
        assert go_on.wait(10)
        return pay_now(account=account, amount=amount)

    gate = make_gate(_table(pay))
    kept: list[Any] = []
    loop = _cancel_while(gate, _granted(gate).token, in_tool, kept)
    go_on.set()
    _finish(loop)
    assert ran == []
    assert gate._settlement.leases._held == {}
    [record] = store.idempotency_records()
    assert record.status == "failed"


# -- the same text, where a store's run, a confirm check or a reconcile hook raised it


def test_a_store_run_whose_exception_has_no_text_is_recorded_failed(store: SQLStore) -> None:
    def fn() -> Any:
        raise Unprintable

    with pytest.raises(Unprintable):
        store.run("k-unprintable", "0" * 64, fn)
    record = store.get("k-unprintable")
    assert record is not None
    assert record.status == "failed"
    assert record.error == "Unprintable: (no text)"


def test_a_confirm_check_whose_exception_has_no_text_refuses_the_call(make_gate: MakeGate) -> None:
    ran: list[str] = []

    def pay(ref: str) -> str:
        """Pay a reference."""
        ran.append(ref)
        return "paid"

    def confirm(args: Any, seen: Any) -> str | None:
        raise Unprintable

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", confirm=confirm)]
    )
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("pay", {"ref": "r1"}, context("m1"))
    assert isinstance(out, Refused)
    assert (out.code, out.message) == ("confirm_failed", "pay: confirm check raised Unprintable: (no text)")
    assert ran == []
