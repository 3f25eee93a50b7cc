"""Round 20 review of governance: sandbox replay, export, erasure and the report (SQLite and
PostgreSQL where a store is used).

- Replay ran every approved intent to success in its sandbox, whatever the ledger recorded: a
  refund declined by the provider (a definite failure) and one whose grant lapsed unpresented after
  its deadline (it can never run) each counted in the sandbox's refundable balance, so the retry
  the ledger really ran was reported `refused` (confirm_failed): a false finding on the commonest
  retry there is. Each intent now ends in the sandbox as it ended in the ledger.
- An approved call whose grant was not yet presented replayed `same` after a refactor that moved its
  tool's function (its table row's fingerprint changed), though `execute` now refuses that grant
  as reclassified: replay, run to catch that before a deploy, flags it `refused` now.
- A note listing several calls (`approval_ids`: the LangGraph adapter's interrupt record) belonged
  to whichever call's id sorted first, so `redact --subject` of a closed order was refused (naming
  that order's own call as still running) or not, by the ids' order, when another order's call
  shown in the same interrupt was pending. The note is the subject's whichever sorts first now,
  and stays, as retention leaves it, while another call it lists is open.
- `redact(keep=())` and `retain(keep=[])` erased the financial facts with the rest (the command
  refuses `--keep ""` for that reason; the library did not): refused now, nothing erased.
- A stub given to `replay(stubs=...)` that raises one of its row's definite failures ("card
  declined") escaped `replay` as that raw exception, losing the whole report; it is a `refused`
  verdict naming the failure now.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from effectgate import Approver, EffectGate, EffectTable, Executed, Grant, Keyring, Pending, ToolContext
from effectgate.errors import PolicyViolation
from effectgate.examples.shop import SHOP_POLICY, Shop, app, context
from effectgate.redact import RedactionError, is_redacted, redact, retain
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")


class Declined(Exception):
    """The provider's definite failure ("card declined")."""


def refund(amount: int) -> dict[str, Any]:
    return {"order_id": "1042", "amount": amount, "currency": "GBP"}  # order 1042's total: 12000


def declining(shop: Shop, failing: dict[str, bool]) -> EffectTable:
    """The shop's table whose refund raises `Declined` (a definite failure) while `failing["now"]`."""
    real = shop.table()
    refund_fn = real.get("refund_order")
    assert refund_fn is not None

    def refund_order(order_id: str, amount: int, currency: str, tool_context: ToolContext) -> Any:
        if failing["now"]:
            raise Declined("card declined")
        return refund_fn.fn(order_id=order_id, amount=amount, currency=currency, tool_context=tool_context)

    specs = [
        dataclasses.replace(s, fn=refund_order, definite_failures=(Declined,))
        if s.name == "refund_order"
        else s
        for s in real
    ]
    table = EffectTable(specs)
    for agent in real.agents():
        table.allow(agent, real.allowlist(agent))
    return table


def granted(gate: EffectGate, message: str, amount: int) -> Grant:
    out = gate.call("refund_order", refund(amount), context(message))
    assert isinstance(out, Pending), out
    return granted_of(gate, out)


def granted_of(gate: EffectGate, out: Pending) -> Grant:
    grant = gate.approve(out.approval_id, version=out.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def test_a_declined_refund_and_its_retry_replay_the_same(store: SQLStore, clock: FakeClock) -> None:
    """A refund the provider declined (definite failure: not counted against the order's balance)
    and the retry that ran replay the same: the sandbox fails the first as the ledger did, so the
    retry's balance check counts what the ledger's counted."""
    shop, failing = Shop(), {"now": True}
    table = declining(shop, failing)
    with EffectGate(table, store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        with pytest.raises(Declined):
            gate.execute(granted(gate, "m1", 8000).token)
        failing["now"] = False
        clock.advance(10)
        assert isinstance(gate.execute(granted(gate, "m2", 8000).token), Executed)
        report = replay(store, table, SHOP_POLICY, keyring=gate.keyring)
    assert [(r.verdict, r.detail) for r in report.results] == [("same", ""), ("same", "")]
    assert [c["amount"] for c in report.calls["refund_order"]] == [8000, 8000]  # each ran once there
    assert shop.receiver.count("refund") == 1  # the retry, in the ledger; nothing real in the replay


def test_an_approval_whose_grant_lapsed_after_its_deadline_is_not_run_in_the_sandbox(
    store: SQLStore, clock: FakeClock
) -> None:
    """An approved refund whose grant lapsed unpresented after its approval's deadline never ran
    and never can: replayed, it is granted again but not run, so the refund the user then asked for
    anew (and that ran) replays the same instead of failing the balance check."""
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        granted(gate, "m1", 8000)
        clock.advance(SHOP_POLICY.pending_ttl + SHOP_POLICY.token_ttl + 10)
        assert isinstance(gate.execute(granted(gate, "m2", 8000).token), Executed)
        report = replay(store, shop.table(), SHOP_POLICY, keyring=gate.keyring)
    assert [(r.verdict, r.detail) for r in report.results] == [("same", ""), ("same", "")]
    assert [c["amount"] for c in report.calls["refund_order"]] == [8000]  # only the one that ran
    assert shop.receiver.count("refund") == 1


def test_a_stub_that_fails_definitely_is_a_refused_verdict_not_a_crash(
    store: SQLStore, clock: FakeClock
) -> None:
    """A stub raising its row's definite failure is the replay's answer for that intent (`refused`,
    naming it); the report of the other intents is not lost to a raw exception."""
    shop, failing = Shop(), {"now": False}
    table = declining(shop, failing)
    with EffectGate(table, store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        assert isinstance(gate.execute(granted(gate, "m1", 500).token), Executed)
        keyring = gate.keyring

    def declines(**args: Any) -> Any:
        raise Declined("card declined")

    report = replay(store, table, SHOP_POLICY, keyring=keyring, stubs={"refund_order": declines})
    [result] = report.results
    assert result.verdict == "refused"
    assert "Declined: card declined" in result.detail
    assert shop.receiver.count("refund") == 1


def test_an_approved_call_still_to_run_whose_row_changed_is_flagged_not_same(
    store: SQLStore, clock: FakeClock
) -> None:
    """After a refactor that moved a tool's function (its table row's fingerprint changes), a grant
    not yet presented is refused by `execute` as reclassified: replay, meant to catch exactly that
    before a deploy, must not call the intent `same`."""
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        grant = granted(gate, "m1", 500)
        keyring = gate.keyring
    moved = declining(shop, {"now": False})  # the same refund, its function moved (and a failure listed)
    [result] = replay(store, moved, SHOP_POLICY, keyring=keyring).results
    assert (result.verdict, result.detail.split(":")[0]) == ("refused", "reclassified")
    after_deploy = EffectGate(moved, store, policy=SHOP_POLICY, keyring=keyring, clock=clock)
    with after_deploy, pytest.raises(PolicyViolation, match="changed in the effect table"):
        after_deploy.execute(grant.token)
    assert shop.receiver.count("refund") == 0
    # the table it was proposed under still replays it the same (nothing real runs)
    assert [r.verdict for r in replay(store, shop.table(), SHOP_POLICY, keyring=keyring).results] == ["same"]
    assert shop.receiver.count("refund") == 0


@pytest.mark.parametrize("first", ["subject", "other"])
def test_a_note_shared_with_another_subjects_open_call_neither_blocks_nor_goes(
    store: SQLStore, clock: FakeClock, first: str
) -> None:
    """A note listing several calls (the LangGraph adapter's record of an interrupt, `approval_ids`)
    belonged to whichever call's id sorted first: redacting order 1042 (closed) was refused, naming
    1042's own call as still running, when 1042's id sorted first and 1043's call (shown in the
    same interrupt) was still pending; with the ids the other way round it went through. Now the
    note is the subject's whichever sorts first, and stays while the other call is open (its
    answer is checked against it): the redaction goes through; once that call is closed, the next
    redaction of the subject erases the note too."""
    names = iter(["a-1042", "b-1043"] if first == "subject" else ["b-1042", "a-1043"])
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), ids=lambda: next(names))
    with gate:
        shown = gate.call("refund_order", refund(100), context("m1"))
        other = gate.call("refund_order", {**refund(100), "order_id": "1043"}, context("m2"))
        assert isinstance(shown, Pending)
        assert isinstance(other, Pending)
        assert isinstance(gate.execute(granted_of(gate, shown).token), Executed)
        ids = sorted([shown.approval_id, other.approval_id])
        note = {"interrupt_id": "i-1", "slot": 0, "approval_ids": ids}
        with store.transaction() as conn:
            store.append_events(
                conn,
                [
                    {
                        "at": clock.now(),
                        "kind": "langgraph_interrupt_shown",
                        "session_id": "s-ada",
                        "user_id": "u1",
                        "detail_json": note,
                    }
                ],
            )
        subject = {"order_id": "1042"}
        done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="r", subject=subject)
        assert done.rows > 0
        [kept] = store.events(kind="langgraph_interrupt_shown")
        assert json.loads(kept.detail_json or "") == note  # the open call's answer is checked against it
        gate.deny(other.approval_id, approver=FINANCE, reason="duplicate")
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="r", subject=subject)
        [erased] = store.events(kind="langgraph_interrupt_shown")
        assert is_redacted(erased.detail_json or "")
        assert json.loads(erased.detail_json or "")["interrupt_id"] == "i-1"  # where it was answered


@pytest.mark.parametrize("keep", [(), []])
def test_a_keep_naming_nothing_is_refused_by_the_library_too(
    shop_gate: ShopGate, clock: FakeClock, keep: Sequence[str]
) -> None:
    """`redact(keep=())` (a list of facts read from a setting left empty) erased the refund's amount
    and currency with the rest, which no later pass brings back; the command refused `--keep ""`
    for that reason, the library did not. Refused now, nothing erased, by `redact` and `retain`."""
    gate = shop_gate.gate
    assert isinstance(gate.execute(granted(gate, "m1", 500).token), Executed)
    before = [a.args_json for a in gate.store.approvals()]
    with pytest.raises(RedactionError, match="keep must"):
        redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="r", keep=keep)
    with pytest.raises(RedactionError, match="keep must"):
        retain(gate.store, gate.keyring, {"money": 0}, by="nightly", keep=keep, now=clock.now())
    assert [a.args_json for a in gate.store.approvals()] == before
    assert json.loads(before[0])["amount"] == 500
