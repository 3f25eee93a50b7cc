"""An export's manifest pins the ledger's chain heads (`effectgate._pins`), on SQLite and
PostgreSQL. The attacker has the database's owner rights: the append-only triggers are dropped,
the newest checkpoints deleted and a row they covered edited; the next seal covers the edited row
afresh, so the shorter chain verifies. Only something kept outside the database can tell, and
the signed manifest is that: the audit with its pins, and the next incremental export, refuse."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from effectgate import EffectGate, Executed, Keyring
from effectgate.audit import PINNED_NOTHING, audit
from effectgate.chain import seal_chain, verify_chain
from effectgate.cli import main
from effectgate.export import PURPOSE, ExportError, Manifest, export_chain, manifest_path
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .test_chain import ledger, sql, unguard

__all__ = ["ledger"]  # the fixture, shared with test_chain


def cut_back(gate: EffectGate, clock: FakeClock) -> None:
    """Delete every eg_events checkpoint, edit a covered row, and seal again: a chain that verifies."""
    store = gate.store
    unguard(store, "eg_events")
    unguard(store, "eg_chain")
    first = min(e.id for e in store.events() if e.id is not None)
    sql(store, "UPDATE eg_events SET user_id = 'someone-else' WHERE id = :id", id=first)
    sql(store, "DELETE FROM eg_chain WHERE table_name = 'eg_events'")
    seal_chain(store, gate.keyring, now=clock.now() + 61)


def test_the_manifest_pins_each_chained_tables_last_checkpoint(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    manifest = export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    assert manifest.heads is not None
    with ledger.store.reading() as conn:
        last = {c.table_name: (c.last_id, c.head) for c in ledger.store.checkpoints(conn)}
    assert {t: (p["last_id"], p["head"]) for t, p in manifest.heads.items()} == last
    assert set(last) == {"eg_decisions", "eg_executions", "eg_events"}
    # the pins are signed: the manifest on disk carries them and verifies
    loaded = Manifest.load(manifest_path(tmp_path / "a.jsonl"))
    assert loaded.heads == manifest.heads
    loaded.check(ledger.keyring)
    assert audit(ledger.store, keyring=ledger.keyring, chain=True, pinned=loaded.heads).clean


def test_a_chain_cut_back_below_the_pins_is_found_and_the_next_export_refused(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    first = export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    cut_back(ledger, clock)
    # the hole: without the pins, nothing in the database tells
    assert verify_chain(ledger.store, ledger.keyring) == []
    assert audit(ledger.store, keyring=ledger.keyring, chain=True).clean
    findings = audit(ledger.store, keyring=ledger.keyring, chain=True, pinned=first.heads).findings
    assert [(f.kind, f.tool) for f in findings] == [("chain_broken", "eg_events")]
    with pytest.raises(ExportError, match="audit --pinned"):
        export_chain(ledger.store, ledger.keyring, tmp_path / "b.jsonl", after=first, now=clock.now() + 61)
    assert not (tmp_path / "b.jsonl").exists()
    assert not manifest_path(tmp_path / "b.jsonl").exists()


def test_a_refused_export_writes_nothing_not_even_a_checkpoint(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    """Cut back without a seal after it: the refused export must not seal the edited rows into a
    checkpoint continuing the shortened chain (the refusal comes before any write)."""
    store = ledger.store
    first = export_chain(store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    unguard(store, "eg_events")
    unguard(store, "eg_chain")
    sql(
        store,
        "UPDATE eg_events SET user_id = 'someone-else' WHERE id = :id",
        id=min(e.id for e in store.events() if e.id is not None),
    )
    sql(store, "DELETE FROM eg_chain WHERE table_name = 'eg_events'")
    with store.reading() as conn:
        before = [c.model_dump() for c in store.checkpoints(conn)]
    with pytest.raises(ExportError, match="audit --pinned"):
        export_chain(store, ledger.keyring, tmp_path / "b.jsonl", after=first, now=clock.now() + 61)
    with store.reading() as conn:
        assert [c.model_dump() for c in store.checkpoints(conn)] == before
    assert not (tmp_path / "b.jsonl").exists()


def test_pins_need_the_keyring_and_imply_the_chain(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    """A pin proves nothing about rows unless the chain up to it verifies: `pinned` implies
    `chain`, and without a keyring it is refused rather than reported clean."""
    store = ledger.store
    first = export_chain(store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    with pytest.raises(ValueError, match="keyring"):
        audit(store, pinned=first.heads)
    unguard(store, "eg_events")
    sql(
        store,
        "UPDATE eg_events SET user_id = 'someone-else' WHERE id = :id",
        id=min(e.id for e in store.events() if e.id is not None),
    )  # under the pinned checkpoint: only the chain's recomputation finds it
    findings = audit(store, keyring=ledger.keyring, pinned=first.heads).findings
    assert [f.kind for f in findings] == ["chain_broken"]


def test_an_incremental_export_of_an_untouched_ledger_pins_the_new_heads(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    from effectgate.examples.shop import context

    first = export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    clock.advance(100)
    done = ledger.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["vip"]}, context("m9"))
    assert isinstance(done, Executed), done
    ledger.flush()
    second = export_chain(
        ledger.store, ledger.keyring, tmp_path / "b.jsonl", after=first, now=clock.now() + 61
    )
    assert first.heads is not None
    assert second.heads is not None
    assert second.heads["eg_executions"]["last_id"] > first.heads["eg_executions"]["last_id"]
    # both manifests' pins hold: a later checkpoint continues the pinned one
    for m in (first, second):
        assert audit(ledger.store, keyring=ledger.keyring, chain=True, pinned=m.heads).clean


def test_a_manifest_from_before_pins_still_verifies_and_pins_nothing(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    made = export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    # as an older effectgate wrote it: no "heads" field, signed without one
    old = replace(made, heads=None, signature="")
    old = replace(old, signature=ledger.keyring.sign(PURPOSE, old.body()))
    fields = asdict(old)
    del fields["heads"]
    path = tmp_path / "old.manifest.json"
    path.write_text(json.dumps(fields))
    loaded = Manifest.load(path)
    assert loaded.heads is None
    loaded.check(ledger.keyring)
    assert audit(ledger.store, keyring=ledger.keyring, chain=True, pinned=loaded.heads).clean


def test_pins_edited_in_the_manifest_break_its_signature(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    path = manifest_path(tmp_path / "a.jsonl")
    data = json.loads(path.read_text())
    data["heads"]["eg_events"]["last_id"] -= 1  # pin a shorter chain
    path.write_text(json.dumps(data))
    with pytest.raises(ExportError, match="signature"):
        Manifest.load(path).check(ledger.keyring)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_the_audit_command_checks_a_manifests_pins(
    ledger: EffectGate,
    clock: FakeClock,
    tmp_path: Path,
    cli: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ledger.store.url
    monkeypatch.setenv("EFFECTGATE_KEYRING", ledger.keyring.dumps())  # the ledger's keyring
    export_chain(ledger.store, ledger.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    pinned = str(manifest_path(tmp_path / "a.jsonl"))
    code, out, err = cli("audit", "--db", url, "--pinned", pinned)
    assert code == 0, err
    assert "pins no chain heads" not in out
    cut_back(ledger, clock)
    assert cli("audit", "--db", url, "--chain")[0] == 0  # the hole, without the pins
    code, out, _ = cli("audit", "--db", url, "--pinned", pinned, "--json")
    assert code == 1
    assert [(f["kind"], f["tool"]) for f in json.loads(out)["findings"]] == [("chain_broken", "eg_events")]
    code, _, err = cli("audit", "--db", url, "--pinned", str(tmp_path / "missing.json"))
    assert code != 0
    assert "no such file" in err


def test_pins_of_an_empty_ledger_are_said_to_pin_nothing(
    store: SQLStore,
    clock: FakeClock,
    tmp_path: Path,
    cli: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A manifest exported from an empty ledger pins no chain heads: its audit is clean (exit 0),
    and the report, its JSON and the terminal say that nothing was checked against the pins."""
    keyring = Keyring.generate()
    manifest = export_chain(store, keyring, tmp_path / "e.jsonl", now=clock.now() + 61)
    assert manifest.heads == {}
    monkeypatch.setenv("EFFECTGATE_KEYRING", keyring.dumps())
    pinned = str(manifest_path(tmp_path / "e.jsonl"))
    code, out, err = cli("audit", "--db", store.url, "--pinned", pinned)
    assert code == 0, err
    assert "note: the manifest pins no chain heads" in " ".join(out.split())
    code, out, _ = cli("audit", "--db", store.url, "--pinned", pinned, "--json")
    assert code == 0
    assert json.loads(out)["notes"] == [PINNED_NOTHING]
    report = audit(store, keyring=keyring, pinned=manifest.heads)
    assert report.clean
    assert report.notes == (PINNED_NOTHING,)
    assert audit(store, keyring=keyring, chain=True).notes == ()
