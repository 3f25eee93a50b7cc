"""Round 26, today's changes reviewed adversarially (schema 5, late erasure, grant rounds,
copied arguments and JSON results). SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from effectgate import Effect, EffectGate, EffectTable, Executed, ToolSpec
from effectgate.errors import LeaseLost, PolicyViolation
from effectgate.redact import DAY, RedactionError, redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate
from .test_round7_erasure import SECRET, Notes, _ctx, _Died
from .test_round14_reconcile import StalledPay, stalled_then_settled_failed


def _no_hook(notes: Notes) -> EffectTable:
    table = EffectTable(
        [ToolSpec(name="post", effect=Effect.WRITE, fn=notes.post, owner="support", subject=("ticket_id",))]
    )
    table.allow("support", ["post"])
    return table


def _late_write(
    make_gate: MakeGate, clock: FakeClock, erase: Callable[[EffectGate], None], *, raises: bool
) -> EffectGate:
    """A write that stalls past its lease; another worker recovers it, a person settles it "did
    not happen", `erase` runs, and the stalled run returns (LeaseLost)."""
    notes = Notes()
    first = make_gate(notes.table())
    other = make_gate(_no_hook(notes), keyring=first.keyring)

    def stall() -> None:
        notes.during = None
        clock.advance(first.policy.lease_seconds + 1)
        [key] = other.recover()
        other.settle(key, happened=False, by="fiona")
        clock.advance(2 * DAY)
        erase(other)
        if raises:  # its error quotes the erased value
            raise RuntimeError(f"could not post {SECRET}")

    notes.during = stall
    with pytest.raises(LeaseLost):
        first.call("post", {"ticket_id": "t-1", "text": SECRET}, _ctx("m1"))
    return first


def eraser(store: SQLStore, how: str) -> Callable[[EffectGate], None]:
    """Erase user u1 by `redact`, or by a retention pass for writes (`how`: "redact" or "retain")."""

    def erase(gate: EffectGate) -> None:
        if how == "redact":
            redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")
        else:
            retain(store, gate.keyring, {"write": 1}, by="dpo")

    return erase


def _dies_in_flight(
    gate: EffectGate, store: SQLStore, notes: Notes, args: dict[str, Any], mp: pytest.MonkeyPatch
) -> None:
    """u1's write of `args` whose worker dies mid-run: a dead worker releases nothing, so its record
    stays in flight until its lease runs out."""

    def die() -> None:
        raise _Died

    notes.during = die
    with mp.context() as dead:
        dead.setattr(store, "release", lambda *_, **__: None)
        with pytest.raises(_Died):
            gate.call("post", args, _ctx("m1"))


@pytest.mark.parametrize("raises", [False, True], ids=["returned", "raised"])
@pytest.mark.parametrize("how", ["redact", "retain"])
def test_a_late_write_after_its_erasure_does_not_bring_the_values_back(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, how: str, raises: bool
) -> None:
    gate = _late_write(make_gate, clock, eraser(store, how), raises=raises)
    [late] = store.executions()  # the late run is recorded, its arguments erased
    assert late.status == "needs_reconciliation"
    rows = [(t, row) for t, row in store.every_row()]
    assert [(t, row) for t, row in rows if any(SECRET in str(v) for v in row.values())] == []
    assert gate.audit().findings == []


def test_a_late_grant_after_a_retention_pass_does_not_bring_the_values_back(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)

    def erase() -> None:  # the call ended ("did not happen"); a retention pass erases it
        clock.advance(2 * DAY)
        retain(store, first.keyring, {"money": 1}, by="dpo")

    stalled_then_settled_failed(bank, first, other, clock, then=erase)
    rows = [row for _, row in store.every_row()]
    assert not any('"a1"' in str(value) for row in rows for value in row.values())
    assert first.audit().findings == []


def test_a_retried_write_of_a_record_naming_no_user_refuses_a_redaction_while_it_runs(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record schema 4 wrote names no user: its write settled "did not happen" (no execution
    row) and run again after the upgrade is in flight under the user it runs for, as a new one is
    (before: the retry kept no user, and `redact` erased the user while it ran)."""
    notes = Notes()
    gate = make_gate(notes.table())
    other = make_gate(_no_hook(notes), keyring=gate.keyring)
    args = {"ticket_id": "t-1", "text": SECRET}

    _dies_in_flight(gate, store, notes, args, monkeypatch)
    clock.advance(gate.policy.lease_seconds + 1)
    [key] = other.recover()
    other.settle(key, happened=False, by="fiona")
    assert store.executions() == []
    with store.transaction() as conn:  # as schema 4 left it: no user named
        conn.exec_driver_sql("UPDATE eg_idempotency SET user_id = NULL")
    outcome: list[object] = []

    def erase() -> None:
        try:
            outcome.append(redact(store, gate.keyring, user_id="u1", by="dpo", reason="request"))
        except RedactionError as exc:
            outcome.append(exc)

    notes.during = erase
    assert isinstance(gate.call("post", args, _ctx("m1")), Executed)
    [what] = outcome
    assert isinstance(what, RedactionError)
    assert store.get(key).user_id == "u1"  # type: ignore[union-attr]


def test_a_before_snapshot_changing_its_arguments_changes_nothing_the_tool_runs(make_gate: MakeGate) -> None:
    """The tool runs with the arguments checked, hashed and recorded, whatever the row's
    before-snapshot does with the arguments it is given (the after-snapshot's are the tool's own
    copy already, round 26)."""
    receiver = EffectRecorder()

    def tag(ticket_id: str, tags: list[str]) -> dict[str, Any]:
        """Tag a ticket."""
        receiver.record("tag", ticket_id=ticket_id, tags=list(tags))
        return {"ticket_id": ticket_id}

    def snapshot(args: dict[str, Any]) -> dict[str, Any]:
        seen = {"ticket_id": args["ticket_id"], "tags": list(args["tags"])}
        args["tags"].append("injected")  # a snapshot that normalises in place
        args["ticket_id"] = "t-other"
        return seen

    table = EffectTable(
        [ToolSpec(name="tag", effect=Effect.WRITE, fn=tag, owner="support", snapshot=snapshot)]
    )
    table.allow("support", ["tag"])
    gate = make_gate(table)
    outcome = gate.call("tag", {"ticket_id": "t-1", "tags": ["a"]}, _ctx("m1"))
    assert isinstance(outcome, Executed)
    assert [e.payload for e in receiver.effects] == [{"ticket_id": "t-1", "tags": ["a"]}]
    assert outcome.before == {"ticket_id": "t-1", "tags": ["a"]}


def test_a_late_write_erased_is_not_reconciled_with_its_erased_arguments(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """Its call ended and was erased: as for an approval, reconciling or settling it is refused
    (`not_reconcilable`), nothing changed (before: an execution copying the erased arguments'
    marker, which no entry seals, was appended with the provider's result in clear)."""

    def erase(gate: EffectGate) -> None:
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")

    gate = _late_write(make_gate, clock, erase, raises=False)
    [record] = store.idempotency_records()
    for settle_again in (
        lambda: gate.reconcile(record.key),
        lambda: gate.settle(record.key, happened=True, result={"text": SECRET}, by="fiona"),
        lambda: gate.settle(record.key, happened=False, by="fiona"),
    ):
        with pytest.raises(PolicyViolation) as refused:
            settle_again()
        assert refused.value.code == "not_reconcilable"
    assert store.get(record.key) == record
    assert len(store.executions()) == 1
    assert gate.audit().findings == []


def test_a_write_run_again_after_its_erased_attempt_is_settled_without_copying_the_marker(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first attempt failed and was erased; the same call made again dies in flight: a person
    settles that attempt (it is no late run of an erased call), and no row copies the first
    attempt's marker (which no entry seals for it)."""
    notes = Notes()
    table = EffectTable(
        [
            ToolSpec(
                name="post",
                effect=Effect.WRITE,
                fn=notes.post,
                owner="support",
                subject=("ticket_id",),
                definite_failures=(ValueError,),
            )
        ]
    )
    table.allow("support", ["post"])
    gate = make_gate(table)
    args = {"ticket_id": "t-1", "text": SECRET}

    def refuse() -> None:
        raise ValueError("refused by the service")

    notes.during = refuse
    with pytest.raises(ValueError, match="refused by the service"):
        gate.call("post", args, _ctx("m1"))
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")

    _dies_in_flight(gate, store, notes, args, monkeypatch)
    clock.advance(gate.policy.lease_seconds + 1)
    [key] = gate.recover()
    assert gate.settle(key, happened=False, by="fiona") is None
    record = store.get(key)
    assert record is not None
    assert record.status == "failed"
    assert gate.audit().findings == []
