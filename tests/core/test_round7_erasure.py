"""Round 7: erasure and legal holds under races, crashes and odd inputs (SQLite and PostgreSQL).

Each test greps the raw database rows (`everything`) for the erased value, or counts what the
pass refused, rather than reading any output text."""

from __future__ import annotations

import json
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
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.audit import audit
from effectgate.errors import AlreadyDecided, TamperedRecord, TokenError
from effectgate.redact import RedactionError, redact, retain
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_redact import everything

SECRET = "ada-home-address-42-lovelace-lane"
DAY = 86400.0
ALL_KINDS = ("read", "write", "send", "money", "destructive", "unclassified")


def _ctx(message: str, user: str = "u1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message, user_id=user, agent_id="support")


class _Died(BaseException):
    """The worker dies mid-run (not an Exception: nothing in the gate settles the record)."""


class Notes:
    """An ungated write whose provider keeps what it was sent (found again by `reconcile`)."""

    def __init__(self) -> None:
        self.calls = 0
        self.applied: dict[str, dict[str, Any]] = {}
        self.during: Any = None  # run inside the tool, while the write is in flight

    def post(self, ticket_id: str, text: str, tool_context: ToolContext) -> dict[str, Any]:
        self.calls += 1
        idempotency_key = tool_context.idempotency_key
        self.applied[idempotency_key] = {"ticket_id": ticket_id, "text": text}
        if self.during is not None:
            self.during()
        return self.applied[idempotency_key]

    def lookup(self, key: str) -> Reconciled | None:
        if key in self.applied:
            return Reconciled(found=True, result=self.applied[key])
        return Reconciled(found=False)

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="post",
                    effect=Effect.WRITE,
                    fn=self.post,
                    owner="support",
                    subject=("ticket_id",),
                    reconcile=self.lookup,
                )
            ]
        )
        table.allow("support", ["post"])
        return table


def test_a_redaction_is_refused_while_a_write_of_the_user_is_running(make_gate: MakeGate) -> None:
    notes = Notes()
    gate = make_gate(notes.table())
    outcome: list[object] = []

    def erase() -> None:
        try:
            outcome.append(redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request"))
        except RedactionError as exc:
            outcome.append(exc)

    notes.during = erase
    assert isinstance(gate.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1")), Executed)
    gate.flush()
    assert notes.calls == 1
    [what] = outcome
    # documented: a user with a call that may still run is refused (else the erasure reports
    # done while the write's arguments and result land in the ledger right after it)
    assert isinstance(what, RedactionError)


def test_retention_erases_a_recovered_writes_reconciled_result(make_gate: MakeGate, clock: FakeClock) -> None:
    notes = Notes()
    gate = make_gate(notes.table())

    def die() -> None:
        raise _Died

    notes.during = die
    with pytest.raises(_Died):
        gate.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1"))
    notes.during = None
    gate.close()  # the dead worker's lease is never renewed again
    gate = make_gate(notes.table(), keyring=gate.keyring)
    clock.advance(gate.policy.lease_seconds + 1)
    assert gate.recover()
    gate.flush()
    assert notes.calls == 1
    assert SECRET in everything(gate.store)
    clock.advance(2 * DAY)
    retain(gate.store, gate.keyring, dict.fromkeys(ALL_KINDS, 1), by="nightly", now=clock.now())
    assert SECRET not in everything(gate.store)
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


FINANCE = Approver("fiona", "finance")
LEAD = Approver("sam", "lead")


def _payments(make_gate: MakeGate) -> tuple[EffectGate, list[str]]:
    runs: list[str] = []

    def pay(order_id: str, amount: int, note: str) -> dict[str, Any]:
        runs.append(order_id)
        return {"paid": note}

    def send(to: str, body: str) -> dict[str, Any]:
        runs.append(to)
        return {"sent": to}

    table = EffectTable(
        [
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("order_id",)),
            ToolSpec(name="send", effect=Effect.SEND, fn=send, approver_role="lead", subject=("to",)),
        ]
    )
    table.allow("support", ["pay", "send"])
    return make_gate(table), runs


def test_a_used_grant_of_an_erased_call_is_refused_as_used_not_tampered(make_gate: MakeGate) -> None:
    """Presenting a grant again (a retry, a double submit) after its call ran and was erased: the
    refusal and its recorded event say "used", not "tampered" (a false alarm of an edited row)."""
    gate, runs = _payments(make_gate)
    pending = gate.call("pay", {"order_id": "o1", "amount": 5, "note": SECRET}, _ctx("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request")
    with pytest.raises(TokenError) as refused:
        gate.execute(grant.token)
    assert refused.value.reason == "used"
    gate.flush()
    assert runs == ["o1"]
    assert [json.loads(e.detail_json) for e in gate.store.events(kind="token_refused")] == [
        {"reason": "used"}
    ]
    assert SECRET not in everything(gate.store)
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_deciding_an_erased_call_again_says_already_decided_not_tampered(make_gate: MakeGate) -> None:
    """A reviewer's stale approve or deny of a call that was decided and then erased is refused
    as already decided, not as a record changed outside effectgate; nothing is recorded."""
    gate, runs = _payments(make_gate)
    pay = gate.call("pay", {"order_id": "o1", "amount": 5, "note": SECRET}, _ctx("m1"))
    send = gate.call("send", {"to": f"{SECRET}@example.com", "body": "hi"}, _ctx("m2"))
    assert isinstance(pay, Pending)
    assert isinstance(send, Pending)
    grant = gate.approve(pay.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    gate.deny(send.approval_id, version=1, approver=LEAD, reason=f"not to {SECRET}")
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request")
    decisions = len(gate.store.all_decisions())
    with pytest.raises(AlreadyDecided) as approved:
        gate.approve(send.approval_id, version=1, approver=LEAD)
    assert not isinstance(approved.value, TamperedRecord)
    assert approved.value.status == "denied"
    with pytest.raises(AlreadyDecided) as denied:
        gate.deny(pay.approval_id, version=1, approver=FINANCE, reason="too late")
    assert denied.value.status == "executed"
    assert len(gate.store.all_decisions()) == decisions
    assert runs == ["o1"]
    assert {a.status for a in gate.store.approvals()} == {"executed", "denied"}
    assert SECRET not in everything(gate.store)


def test_a_lapsed_grant_of_an_erased_call_is_refused_as_expired_not_tampered(
    make_gate: MakeGate, clock: FakeClock
) -> None:
    """A grant never presented, its approval's deadline passed (the call can never run, so a
    redaction erases it): presented after the erasure it is refused as expired, not tampered."""
    gate, runs = _payments(make_gate)
    pending = gate.call("pay", {"order_id": "o1", "amount": 5, "note": SECRET}, _ctx("m1"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    clock.advance(2 * DAY)
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request", now=clock.now())
    with pytest.raises(TokenError) as refused:
        gate.execute(grant.token)
    assert refused.value.reason == "expired"
    gate.flush()
    assert runs == []
    assert [json.loads(e.detail_json) for e in gate.store.events(kind="token_refused")] == [
        {"reason": "expired"}
    ]
    assert SECRET not in everything(gate.store)
