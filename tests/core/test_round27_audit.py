"""Round 27: audit, export and report after today's changes (late-run erasure, grant rounds in
tokens, retention of a dead write's record), on SQLite and PostgreSQL.

Held: exports after a late run's erasure (redact or retention) and after a dead write's retention
verify and carry no erased value; a file exported before the erasure is erased by `redact_export`;
a release then regrant (also two approvers a round) audits clean, exports the round that ran it
and is counted once by the report. A user whose late run was erased with its call could never be
redacted again (the reopened record counted as an open call that nothing can settle): such a
record is no open call (`stores._redaction`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectGate, EffectTable, Executed, Grant, Pending, ToolSpec
from effectgate._audit_sealed import sealed_entries
from effectgate.audit import audit
from effectgate.examples.shop import context
from effectgate.export import export_chain, redact_export, verify_export
from effectgate.redact import DAY, redact, retain
from effectgate.report import figures
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate
from .test_round7_erasure import SECRET, _ctx, _Died
from .test_round14_reconcile import StalledPay, stalled_then_settled_failed
from .test_round26_today import _late_write, eraser

FINANCE = Approver("fiona", "finance")
FRED = Approver("fred", "finance")


def _text(path: Path) -> str:
    """The personal values of an export file's lines (outside its chain), as one text."""
    lines = [json.loads(t) for t in path.read_text().splitlines() if t]
    return " ".join(str(v) for line in lines for v in line["personal"].values())


def _export(gate: EffectGate, clock: FakeClock, path: Path, after: Any = None) -> Any:
    manifest = export_chain(gate.store, gate.keyring, path, after=after, now=clock.now() + 61)
    assert verify_export(path, gate.keyring, after=after).ok
    return manifest


@pytest.mark.parametrize("how", ["redact", "retain"])
def test_an_export_after_a_late_writes_erasure_verifies_and_holds_no_value(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, tmp_path: Path, how: str
) -> None:
    gate = _late_write(make_gate, clock, eraser(store, how), raises=True)
    assert audit(gate.store, keyring=gate.keyring, chain=True).findings == []
    path = tmp_path / "x.jsonl"
    _export(gate, clock, path)
    assert SECRET not in _text(path)
    assert redact_export(path, store=store, user_id="u1", erased=sealed_entries(store, gate.keyring)) == 0
    assert verify_export(path, gate.keyring).ok


def test_a_late_grant_erased_exports_and_an_earlier_file_is_erased(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, tmp_path: Path
) -> None:
    """A file exported after the call was settled "did not happen" (its failed execution in clear);
    the call is redacted, its stalled run returns and is erased with it. The earlier file is erased
    by `redact_export`, the next export continues it and verifies, and neither holds the account."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)
    before, later = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    manifests: list[Any] = []

    def erase() -> None:
        clock.advance(DAY)
        manifests.append(_export(first, clock, before))
        assert '"a1"' in _text(before)
        redact(store, first.keyring, user_id="u1", by="dpo", reason="request")

    stalled_then_settled_failed(bank, first, other, clock, then=erase)
    assert audit(first.store, keyring=first.keyring, chain=True).findings == []
    assert redact_export(before, store=store, user_id="u1", erased=sealed_entries(store, first.keyring)) == 1
    assert verify_export(before, first.keyring).ok
    _export(first, clock, later, after=manifests[0])
    for path in (before, later):
        assert '"a1"' not in _text(path)
    assert figures(store, keyring=first.keyring).unverified == 0


def test_a_late_grant_reconciled_then_redacted_leaves_no_value_in_the_export(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, tmp_path: Path
) -> None:
    """The late run returns before any erasure (recorded, needing reconciliation); it is exported,
    reconciled, then the user's records are redacted with the file: nothing of theirs is left in
    the file, which verifies; the audit is clean, and the report counts the call once."""
    bank = StalledPay()
    first = make_gate(bank.table())
    other = make_gate(bank.table(hook=False), keyring=first.keyring)
    grant = stalled_then_settled_failed(bank, first, other, clock, then=lambda: None)
    assert first.audit().findings == []
    path = tmp_path / "x.jsonl"
    _export(first, clock, path)
    first.reconcile(grant.approval_id)
    redact(store, first.keyring, user_id="u1", by="dpo", reason="request")
    redact_export(path, store=store, user_id="u1", erased=sealed_entries(store, first.keyring))
    assert verify_export(path, first.keyring).ok
    assert '"a1"' not in _text(path)
    assert audit(first.store, keyring=first.keyring, chain=True).findings == []
    found = figures(store, keyring=first.keyring)
    assert found.unverified == 0
    assert found.metrics.proposals == 1
    assert [(r.tool, r.decided) for r in found.metrics.decision_rates] == [("pay", 1)]


def _released_then_regranted(shop_gate: ShopGate) -> tuple[Pending, Grant]:
    args = {"order_id": "1042", "amount": 8000, "currency": "GBP"}
    pending = shop_gate.gate.call("refund_order", args, context("m1", session_id="s-ada"))
    assert isinstance(pending, Pending), pending
    first = shop_gate.gate.approve(pending.approval_id, version=1, approver=FINANCE)
    assert isinstance(first, Grant)
    shop_gate.gate.release(first.token)
    second = shop_gate.gate.approve(pending.approval_id, version=1, approver=FRED)
    assert isinstance(second, Grant)
    return pending, second


def test_a_released_then_regranted_call_audits_exports_and_reports_once(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    _, second = _released_then_regranted(shop_gate)
    gate = shop_gate.gate
    assert gate.audit().findings == []
    assert isinstance(gate.execute(second.token), Executed)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert audit(gate.store, keyring=gate.keyring, chain=True).findings == []
    path = tmp_path / "x.jsonl"
    _export(gate, clock, path)
    [line] = [json.loads(t) for t in path.read_text().splitlines() if t]
    assert [a["id"] for a in line["record"]["approvers"]] == ["fred"]  # the round that ran it
    found = figures(store, keyring=gate.keyring)
    assert found.unverified == 0
    assert found.metrics.proposals == 1
    [rates] = [r for r in found.metrics.decision_rates if r.tool == "refund_order"]
    assert (rates.decided, rates.approved) == (1, 1)


@pytest.mark.parametrize("rerun", ["succeeds", "fails"])
def test_a_dead_write_retained_then_run_again_audits_clean_and_exports(
    store: SQLStore,
    make_gate: MakeGate,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rerun: str,
) -> None:
    """A write whose worker died is settled "did not happen" (no execution row); a retention pass
    erases its record by its user (schema 5); the same call runs again, and is retained again.
    Each export continues the last one and verifies, the audit stays clean, no value is left."""
    mode = {"now": "die"}

    def post(ticket_id: str, text: str) -> dict[str, str]:
        """Post a note on a ticket."""
        if mode["now"] == "die":
            raise _Died
        if mode["now"] == "fails":
            raise ValueError(f"could not post {text}")
        return {"ticket_id": ticket_id, "text": text}

    table = EffectTable(
        [ToolSpec(name="post", effect=Effect.WRITE, fn=post, owner="support", subject=("ticket_id",))]
    )
    table.allow("support", ["post"])
    dead = make_gate(table)
    args = {"ticket_id": "t-1", "text": SECRET}
    with monkeypatch.context() as died:  # a dead worker releases nothing: its lease runs out
        died.setattr(store, "release", lambda *_, **__: None)
        with pytest.raises(_Died):
            dead.call("post", args, _ctx("m1"))
    dead.close()
    gate = make_gate(table, keyring=dead.keyring)
    clock.advance(gate.policy.lease_seconds + 1)
    [key] = gate.recover()
    gate.settle(key, happened=False, by="fiona")
    every = dict.fromkeys(("read", "write", "send", "money", "destructive", "unclassified"), 1)
    clock.advance(2 * DAY)
    assert retain(store, gate.keyring, every, by="nightly", now=clock.now()).values == 1
    first = _export(gate, clock, tmp_path / "a.jsonl")
    mode["now"] = rerun
    if rerun == "fails":
        with pytest.raises(ValueError, match="could not post"):
            gate.call("post", args, _ctx("m1"))
    else:
        assert isinstance(gate.call("post", args, _ctx("m1")), Executed)
    clock.advance(100)
    second = _export(gate, clock, tmp_path / "b.jsonl", after=first)
    clock.advance(2 * DAY)
    assert retain(store, gate.keyring, every, by="nightly", now=clock.now()).values > 0
    assert audit(store, table, keyring=gate.keyring, chain=True).findings == []
    _export(gate, clock, tmp_path / "c.jsonl", after=second)
    assert not any(SECRET in str(v) for _, row in store.every_row() for v in row.values())


def test_a_user_whose_late_write_was_erased_can_be_redacted_again(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """After the late run was erased with its call, the user makes a new call; erasing the user
    again (a second request) must not be blocked by the ended call nobody can reconcile."""

    def erase(gate: EffectGate) -> None:
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")

    gate = _late_write(make_gate, clock, erase, raises=False)
    assert isinstance(gate.call("post", {"ticket_id": "t-2", "text": SECRET}, _ctx("m2")), Executed)
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="second request")
    assert done.values > 0
    assert not any(SECRET in str(v) for _, row in store.every_row() for v in row.values())
    assert audit(store, keyring=gate.keyring).findings == []


def test_a_destructive_call_released_and_regranted_by_two_new_approvers_audits_clean(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """Each grant has its own round of two approvers: the run is vouched for by the second round
    alone (export), the audit is clean, and the report counts one approved call."""
    gate = shop_gate.gate
    pending = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m1"))
    assert isinstance(pending, Pending), pending
    people = [Approver(name, "privacy") for name in ("pia", "pat", "pam", "poe")]
    gate.approve(pending.approval_id, version=1, approver=people[0])
    first = gate.approve(pending.approval_id, version=1, approver=people[1])
    assert isinstance(first, Grant)
    gate.release(first.token)
    gate.approve(pending.approval_id, version=1, approver=people[2])
    assert audit(store, keyring=gate.keyring).findings == []
    second = gate.approve(pending.approval_id, version=1, approver=people[3])
    assert isinstance(second, Grant)
    assert isinstance(gate.execute(second.token), Executed)
    assert shop_gate.shop.receiver.count("delete") == 1
    assert audit(store, keyring=gate.keyring, chain=True).findings == []
    path = tmp_path / "x.jsonl"
    _export(gate, clock, path)
    [line] = [json.loads(t) for t in path.read_text().splitlines() if t]
    assert sorted(a["id"] for a in line["record"]["approvers"]) == ["pam", "poe"]
    found = figures(store, keyring=gate.keyring)
    assert (found.unverified, found.metrics.proposals) == (0, 1)
