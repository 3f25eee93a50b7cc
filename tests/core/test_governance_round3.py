"""Governance, third review round: erasure at its edges (each test failed on the code of its
round), on SQLite and PostgreSQL. A write whose worker died is reached through the user its
idempotency record names (schema 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, Executed
from effectgate import _audit_scan as scan_module
from effectgate import export as export_module
from effectgate.audit import audit
from effectgate.chain import seal_chain
from effectgate.examples.shop import context
from effectgate.export import export_chain, verify_export
from effectgate.redact import RedactionError, entries, redact
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_reconcile_edges import DyingTags, WorkerDied
from .test_redact import everything, ledger  # noqa: F401 - the fixture

SECRET = "ada.lovelace@example.com"


def test_a_write_in_flight_after_its_worker_died_refuses_the_users_redaction(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """u1's write is in flight (its worker died mid-call, its record in_progress): a call that may
    still run, so redact(u1) must be refused, as it is for an in-flight approval's call."""
    gate = make_gate(DyingTags().table())
    with pytest.raises(WorkerDied):
        gate.call("tag", {"ticket_id": "t1", "tags": ["vip"]}, context("m1"))
    [record] = store.idempotency_records()
    assert record.status == "in_progress"
    with pytest.raises(RedactionError):
        redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure")


def test_the_recovered_result_of_a_write_whose_worker_died_is_erased_with_its_user(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """recover() settles the write through its hook: the provider's result (u1's tag, an e-mail
    address) is stored in the idempotency record; redact(u1) reports done and leaves it."""
    tags = DyingTags()
    gate = make_gate(tags.table())
    with pytest.raises(WorkerDied):
        gate.call("tag", {"ticket_id": "t1", "tags": [SECRET]}, context("m1"))
    [record] = store.idempotency_records()
    clock.advance(gate.policy.lease_seconds + 1)
    assert gate.recover() == [record.key]
    settled = store.get(record.key)
    assert settled is not None
    assert settled.status == "succeeded"
    gate.flush()
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure")
    assert SECRET not in everything(store)
    again = gate.call("tag", {"ticket_id": "t1", "tags": [SECRET]}, context("m1"))
    assert isinstance(again, Executed)
    assert tags.receiver.count("tag") == 1


def test_an_export_racing_a_redaction_keeps_the_erased_values_commitments(
    ledger: EffectGate,  # noqa: F811 - the fixture
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An export read the redaction entries, then (in another transaction) the executions; a
    redaction of u1 committing in between (another process) left u1's erased values with an
    empty commitment inside the signed chain: the export no longer committed to what was erased
    (an auditor holding the erased text could not check it against the export)."""
    store, keyring = ledger.store, ledger.keyring
    real = export_module.entries

    def entries_then_a_redaction(s: Any) -> Any:
        found = real(s)
        redact(store, keyring, user_id="u1", by="dpo", reason="erasure")  # commits meanwhile
        return found

    monkeypatch.setattr(export_module, "entries", entries_then_a_redaction)
    path = tmp_path / "x.jsonl"
    export_chain(store, keyring, path, now=clock.now() + 61)
    assert verify_export(path, keyring).ok
    erased = entries(store)
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    ada = [line for line in lines if line["record"]["user_id"] == "u1"]
    assert ada
    assert all(line["record"]["redacted"] for line in ada)
    for line in ada:
        entry = erased[("eg_executions", str(line["seq"]), "args_json")]
        assert line["record"]["personal"]["args_json"] == entry.commitment


def test_an_audit_racing_a_redaction_finds_nothing_on_an_honest_ledger(
    ledger: EffectGate,  # noqa: F811 - the fixture
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The audit read the redaction entries (`Scan`), then the rows in a transaction of its own; a
    redaction of u1 committing in between (another process) made every value it erased a marker
    with no entry in the audit's copy: `redaction_forged` and `chain_broken` findings on an
    honest ledger (and `export_chain`, which audits first, refused to export)."""
    store, keyring = ledger.store, ledger.keyring
    seal_chain(store, keyring, now=clock.now() + 61)  # the values go into the chain as text
    real = scan_module.entries

    def entries_then_a_redaction(s: Any) -> Any:
        found = real(s)
        redact(store, keyring, user_id="u1", by="dpo", reason="erasure")  # commits meanwhile
        return found

    monkeypatch.setattr(scan_module, "entries", entries_then_a_redaction)
    report = audit(store, ledger.table, keyring=keyring, chain=True)
    monkeypatch.undo()
    assert entries(store)  # the redaction did commit
    assert report.findings == []


def test_an_audit_racing_a_redaction_of_event_details_only_keeps_the_chain_whole(
    ledger: EffectGate,  # noqa: F811 - the fixture
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """u3 has only an event (an application note quoting their e-mail), checkpointed. Their
    redaction commits between the audit's read of the entries and its chain check: no approval or
    execution argument was erased (the scan reads no entry again), and the chain was recomputed
    with the stale entries: the erased detail read as a marker no redaction wrote, `chain_broken`."""
    store, keyring = ledger.store, ledger.keyring
    ledger.note("contact_updated", ctx=context("n1", user_id="u3"), email=SECRET)
    ledger.flush()
    seal_chain(store, keyring, now=clock.now() + 61)
    real = scan_module.entries

    def entries_then_a_redaction(s: Any) -> Any:
        found = real(s)
        redact(store, keyring, user_id="u3", by="dpo", reason="erasure")  # commits meanwhile
        return found

    monkeypatch.setattr(scan_module, "entries", entries_then_a_redaction)
    report = audit(store, ledger.table, keyring=keyring, chain=True)
    monkeypatch.undo()
    assert any(key[0] == "eg_events" for key in entries(store))  # the redaction did commit
    assert report.findings == []
