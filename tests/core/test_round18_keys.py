"""Round 18: stable operation keys and replays.

An operation is identified by its originating user message (session, tool, origin message id,
subject), never by a tool-call id or a retry: a replayed run must find the same approval (or its
stored result) and never cause a second effect. Effects are counted at the receiver
(`EffectRecorder`); records are read back from the store. Every test runs on SQLite and
PostgreSQL (`store`).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Executed, Grant, Pending, Refused, ToolSpec
from effectgate.context import ToolContext
from effectgate.errors import NeedsReconciliation, OutcomeUnknown
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
LEAD = Approver("lee", "support_lead")
REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def ctx(message: str, *, session: str = "s1", user: str = "u1") -> CallContext:
    return CallContext(session_id=session, origin_message_id=message, user_id=user, agent_id="support")


def run(gate: Any, out: Any, approver: Approver = FINANCE) -> Executed:
    """Approve and execute a pending call."""
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=out.version, approver=approver)
    assert isinstance(grant, Grant), grant
    done = gate.execute(grant.token)
    assert isinstance(done, Executed), done
    return done


def pay_table(
    rec: EffectRecorder, effect: Effect = Effect.MONEY, *, to: dict[str, Any] | None = None
) -> EffectTable:
    """One tool `pay(to, amount)` of `effect`, its subject `to`; each run recorded at `rec`.
    `pay` raises OutcomeUnknown (after its effect) for an amount of 13."""

    def pay(to: Any, amount: float, tool_context: ToolContext) -> dict[str, Any]:
        rec.record("pay", idempotency_key=tool_context.idempotency_key, amount=amount)
        if amount == 13:
            raise OutcomeUnknown("the provider timed out")
        return {"paid": amount}

    schema = {
        "type": "object",
        "properties": {"to": to or {"type": "string"}, "amount": {"type": "number"}},
        "required": ["to", "amount"],
        "additionalProperties": False,
    }
    role = None if effect is Effect.WRITE else "finance"
    spec = ToolSpec(name="pay", effect=effect, fn=pay, approver_role=role, subject=("to",), schema=schema)
    table = EffectTable([spec])
    table.allow_all("support")
    return table


def blast_table(rec: EffectRecorder, effect: Effect) -> EffectTable:
    """One tool `blast(text, loud=False)` of `effect`, with no subject (keyed by its arguments)."""

    def blast(text: str, tool_context: ToolContext, loud: bool = False) -> dict[str, Any]:
        rec.record("blast", idempotency_key=tool_context.idempotency_key, text=text, loud=loud)
        return {"sent": text}

    role = None if effect is Effect.WRITE else "support_lead"
    table = EffectTable([ToolSpec(name="blast", effect=effect, fn=blast, approver_role=role)])
    table.allow_all("support")
    return table


# -- the same message, its arguments written differently: one operation


def test_a_replay_with_its_arguments_reordered_or_an_integral_float_is_the_same_operation(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Keys in another order and 1200.0 for 1200: the same approval while it waits, its stored
    result after it ran; one refund at the provider."""
    shop, gate = shop_gate
    retried = {"currency": "GBP", "amount": 1200.0, "order_id": "1042"}
    first = gate.call("refund_order", REFUND, ctx("m1"))
    again = gate.call("refund_order", retried, ctx("m1"))
    assert isinstance(again, Pending)
    assert isinstance(first, Pending)
    assert (again.approval_id, again.version, again.replay) == (first.approval_id, 1, True)
    run(gate, first)
    third = gate.call("refund_order", retried, ctx("m1"))
    assert isinstance(third, Executed)
    assert third.replay
    assert shop.receiver.count("refund") == 1
    assert len(store.approvals()) == 1


def test_a_number_written_as_an_int_or_a_float_is_one_operation(make_gate: MakeGate, store: SQLStore) -> None:
    """A "number" argument is not made an int by freezing: 1200 and 1200.0 must still hash alike."""
    rec = EffectRecorder()
    gate = make_gate(pay_table(rec))
    first = gate.call("pay", {"to": "acct", "amount": 1200}, ctx("m1"))
    again = gate.call("pay", {"to": "acct", "amount": 1200.0}, ctx("m1"))
    assert isinstance(again, Pending)
    assert (again.version, again.replay) == (1, True)
    run(gate, first)
    third = gate.call("pay", {"to": "acct", "amount": 1200.0}, ctx("m1"))
    assert isinstance(third, Executed)
    assert third.replay
    assert rec.count("pay") == 1
    assert len(store.approvals()) == 1


# -- a replay after the approval ended


@pytest.mark.parametrize("end", ["denied", "expired", "executed", "amended"])
def test_a_replay_after_its_approval_ended_registers_nothing_new(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, end: str
) -> None:
    """After a denial, an expiry, an execution, or an amendment by a later message that then ran,
    the first message replayed (with its own arguments, or arguments that came out differently)
    is answered from that approval: no second approval, no second refund."""
    shop, gate = shop_gate
    first = gate.call("refund_order", REFUND, ctx("m1"))
    assert isinstance(first, Pending)
    if end == "denied":
        gate.deny(first.approval_id, version=1, approver=FINANCE, reason="no")
    elif end == "expired":
        clock.advance(10**6)
    elif end == "executed":
        run(gate, first)
    else:
        run(gate, gate.call("refund_order", {**REFUND, "amount": 1100}, ctx("m2")))
    for args in (REFUND, {**REFUND, "amount": 1000}):
        again = gate.call("refund_order", args, ctx("m1"))
        assert isinstance(again, Executed if end in ("executed", "amended") else Refused), again
    assert len(store.approvals()) == 1
    assert shop.receiver.count("refund") == (1 if end in ("executed", "amended") else 0)


# -- ids a database treats specially


def test_long_ids_and_like_wildcards_key_one_operation(shop_gate: ShopGate, store: SQLStore) -> None:
    """An origin id far over a PostgreSQL btree entry (no index holds it), '%' and '_' in the ids,
    a session id near its limit: the write runs once, the refund waits once and replays."""
    shop, gate = shop_gate
    call = CallContext(
        session_id="s%_" * 600, origin_message_id="%_m" * 3000, user_id="u1", agent_id="support"
    )
    tags = {"ticket_id": "t-17", "tags": ["a"]}
    gate.call("update_ticket_tags", tags, call)
    again = gate.call("update_ticket_tags", tags, call)
    assert isinstance(again, Executed)
    assert again.replay
    first = gate.call("refund_order", REFUND, call)
    replayed = gate.call("refund_order", REFUND, call)
    assert isinstance(replayed, Pending)
    assert isinstance(first, Pending)
    assert (replayed.approval_id, replayed.replay) == (first.approval_id, True)
    assert shop.receiver.count("ticket_tags") == 1
    assert len(store.approvals()) == 1


def test_two_sessions_racing_one_origin_id_on_one_subject_register_one_approval(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Origin ids are per session: two sessions sending "m1" at once for the same order end with
    one approval (the other session is told the subject is busy), each replay finding it."""
    _, gate = shop_gate
    barrier = threading.Barrier(4)
    outs: list[Any] = []
    lock = threading.Lock()

    def go(session: str) -> None:
        barrier.wait()
        out = gate.call("refund_order", REFUND, ctx("m1", session=session))
        with lock:
            outs.append(out)

    threads = [threading.Thread(target=go, args=(s,)) for s in ("sa", "sb", "sa", "sb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    [row] = store.approvals()
    assert len(outs) == 4
    assert {o.approval_id for o in outs} == {row.id}
    assert sum(isinstance(o, Refused) and o.code == "subject_busy" for o in outs) == 2


# -- a reclassified tool: the same call of the same message runs once


def test_a_call_that_ran_as_a_write_is_not_proposed_again_after_its_tool_became_money(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`pay` ran as a write for m1; the table then gates it (money). Replaying m1 must answer the
    stored result: before, it registered a new approval, and an approver granting it paid twice."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.WRITE))
    assert isinstance(before.call("pay", {"to": "acct", "amount": 5}, ctx("m1")), Executed)
    after = make_gate(pay_table(rec, Effect.MONEY), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 5}, ctx("m1"))
    assert isinstance(again, Executed), again
    assert (again.replay, again.result) == (True, {"paid": 5})
    assert store.approvals() == []
    assert rec.count("pay") == 1
    # another message, or other arguments, is another operation: proposed as usual
    assert isinstance(after.call("pay", {"to": "acct", "amount": 5}, ctx("m2")), Pending)


def test_a_write_whose_outcome_is_unknown_is_not_proposed_after_its_tool_became_money(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The write's provider timed out (it may have paid): after the reclassification its replay
    is answered needs_reconciliation, never a card an approver could grant."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.WRITE))
    with pytest.raises(NeedsReconciliation):
        before.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    after = make_gate(pay_table(rec, Effect.MONEY), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 13}, ctx("m1"))
    assert isinstance(again, Refused), again
    assert again.code == "needs_reconciliation"
    assert store.approvals() == []
    assert rec.count("pay") == 1


def test_a_paid_call_is_not_run_again_as_a_write_after_its_tool_was_downgraded(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """m1's payment was approved and ran; the table then makes `pay` a write. Replaying m1 ran
    it again, with no approval (a second payment): it answers the stored result."""
    rec = EffectRecorder()
    before = make_gate(pay_table(rec, Effect.MONEY))
    first = run(before, before.call("pay", {"to": "acct", "amount": 5}, ctx("m1")))
    after = make_gate(pay_table(rec, Effect.WRITE), keyring=before.keyring)
    again = after.call("pay", {"to": "acct", "amount": 5}, ctx("m1"))
    assert isinstance(again, Executed)
    assert (again.replay, again.result, again.approval_id) == (True, {"paid": 5}, first.approval_id)
    assert rec.count("pay") == 1
    assert [e.status for e in store.executions()] == ["succeeded"]


# -- the same call written two ways the key does not equate


_DEFAULTS = (
    "design decision: an argument left out and its schema default given explicitly are one call "
    "to the tool (subject_of and role_for already read the default), but the args hash, the "
    "write key and a subject-less intent key hash the arguments as written. Fix: fill the "
    "schema's defaults into the frozen arguments of write and gated calls in Calls.route (after "
    "validation; what the tool receives, is hashed and recorded). It changes the keys of "
    "calls that left a default out: a replay across the upgrade is a new operation"
)


@pytest.mark.xfail(strict=True, reason=_DEFAULTS)
@pytest.mark.parametrize("effect", [Effect.WRITE, Effect.SEND])
def test_a_replay_that_spells_out_a_default_argument_runs_nothing_twice(
    make_gate: MakeGate, store: SQLStore, effect: Effect
) -> None:
    """m1's blast ran with `loud` left out (its default, False); the replay of m1 writes
    loud=False. A write runs again; a send (no subject) is a second approval, and a second blast
    once granted."""
    rec = EffectRecorder()
    gate = make_gate(blast_table(rec, effect))
    out = gate.call("blast", {"text": "hi"}, ctx("m1"))
    if isinstance(out, Pending):
        run(gate, out, LEAD)
    again = gate.call("blast", {"text": "hi", "loud": False}, ctx("m1"))
    if isinstance(again, Pending):
        run(gate, again, LEAD)
    assert rec.count("blast") == 1
    assert isinstance(again, Executed)
    assert again.replay


@pytest.mark.xfail(
    strict=True,
    reason=(
        "design decision: a subject argument whose schema takes a value or a list of them names "
        "'acct' and ['acct'] as two subjects (table._as_set sets lists only). Fix in _as_set (a "
        "one-item list as its item, or a scalar as a one-item list, where the schema admits "
        "both); it changes stored subject keys, so a waiting approval's replay across the "
        "upgrade would be refused as tampered (Proposals.keyed) unless both are looked up"
    ),
)
def test_a_subject_given_as_a_one_item_list_is_the_same_subject_as_the_item(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """`to` takes "acct" or ["acct"]: m1 paid "acct"; its replay with ["acct"] is a new approval,
    and a second payment once granted."""
    rec = EffectRecorder()
    either = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    gate = make_gate(pay_table(rec, to=either))
    run(gate, gate.call("pay", {"to": "acct", "amount": 5}, ctx("m1")))
    again = gate.call("pay", {"to": ["acct"], "amount": 5}, ctx("m1"))
    if isinstance(again, Pending):
        run(gate, again)
    assert rec.count("pay") == 1
    assert isinstance(again, Executed)
