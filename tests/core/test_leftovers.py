"""Three leftovers: a ToolContext parameter of a callable object or a partial, an in-memory SQLite
URL whose pooled connections each see their own database, and a reclassified execute that left
no token_refused event."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import PolicyViolation, TableError
from effectgate.examples.shop import SHOP_POLICY, context
from effectgate.stores import SQLStore, open_store
from effectgate.table import Escalate
from effectgate.testing import FakeClock
from effectgate.tokens import keyring_for

from .conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
AGENT = "agent"


def call_ctx(message: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message, user_id="u1", agent_id=AGENT)


# -- 1. a ToolContext parameter of a callable object (sync or async) or a functools.partial


class SyncTool:
    def __init__(self) -> None:
        self.seen: list[ToolContext] = []

    def __call__(self, ref: str, ctx: ToolContext) -> dict[str, Any]:
        self.seen.append(ctx)
        return {"ref": ref}


class AsyncTool:
    def __init__(self) -> None:
        self.seen: list[ToolContext] = []

    async def __call__(self, ref: str, ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        self.seen.append(ctx)
        return {"ref": ref}


def partial_tool() -> tuple[Callable[..., Any], list[ToolContext]]:
    seen: list[ToolContext] = []

    def tool(ref: str, ctx: ToolContext, note: str) -> dict[str, Any]:
        seen.append(ctx)
        return {"ref": ref, "note": note}

    return functools.partial(tool, note="n"), seen


def make_tool(kind: str) -> tuple[Callable[..., Any], list[ToolContext], bool]:
    """The tool, the contexts it received, and whether it is async."""
    if kind == "object":
        obj = SyncTool()
        return obj, obj.seen, False
    if kind == "async_object":
        aobj = AsyncTool()
        return aobj, aobj.seen, True
    fn, seen = partial_tool()
    return fn, seen, False


KINDS = ["object", "async_object", "partial"]


@pytest.mark.parametrize("kind", KINDS)
def test_callable_write_tool_receives_its_tool_context(make_gate: MakeGate, kind: str) -> None:
    """A write whose fn is a callable object (or a partial) gets the ToolContext, as a function does."""
    fn, seen, is_async = make_tool(kind)
    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=fn)])
    table.allow_all(AGENT)
    gate = make_gate(table)
    if is_async:
        out = asyncio.run(gate.acall("tag", {"ref": "r1"}, call_ctx()))
    else:
        out = gate.call("tag", {"ref": "r1"}, call_ctx())
    assert isinstance(out, Executed), out
    [tc] = seen
    assert isinstance(tc, ToolContext)
    assert tc.idempotency_key == out.idempotency_key
    [execution] = gate.store.executions()
    assert execution.idempotency_key == tc.idempotency_key


@pytest.mark.parametrize("kind", KINDS)
def test_callable_money_tool_receives_its_tool_context(make_gate: MakeGate, kind: str) -> None:
    """An approved money call whose fn is a callable object (or a partial) gets the ToolContext
    carrying the approval's key."""
    fn, seen, is_async = make_tool(kind)
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=fn, approver_role="finance")
    table = EffectTable([spec])
    table.allow_all(AGENT)
    gate = make_gate(table)
    pending = gate.call("pay", {"ref": "r1"}, call_ctx())
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = asyncio.run(gate.aexecute(grant.token)) if is_async else gate.execute(grant.token)
    [tc] = seen
    assert isinstance(tc, ToolContext)
    assert tc.idempotency_key == done.idempotency_key == f"eg_{pending.approval_id}_v1"
    assert (tc.approval_id, tc.version) == (pending.approval_id, 1)
    [execution] = gate.store.executions()
    assert execution.idempotency_key == tc.idempotency_key


# -- 2. in-memory SQLite URLs: every form keeps one database for the whole store

MEMORY_URLS = [
    "sqlite:///file:eg_private?mode=memory&uri=true",
    "sqlite:///file::memory:?uri=true",
    "sqlite:///file:eg_shared?mode=memory&cache=shared&uri=true",
]


@pytest.mark.parametrize("url", MEMORY_URLS)
def test_in_memory_uri_store_keeps_its_records_across_connections(url: str, clock: FakeClock) -> None:
    """A write run on another thread, while a connection is checked out, lands in the database
    the store was set up in: no 'no such table', no record lost."""
    store = open_store(url, clock=clock)
    try:
        store.setup()
        writes: list[str] = []

        def note(text: str) -> str:
            writes.append(text)
            return text

        table = EffectTable([ToolSpec(name="note", effect=Effect.WRITE, fn=note)])
        table.allow_all(AGENT)
        gate = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(gate.call("note", {"text": "hello"}, call_ctx()))
            except Exception as exc:
                outcome.append(exc)

        held = store.engine.connect()  # a connection in use elsewhere (another request)
        try:
            worker = threading.Thread(target=run)
            worker.start()
            worker.join()
        finally:
            held.close()
        gate.close()
        assert [type(o).__name__ for o in outcome] == ["Executed"], outcome
        assert writes == ["hello"]
        assert [e.status for e in store.executions()] == ["succeeded"]
    finally:
        store.close()


# -- 3. an execute refused because the row changed since the approval is recorded


@pytest.mark.parametrize(
    "changes", [{"approver_role": "finance_lead"}, {"effect": Effect.DESTRUCTIVE}], ids=["role", "effect"]
)
def test_reclassified_execute_is_recorded_as_token_refused(
    shop_gate: ShopGate, store: SQLStore, make_gate: MakeGate, changes: dict[str, Any]
) -> None:
    """A grant presented to a gate whose row changed is refused (reclassified), nothing runs,
    and the refusal is recorded as a token_refused event naming the approval."""
    shop, gate = shop_gate
    refund = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
    pending = gate.call("refund_order", refund, context("m3"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    spec = gate.table["refund_order"]
    changed = make_gate(
        gate.table.replace(dataclasses.replace(spec, **changes)), policy=SHOP_POLICY, keyring=gate.keyring
    )
    with pytest.raises(PolicyViolation) as raised:
        changed.execute(grant.token)
    assert raised.value.code == "reclassified"
    assert shop.receiver.count("refund") == 0
    refused = [e for e in store.events(kind="token_refused") if e.approval_id == grant.approval_id]
    assert [json.loads(e.detail_json) for e in refused] == [{"reason": "reclassified"}]


@pytest.mark.parametrize("url", MEMORY_URLS)
def test_in_memory_uri_store_leaves_no_key_file(
    url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-memory database outlives nothing, so its keyring is a fresh one: no key file is
    written for a name that is not a file (it was `file:eg_private.keys` in the working
    directory), and none is asked for."""
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    monkeypatch.chdir(tmp_path)
    assert keyring_for(url, create=True).kids
    assert keyring_for(url, create=False).kids
    assert list(tmp_path.iterdir()) == []


# -- 4. an escalation rule on an argument the tool lacks (a typo) would never escalate


@pytest.mark.parametrize(
    "rule",
    [
        Escalate.above("amout", 100_000, role="finance_lead"),
        Escalate.count_above("recipients", 500, role="marketing_lead"),
    ],
)
def test_a_code_built_escalation_on_an_argument_the_tool_lacks_is_refused(rule: Escalate) -> None:
    def refund(order_id: str, amount: int) -> dict[str, bool]:
        """Refund an order."""
        return {"ok": True}

    with pytest.raises(TableError) as caught:
        ToolSpec(name="refund", effect=Effect.MONEY, fn=refund, approver_role="finance", escalate=(rule,))
    assert caught.value.field == "escalate"


def test_an_escalation_on_a_real_argument_and_a_predicate_rule_still_build() -> None:
    def refund(order_id: str, amount: int) -> dict[str, bool]:
        """Refund an order."""
        return {"ok": True}

    spec = ToolSpec(
        name="refund",
        effect=Effect.MONEY,
        fn=refund,
        approver_role="finance",
        escalate=(
            Escalate.above("amount", 100_000, role="finance_lead"),
            Escalate.when(lambda args: args.get("order_id") == "vip", role="cfo", note="vip"),
        ),
    )
    assert spec.role_for({"order_id": "o1", "amount": 200_000})[0] == "finance_lead"
    assert spec.role_for({"order_id": "vip", "amount": 1})[0] == "cfo"
