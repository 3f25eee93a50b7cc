"""Round 19 review of `_grants` / `_step` (a HITL approve's grant with a `wrap_tool_call`),
reproduced first.

1. A `GatedToolNode` whose `wrap_tool_call` answers refund_order itself (it never calls
   `execute`), with a `native_approver`: a refund and a sibling gated call in one step, both
   approved by one HITL answer, the sibling refused (billing's role), so the step paused again.
   `_grants.before_pause` presented the refund's grant before that pause, outside the wrapper:
   the refund ran (12000 paid) although the wrapper blocks it. Fixed: a grant is spent only
   where the wrapper calls `execute`; at the pause the HITL grant is given back (`gate.release`,
   new in core) and noted, sealed, in the gate's log, and the step's next run grants it again as
   the same approver (`_regrant`): never asked again, run once or (blocked) never.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

from effectgate import Approver, CallContext, Grant, Pending
from effectgate.errors import PolicyViolation, TokenError
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate.testing import FakeClock, Script, call, say, step
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, Turn, grant, open_shop_gate
from tests.core.test_chain import unguard

from ._graph import LangGraphHarness

BILL = Approver("bill", "billing")
BOTH = step(call("refund_order", **REFUND), call("cancel_subscription", subscription_id="sub_u1"))
APPROVE_BOTH = Command(resume={"decisions": [{"type": "approve"}] * 2})


def _blocking(request: Any, execute: Callable[[Any], Any]) -> Any:
    if request.tool_call["name"] == "refund_order":
        return ToolMessage("blocked by the wrapper", tool_call_id=request.tool_call["id"])
    return execute(request)


def _passing(request: Any, execute: Callable[[Any], Any]) -> Any:
    return execute(request)


async def _ablocking(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
    if request.tool_call["name"] == "refund_order":
        return ToolMessage("blocked by the wrapper", tool_call_id=request.tool_call["id"])
    return await execute(request)


async def _apassing(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
    return await execute(request)


def _harness(shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any], **wrapper: Any) -> LangGraphHarness:
    node = GatedToolNode(shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=FINANCE, **wrapper)
    model = ScriptedChatModel(script=Script([BOTH, say("Both done.")]))
    return LangGraphHarness(shop_gate.gate, model, checkpointer, node=node)


def _run(
    shop_gate: ShopGate, saver: str, tmp_path: Path, *, is_async: bool, blocking: bool
) -> tuple[Turn, Turn]:
    """Ask, HITL-approve both as fiona (the cancel is refused: billing's), then bill's grant."""
    db = str(tmp_path / "checkpoints.db")

    async def arun() -> tuple[Turn, Turn]:
        async with contextlib.AsyncExitStack() as stack:
            if saver == "memory":
                checkpointer: BaseCheckpointSaver[Any] = InMemorySaver()
            else:
                _async_sqlite_works()
                checkpointer = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(db))
            h = _harness(shop_gate, checkpointer, awrap_tool_call=_ablocking if blocking else _apassing)
            first = await h.ainvoke({"messages": [HumanMessage("Refund and cancel", id="m3")]})
            _, cancel = first.paused
            second = await h.ainvoke(APPROVE_BOTH)
            assert shop_gate.shop.receiver.count("refund") == 0  # nothing ran before the step settled
            assert h.last is not None
            answer = resume(
                {cancel.approval_id: approve(grant(shop_gate.gate, cancel, BILL))}, h.last.interrupts
            )
            return second, await h.ainvoke(answer)

    if is_async:
        return asyncio.run(arun())
    with contextlib.ExitStack() as stack:
        if saver == "memory":
            checkpointer = InMemorySaver()
        else:
            conn = stack.enter_context(contextlib.closing(sqlite3.connect(db, check_same_thread=False)))
            checkpointer = SqliteSaver(conn)
        h = _harness(shop_gate, checkpointer, wrap_tool_call=_blocking if blocking else _passing)
        _, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
        second = h.invoke(APPROVE_BOTH)
        assert shop_gate.shop.receiver.count("refund") == 0  # nothing ran before the step settled
        return second, h.approve(cancel, grant(shop_gate.gate, cancel, BILL))


def _async_sqlite_works() -> None:
    aiosqlite = pytest.importorskip("aiosqlite")
    calls = "is_alive" in inspect.getsource(AsyncSqliteSaver.setup)  # langgraph-checkpoint-sqlite 3.0
    if calls and not hasattr(aiosqlite.Connection, "is_alive"):  # which aiosqlite 0.22 dropped
        pytest.skip("this aiosqlite and langgraph-checkpoint-sqlite do not work together (is_alive)")


RUNS = pytest.mark.parametrize(
    ("saver", "is_async"),
    [("memory", False), ("memory", True), ("sqlite", False), ("sqlite", True)],
    ids=["memory-sync", "memory-async", "sqlite-sync", "sqlite-async"],
)


@RUNS
def test_a_blocking_wrapper_blocks_a_hitl_approved_call_across_a_sibling_pause(
    shop_gate: ShopGate, tmp_path: Path, saver: str, is_async: bool
) -> None:
    second, done = _run(shop_gate, saver, tmp_path, is_async=is_async, blocking=True)
    assert [p.tool for p in second.paused] == ["cancel_subscription"]  # the refund is not asked again
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 0, "the refund ran although the wrapper blocks it"
    assert shop_gate.shop.receiver.count("cancel") == 1
    statuses = {r.tool: r.status for r in shop_gate.store.approvals()}
    assert statuses == {"refund_order": "approved", "cancel_subscription": "executed"}
    [refund] = [r for r in shop_gate.store.approvals() if r.tool == "refund_order"]
    # its first grant given back at the pause, granted again when the step settled, never presented
    assert refund.token_used_at is None
    assert refund.grants == 2
    kinds = [e.kind for e in shop_gate.store.events(approval_id=refund.id)]
    assert kinds.count("grant_released") == 1
    assert kinds.count("regranted") == 1
    assert "token_used" not in kinds
    assert "blocked by the wrapper" in [r.content for r in done.results]
    assert shop_gate.gate.audit().clean


@RUNS
def test_a_passing_wrapper_runs_a_hitl_approved_call_once_after_the_sibling_pause(
    shop_gate: ShopGate, tmp_path: Path, saver: str, is_async: bool
) -> None:
    second, done = _run(shop_gate, saver, tmp_path, is_async=is_async, blocking=False)
    assert [p.tool for p in second.paused] == ["cancel_subscription"]
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}
    # granted, given back at the pause, granted again in a new round as the HITL answer's approver
    [refund] = [r for r in shop_gate.store.approvals() if r.tool == "refund_order"]
    with shop_gate.store.reading() as conn:
        decided = [
            (d.grant_round, d.approver_id, d.decision) for d in shop_gate.store.decisions(conn, refund.id)
        ]
    assert decided == [(0, FINANCE.id, "approve"), (0, "effectgate", "release"), (1, FINANCE.id, "approve")]
    assert shop_gate.gate.audit().clean


def test_no_grant_token_is_kept_in_the_checkpoint_or_the_log(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    h = _harness(shop_gate, checkpointer, wrap_tool_call=_passing)
    h.send("Refund 1042 and cancel my subscription", message_id="m3")
    h.invoke(APPROVE_BOTH)
    checkpoints = [repr(t) for t in checkpointer.list(h.config)]
    events = [e.detail_json for e in shop_gate.store.events()]
    assert not any("eg1." in text for text in checkpoints + events)


def test_a_note_edited_in_the_log_grants_nothing(
    shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """The deferred approve is read back from the gate's log only when its seal verifies: an
    edited one is ignored, and the refund is asked for again (nothing approved, nothing ran)."""
    h = _harness(shop_gate, checkpointer, wrap_tool_call=_passing)
    _, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    h.invoke(APPROVE_BOTH)
    from effectgate_langgraph._regrant import NOTE

    [note] = shop_gate.store.events(kind=NOTE)
    detail = json.loads(note.detail_json)
    detail["approver_role"] = "billing"
    unguard(shop_gate.store, "eg_events")  # the database owner's rights, not the keyring
    with shop_gate.store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_events SET detail_json = :d WHERE id = :id"),
            {"d": json.dumps(detail), "id": note.id},
        )
    done = h.approve(cancel, grant(shop_gate.gate, cancel, BILL))
    assert [p.tool for p in done.paused] == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 0
    # asked again, never stuck: a HITL approve grants it again, and it runs once
    last = h.invoke(Command(resume={"decisions": [{"type": "approve"}]}))
    assert last.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert {r.status for r in shop_gate.store.approvals()} == {"executed"}


def test_a_released_grant_is_void_and_the_approval_is_granted_again(keyed_db: str, clock: FakeClock) -> None:
    """`gate.release` (SQLite and PostgreSQL): the token is refused from then on (nothing runs), a
    new approve grants the approval again (a new round), and that grant runs once; a spent or
    released grant, or a token that is not one, cannot be given back."""
    with open_shop_gate(keyed_db, clock) as shop_gate:
        _release_and_grant_again(shop_gate)


def _release_and_grant_again(shop_gate: ShopGate) -> None:
    gate = shop_gate.gate
    pending = gate.call("refund_order", REFUND, _ctx())
    assert isinstance(pending, Pending)
    first = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(first, Grant)
    gate.release(first.token)
    with pytest.raises(TokenError) as refused:
        gate.execute(first.token)
    assert refused.value.reason == "expired"
    with pytest.raises(TokenError):
        gate.release(first.token)  # given back once
    with pytest.raises(TokenError):
        gate.release(first.token[:-4] + "AAAA")  # not a token the keyring signed
    again = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(again, Grant)
    gate.execute(again.token)
    with pytest.raises(TokenError) as spent:
        gate.release(again.token)
    assert spent.value.reason == "used"
    assert shop_gate.shop.receiver.count("refund") == 1
    kinds = [e.kind for e in shop_gate.store.events(approval_id=pending.approval_id)]
    assert kinds.count("grant_released") == 1
    assert gate.audit().clean


def _ctx() -> CallContext:
    return CallContext(session_id="s-ada", user_id="u1", origin_message_id="m9", agent_id=SUPPORT_AGENT)


def test_granted_again_as_the_approver_the_hitl_answer_was_applied_as(shop_gate: ShopGate) -> None:
    """The grant is granted again as the approver the note names (the run that applied the HITL
    answer), not as whoever the later resume's config names."""

    def reviewer(config: Any, context: Any) -> Approver:
        return Approver(config["configurable"].get("reviewer", "fiona"), "finance")

    node = GatedToolNode(
        shop_gate.gate, agent_id=SUPPORT_AGENT, native_approver=reviewer, wrap_tool_call=_passing
    )
    model = ScriptedChatModel(script=Script([BOTH, say("Both done.")]))
    h = LangGraphHarness(shop_gate.gate, model, InMemorySaver(), node=node)
    _, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    h.invoke(APPROVE_BOTH)
    assert h.last is not None
    answer = resume({cancel.approval_id: approve(grant(shop_gate.gate, cancel, BILL))}, h.last.interrupts)
    done = h.invoke(answer, {"configurable": {"thread_id": "s-ada", "reviewer": "frank"}})
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    [refund] = [r for r in shop_gate.store.approvals() if r.tool == "refund_order"]
    with shop_gate.store.reading() as conn:
        decided = shop_gate.store.decisions(conn, refund.id)
    assert {d.approver_id for d in decided if d.decision == "approve"} == {"fiona"}
    assert [d.grant_round for d in decided if d.decision == "release"] == [0]  # given back at the pause


def test_a_refused_regrant_asks_again_with_the_reason(
    shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Granting it again is refused (here: the subject is busy elsewhere by then): the step
    pauses on the refund with the core's reason, nothing ran, and a new approve runs it once."""
    h = _harness(shop_gate, InMemorySaver(), wrap_tool_call=_passing)
    _, cancel = h.send("Refund 1042 and cancel my subscription", message_id="m3").paused
    h.invoke(APPROVE_BOTH)
    token = grant(shop_gate.gate, cancel, BILL)
    real = shop_gate.gate.approve

    def busy_once(approval_id: str, **kw: Any) -> Any:
        monkeypatch.setattr(shop_gate.gate, "approve", real)
        raise PolicyViolation("refund_order: in flight on this subject elsewhere", code="subject_busy")

    monkeypatch.setattr(shop_gate.gate, "approve", busy_once)
    again = h.approve(cancel, token)
    assert [p.tool for p in again.paused] == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.receiver.count("cancel") == 0  # the step has not settled: nothing ran
    [request] = h.interrupt.value["requests"]
    assert "in flight on this subject elsewhere" in json.dumps(h.interrupt.value)
    assert request["tool"] == "refund_order"
    done = h.invoke(Command(resume={"decisions": [{"type": "approve"}]}))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("cancel") == 1
