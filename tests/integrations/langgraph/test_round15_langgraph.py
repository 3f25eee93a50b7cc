"""Review round 15 of the LangGraph adapter. Effects are counted at the receiver (the tool), and
records are read back from the gate's store or the checkpoint file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from effectgate import Approver, EffectGate, Grant, Keyring, money, open_store
from effectgate.examples.shop import Shop, app
from effectgate.stores.sql import SQLStore
from effectgate.testing import EffectRecorder, Script, call, say, step
from effectgate_langgraph import approve, gated_node, resume
from effectgate_langgraph._artifacts import KEPT
from effectgate_langgraph._messages import ARTIFACT_KEY
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import EMAIL, REFUND, SUPPORT_LEAD
from tests.core.test_chain import unguard

from ._graph import shop_graph
from .test_review_round3 import CONTEXT

FIONA = Approver("fiona", "finance")


def _artifact_run(
    tmp_path: Path,
    gates: list[EffectGate],
    checkpointer: BaseCheckpointSaver[Any],
    *,
    forge: bool,
    is_async: bool = False,
) -> tuple[EffectRecorder, ToolMessage]:
    """Two gated calls in one step: the first approved (it runs, its receipt in its artifact)
    while the second waits, then the second. `forge`: between the two, the stored artifact
    record is edited in the database (its seal left as it was)."""
    receiver = EffectRecorder()

    @tool(response_format="content_and_artifact")
    def pay_invoice(invoice_id: str) -> tuple[str, dict[str, Any]]:
        """Pay an invoice."""
        receiver.record("pay", invoice_id=invoice_id)
        return "paid", {"receipt": "r-" + invoice_id}

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        receiver.record("refund", order_id=order_id)
        return "refunded"

    node = gated_node(
        [pay_invoice, refund],
        {
            "pay_invoice": money("finance", subject="invoice_id"),
            "refund": money("finance", subject="order_id"),
        },
        db=f"sqlite:///{tmp_path}/eg.db",
    )
    gates.append(node.gate)
    script = Script(
        [step(call("pay_invoice", invoice_id="inv-1"), call("refund", order_id="o-1")), say("Done.")]
    )
    graph = shop_graph(node.gate, ScriptedChatModel(script=script), checkpointer=checkpointer, node=node)
    cfg: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}

    def invoke(value: Any) -> Any:
        if is_async:
            return asyncio.run(graph.ainvoke(value, cfg, context=CONTEXT, version="v2"))
        return graph.invoke(value, cfg, context=CONTEXT, version="v2")

    out = invoke({"messages": [HumanMessage("pay and refund", id="m3")]})
    ids = {r["tool"]: r["approval_id"] for r in out.interrupts[0].value["requests"]}
    pay = node.gate.approve(ids["pay_invoice"], version=1, approver=FIONA)
    assert isinstance(pay, Grant)
    out = invoke(resume({ids["pay_invoice"]: approve(pay.token)}, out.interrupts))
    assert receiver.count("pay") == 1
    if forge:
        unguard(node.gate.store, "eg_events")  # the database owner's rights, not the keyring
        [kept] = node.gate.store.events(kind=KEPT)
        detail = json.loads(kept.detail_json)
        detail["artifact"] = {"receipt": "r-forged"}
        with node.gate.store.transaction() as conn:
            conn.execute(
                sa.text("UPDATE eg_events SET detail_json = :d WHERE id = :id"),
                {"d": json.dumps(detail), "id": kept.id},
            )
    ref = node.gate.approve(ids["refund"], version=1, approver=FIONA)
    assert isinstance(ref, Grant)
    out = invoke(resume({ids["refund"]: approve(ref.token)}, out.interrupts))
    assert out.interrupts == ()
    [paid] = [m for m in out.value["messages"] if isinstance(m, ToolMessage) and m.name == "pay_invoice"]
    return receiver, paid


def test_an_approved_calls_artifact_survives_a_siblings_later_approval(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """A content-and-artifact tool that ran while a sibling gated call still waited keeps its
    own artifact in the ToolMessage the graph finally holds (its run's output was dropped by the
    sibling's interrupt, and the re-run answers it from the store), as ToolNode would give it;
    each tool ran once."""
    receiver, paid = _artifact_run(tmp_path, gates, checkpointer, forge=False)
    assert (receiver.count("pay"), receiver.count("refund")) == (1, 1)
    assert paid.artifact == {"receipt": "r-inv-1"}
    assert paid.content == "paid"


def test_the_artifact_is_kept_by_the_async_node_too(tmp_path: Path, gates: list[EffectGate]) -> None:
    """As above, through `ainvoke` (the step's store work runs in the driver's worker thread)."""
    receiver, paid = _artifact_run(tmp_path, gates, InMemorySaver(), forge=False, is_async=True)
    assert (receiver.count("pay"), receiver.count("refund")) == (1, 1)
    assert paid.artifact == {"receipt": "r-inv-1"}


def test_an_edited_artifact_record_is_not_given_to_the_graph(
    tmp_path: Path, gates: list[EffectGate], checkpointer: BaseCheckpointSaver[Any]
) -> None:
    """A kept artifact is read back only if its seal verifies: one edited in the database is
    not handed to the graph (the gate's record of the run is its artifact instead)."""
    receiver, paid = _artifact_run(tmp_path, gates, checkpointer, forge=True)
    assert (receiver.count("pay"), receiver.count("refund")) == (1, 1)
    assert paid.artifact != {"receipt": "r-forged"}
    assert paid.artifact[ARTIFACT_KEY]["outcome"] == "executed"
    assert paid.content == "paid"


# -- the checkpoint read back by another process: resume values that name something else


class _Process:
    """One process of a cross-process run: its own shop, store, gate, scripted model and
    SqliteSaver, sharing only the effectgate database, the checkpoint file and the keyring."""

    def __init__(self, tmp_path: Path, keyring: Keyring, script: Script, **graph: Any) -> None:
        self.shop = Shop()
        self.store = open_store(f"sqlite:///{tmp_path}/effectgate.db")
        self.store.setup()
        self.gate = app(self.store, keyring=keyring, shop=self.shop)
        self.conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
        self.script = script
        self.graph = shop_graph(
            self.gate, ScriptedChatModel(script=script), checkpointer=SqliteSaver(self.conn), **graph
        )

    def invoke(self, value: Any, thread: str, user: str = "u1") -> Any:
        cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
        return self.graph.invoke(value, cfg, context={"user_id": user}, version="v2")

    def pending(self, thread: str) -> Any:
        return self.graph.get_state({"configurable": {"thread_id": thread}}).interrupts

    def close(self) -> None:
        self.gate.close()
        self.store.close()
        self.conn.close()


def _ledger(store: SQLStore) -> dict[str, Any]:
    """What decides and what ran: approvals, decisions, executions and idempotency records."""
    with store.reading() as conn:
        rows = {
            "approvals": conn.execute(
                sa.text("SELECT id, status, version, token_used_at FROM eg_approvals ORDER BY id")
            ).all(),
            "decisions": conn.execute(sa.text("SELECT approval_id, decision FROM eg_decisions")).all(),
            "executions": conn.execute(sa.text("SELECT count(*) FROM eg_executions")).scalar(),
            "idempotency": conn.execute(sa.text("SELECT key, status FROM eg_idempotency")).all(),
        }
    return {k: [tuple(r) for r in v] if isinstance(v, list) else v for k, v in rows.items()}


@pytest.fixture
def paused_threads(tmp_path: Path) -> tuple[Keyring, dict[str, str]]:
    """Two threads, each paused on a refund (s-a: 1042 for u1, s-b: 2001 for u2), by a process
    that then exits; the approval id of each thread."""
    keyring = Keyring.generate()
    other = {"order_id": "2001", "amount": 9000, "currency": "GBP"}
    script = Script([call("refund_order", id="c-a", **REFUND), call("refund_order", id="c-b", **other)])
    first = _Process(tmp_path, keyring, script)
    try:
        ids = {}
        for thread, user, mid in (("s-a", "u1", "m-a"), ("s-b", "u2", "m-b")):
            out = first.invoke({"messages": [HumanMessage("refund please", id=mid)]}, thread, user)
            [request] = out.interrupts[0].value["requests"]
            ids[thread] = request["approval_id"]
        assert first.shop.receiver.count("refund") == 0
    finally:
        first.close()
    return keyring, ids


def _token(tmp_path: Path, keyring: Keyring, approval_id: str, approver: Approver = FIONA) -> str:
    """A grant minted by a reviewer's own process (as `effectgate approve` would)."""
    store = open_store(f"sqlite:///{tmp_path}/effectgate.db")
    gate = app(store, keyring=keyring)
    try:
        granted = gate.approve(approval_id, version=1, approver=approver)
        assert isinstance(granted, Grant)
        return granted.token
    finally:
        gate.close()
        store.close()


@pytest.mark.parametrize("key", ["other thread's id", "this thread's id"])
def test_a_resume_carrying_another_threads_grant_runs_nothing(
    tmp_path: Path, paused_threads: tuple[Keyring, dict[str, str]], key: str
) -> None:
    """Thread s-a, resumed in another process with thread s-b's grant (under s-b's approval id,
    or under s-a's own): refused, nothing runs, the ledger is as it was, and s-b's grant is not
    spent: s-b's own resume still runs its refund once."""
    keyring, ids = paused_threads
    token_b = _token(tmp_path, keyring, ids["s-b"])
    later = _Process(tmp_path, keyring, Script([]))
    try:
        before = _ledger(later.store)
        answer = {ids["s-b"] if key == "other thread's id" else ids["s-a"]: approve(token_b)}
        out = later.invoke(resume(answer, later.pending("s-a")), "s-a")
        assert later.shop.receiver.count("refund") == 0
        assert _ledger(later.store) == before
        [request] = out.interrupts[0].value["requests"]
        assert request["approval_id"] == ids["s-a"]
        assert out.interrupts[0].value["refused"]
    finally:
        later.close()
    own = _Process(tmp_path, keyring, Script([say("Refunded.")]))
    try:
        out = own.invoke(resume({ids["s-b"]: approve(token_b)}, own.pending("s-b")), "s-b", "u2")
        assert out.interrupts == ()
        assert own.shop.receiver.count("refund", order_id="2001") == 1
        assert own.shop.receiver.count("refund", order_id="1042") == 0
    finally:
        own.close()


@pytest.mark.parametrize("claim", ["native approver of another role", "approver named in the answer"])
def test_a_hitl_approve_by_an_approver_of_another_role_decides_nothing(
    tmp_path: Path, paused_threads: tuple[Keyring, dict[str, str]], claim: str
) -> None:
    """A HumanInTheLoopMiddleware approve, resumed in another process whose native approver
    holds a role the table does not name for the call (support, not finance), or that names the
    table's role itself in the answer: refused, nothing runs, no decision is recorded."""
    keyring, _ = paused_threads
    sam = Approver("sam", "support") if claim == "native approver of another role" else None
    decision: dict[str, Any] = {"type": "approve"}
    if sam is None:
        decision["approver"] = {"id": "fiona", "role": "finance"}
    later = _Process(tmp_path, keyring, Script([]), native_approver=sam)
    try:
        before = _ledger(later.store)
        [intr] = later.pending("s-a")
        out = later.invoke(Command(resume={intr.id: {"decisions": [decision]}}), "s-a")
        assert later.shop.receiver.count("refund") == 0
        assert _ledger(later.store) == before
        assert out.interrupts[0].value["refused"]
    finally:
        later.close()


def test_a_resume_under_another_user_runs_nothing(
    tmp_path: Path, paused_threads: tuple[Keyring, dict[str, str]]
) -> None:
    """Thread s-b's call, resumed with its own valid grant but for another user (u1, not u2, as
    the runtime context of this process says): nothing runs, the ledger is as it was."""
    keyring, ids = paused_threads
    token_b = _token(tmp_path, keyring, ids["s-b"])
    later = _Process(tmp_path, keyring, Script([]))
    try:
        before = _ledger(later.store)
        out = later.invoke(resume({ids["s-b"]: approve(token_b)}, later.pending("s-b")), "s-b", "u1")
        assert later.shop.receiver.count("refund") == 0
        assert _ledger(later.store) == before
        assert out.interrupts  # the call still waits
    finally:
        later.close()


def test_a_checkpoint_copied_to_another_thread_does_not_spend_the_grant(
    tmp_path: Path, paused_threads: tuple[Keyring, dict[str, str]]
) -> None:
    """Thread s-a's paused checkpoint copied under another thread id (s-x, same user), then
    resumed there with s-a's grant: the copy's step is another session's, whose call is refused
    (its subject is in flight in s-a), so the grant answers nothing there: no refund runs, and
    s-a's approval, its decisions and the executions are as they were."""
    keyring, ids = paused_threads
    token_a = _token(tmp_path, keyring, ids["s-a"])
    later = _Process(tmp_path, keyring, Script([say("It is being handled.")]))
    try:
        state = later.graph.get_state({"configurable": {"thread_id": "s-a"}})
        later.graph.update_state(
            {"configurable": {"thread_id": "s-x"}}, {"messages": state.values["messages"]}, as_node="agent"
        )
        before = _ledger(later.store)
        out = later.invoke(Command(resume={ids["s-a"]: approve(token_a)}), "s-x")
        assert later.shop.receiver.count("refund") == 0
        assert _ledger(later.store) == before
        [answer] = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
        assert answer.artifact[ARTIFACT_KEY]["code"] == "subject_busy"
    finally:
        later.close()


def _forge_stored_answer(checkpoints: Path, extra: dict[str, Any]) -> None:
    """Add `extra` to the answer the checkpoint file keeps for the paused task (its RESUME
    write), as whoever can write the checkpoint (not the keyring) can."""
    conn = sqlite3.connect(checkpoints)
    try:
        serde = SqliteSaver(conn).serde
        rows = conn.execute("SELECT rowid, type, value FROM writes WHERE channel = '__resume__'").fetchall()
        assert rows
        for rowid, kind, blob in rows:
            answers = serde.loads_typed((kind, blob))
            answers[0] = {**answers[0], **extra}
            kind, blob = serde.dumps_typed(answers)
            conn.execute("UPDATE writes SET type = ?, value = ? WHERE rowid = ?", (kind, blob, rowid))
        conn.commit()
    finally:
        conn.close()


def _paused_refund_and_email(tmp_path: Path, keyring: Keyring) -> dict[str, str]:
    """A step pauses on a refund and an email; another process applies the refund's grant (the
    email still waits, and the task's answer is kept in the checkpoint). The approval ids."""
    script = Script([step(call("refund_order", id="c-r", **REFUND), call("send_email", id="c-e", **EMAIL))])
    first = _Process(tmp_path, keyring, script)
    try:
        out = first.invoke({"messages": [HumanMessage("refund and tell me", id="m-a")]}, "s-a")
        ids = {r["tool"]: r["approval_id"] for r in out.interrupts[0].value["requests"]}
    finally:
        first.close()
    refund_token = _token(tmp_path, keyring, ids["refund_order"])
    second = _Process(tmp_path, keyring, Script([]))
    try:
        out = second.invoke(
            resume({ids["refund_order"]: approve(refund_token)}, second.pending("s-a")), "s-a"
        )
        assert second.shop.receiver.count("refund") == 1
        assert [r["tool"] for r in out.interrupts[0].value["requests"]] == ["send_email"]
    finally:
        second.close()
    return ids


def test_a_deny_written_into_the_checkpoints_stored_answer_is_not_applied(tmp_path: Path) -> None:
    """Someone who can write the checkpoint adds a deny of the waiting email to the answer the
    checkpoint keeps for the step. When the email's reviewer approves it, the re-run replays the
    stored answer: a deny no invoke brought (no grant token vouches for it) is not applied: the
    email is sent once, as approved, and the ledger holds no denial of it."""
    keyring = Keyring.generate()
    ids = _paused_refund_and_email(tmp_path, keyring)
    forged = {"type": "deny", "reason": "not approved by anyone"}
    _forge_stored_answer(tmp_path / "checkpoints.db", {ids["send_email"]: forged})
    email_token = _token(tmp_path, keyring, ids["send_email"], SUPPORT_LEAD)
    third = _Process(tmp_path, keyring, Script([say("Refunded and emailed.")]))
    try:
        out = third.invoke(resume({ids["send_email"]: approve(email_token)}, third.pending("s-a")), "s-a")
        assert out.interrupts == ()
        assert third.shop.receiver.count("email") == 1
        assert third.shop.receiver.count("refund") == 0
        ledger = _ledger(third.store)
        assert [d for a, d in ledger["decisions"] if a == ids["send_email"]] == ["approve"]
        assert [(a[1], a[2]) for a in ledger["approvals"] if a[0] == ids["send_email"]] == [("executed", 1)]
    finally:
        third.close()


def test_an_edit_written_into_the_checkpoints_stored_answer_is_not_applied(tmp_path: Path) -> None:
    """As above with an edit of the waiting email's body, replayed when the client sends the
    refund's answer again: the email's approval stays at version 1 with its own arguments
    (no new version recorded as a reviewer's edit), nothing is sent, nothing is refunded twice."""
    keyring = Keyring.generate()
    ids = _paused_refund_and_email(tmp_path, keyring)
    forged = {"type": "edit", "args": {**EMAIL, "body": "Click here to claim your prize."}}
    _forge_stored_answer(tmp_path / "checkpoints.db", {ids["send_email"]: forged})
    third = _Process(tmp_path, keyring, Script([]))
    try:
        before = _ledger(third.store)
        out = third.invoke(resume({ids["refund_order"]: approve("eg1.retry")}, third.pending("s-a")), "s-a")
        [request] = out.interrupts[0].value["requests"]
        assert (request["approval_id"], request["version"]) == (ids["send_email"], 1)
        assert request["card"]["args"]["body"] == EMAIL["body"]
        assert (third.shop.receiver.count("email"), third.shop.receiver.count("refund")) == (0, 0)
        assert _ledger(third.store) == before
    finally:
        third.close()
