"""Round 7 review of the tamper-evident export, its ledger chain and the export, verify and
seal-rules commands: a failed export never leaves the previous file replaced by one no manifest
vouches for, a symlink or a named pipe at the manifest's path is neither written through nor
waited on, a large whole amount the gate accepted is exported, a time of NaN is refused by the
seal, the export's refusals are exit 4 and a missing manifest exit 3, and seal-rules refuses a
foreign keyring. Strict xfails: what RFC 8785 cannot tell apart (1200 and 1200.0), and values
outside every seal (provider reference, grant token hash) signed into the export."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Effect, EffectGate, EffectTable, Executed, Keyring, ToolSpec
from effectgate.audit import audit
from effectgate.chain import ChainError
from effectgate.cli import main
from effectgate.examples.shop import context
from effectgate.export import ExportError, Manifest, export_chain, manifest_path, verify_export
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate
from .test_audit_rules import _execution
from .test_cli import Run, Setup, _cli_env, cli, refund  # noqa: F401 - the fixtures
from .test_decision_records import Provider, paying_gate, run_payment
from .test_export import ledger, rewrite  # noqa: F401 - the fixtures
from .test_redact import refund as redact_refund
from .test_round6_chain_audit import _pay_execution, edit
from .test_round6_chain_audit import ledger as chain_ledger
from .test_rule_seals import TAGS, _unsealed_ledger

Ledger = tuple[EffectGate, Path]


def test_an_export_whose_manifest_cannot_be_written_leaves_the_previous_file(
    ledger: Ledger,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The manifest is written before the file is renamed into place: when it cannot be written
    (here its path is a directory), the export fails and the file at the target is the one that
    was there, not a new chain that no manifest vouches for."""
    gate, _ = ledger
    target = tmp_path / "nightly.jsonl"
    target.write_text("the previous export\n")
    manifest_path(target).mkdir()
    with pytest.raises(IsADirectoryError):
        export_chain(gate.store, gate.keyring, target, now=2e9)
    assert target.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("nightly")) == [
        "nightly.jsonl",
        "nightly.jsonl.manifest.json",
    ]  # no partial left behind


def test_an_export_to_a_directory_leaves_the_manifest_beside_it(
    ledger: Ledger,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A target that is a directory is refused before anything is written: the manifest already
    beside it stays as it was, and no partial file is left to block the next export."""
    gate, _ = ledger
    target = tmp_path / "nightly.jsonl"
    target.mkdir()
    manifest_path(target).write_text("the previous manifest\n")
    with pytest.raises(ExportError):
        export_chain(gate.store, gate.keyring, target, now=2e9)
    assert manifest_path(target).read_text() == "the previous manifest\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("nightly")) == [
        "nightly.jsonl",
        "nightly.jsonl.manifest.json",
    ]


def test_a_symlink_at_the_manifests_path_is_replaced_not_written_through(
    ledger: Ledger,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Someone who can write the export directory plants FILE.manifest.json -> another file of the
    exporting user: the export replaces the link with its manifest and leaves that file alone."""
    gate, _ = ledger
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "nightly.jsonl"
    manifest_path(target).symlink_to(victim)
    export_chain(gate.store, gate.keyring, target, now=2e9)
    assert victim.read_text() == "precious\n"
    assert not manifest_path(target).is_symlink()
    assert verify_export(target, gate.keyring).ok


def test_verify_of_a_file_without_its_manifest_is_not_found(
    refund: Setup,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],  # noqa: F811
) -> None:
    """`verify FILE` when FILE.manifest.json is missing is exit 3 (no such file), as the exit
    code table says for a missing manifest, with one line naming it."""
    present = tmp_path / "present.jsonl"
    present.write_text("")
    run = cli("verify", "--db", refund.url, str(present))
    assert run.code == 3, run
    assert str(manifest_path(present)) in run.err


@pytest.mark.xfail(
    strict=True,
    reason="RFC 8785 hashes 1200, 1200.0 and -0.0/0 alike, and the line check re-serialises what was "
    "parsed, so an int written as a float (or back) is not seen; telling them apart needs a format "
    "decision (type-preserving hash, or fixing each field's number type)",
)
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"amount": 1200,', '"amount": 1200.0,'),
        ('"version": 1,', '"version": 1.0,'),
        ('"round": 0,', '"round": -0.0,'),
    ],
)
def test_a_number_written_another_way_is_a_changed_line(
    ledger: Ledger,  # noqa: F811
    old: str,
    new: str,
) -> None:
    """The README: "the same JSON written another way is a changed line". An integer rewritten as
    a float (an amount of 1200 as 1200.0, a version 1 as 1.0, a round 0 as -0.0) is such a line."""
    gate, path = ledger
    rows = path.read_text().splitlines()
    assert old in rows[1]
    rows[1] = rows[1].replace(old, new, 1)
    rewrite(path, rows)
    verdict = verify_export(path, gate.keyring)
    assert (verdict.ok, verdict.line) == (False, 2)


@pytest.mark.xfail(
    strict=True,
    reason="the provider reference lives only in eg_idempotency, a mutable table no seal, chain or "
    "audit covers; vouching for it needs a design decision (record it in the chained executions or "
    "events, or leave it out of the signed record)",
)
def test_a_provider_ref_edited_in_the_database_is_not_signed_into_an_export(
    make_gate: MakeGate, store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """Someone with write access to the database changes the provider's reference of a paid call
    (which charge it was): the export must refuse (as for any edited row) or carry the reference
    the tool recorded, never sign the edited one."""
    provider = Provider()
    gate = paying_gate(make_gate, provider)
    _, done = run_payment(gate)
    assert isinstance(done, Executed)
    assert len(provider.effects) == 1
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_idempotency SET provider_ref = 'prov-forged'"))
    target = tmp_path / "paid.jsonl"
    try:
        export_chain(store, gate.keyring, target, now=clock.now() + 61)
    except ExportError:
        return
    [line] = target.read_text().splitlines()
    assert json.loads(line)["record"]["provider_ref"] == "prov-1"


def test_a_large_whole_amount_the_gate_accepted_is_exported_and_verifies(
    make_gate: MakeGate, clock: FakeClock, tmp_path: Path
) -> None:
    """A model may pass a float amount as large as 1e16 where the schema says `number`: the gate
    accepts and records it (its canonical text is 10000000000000000, digits past 2**53). The
    export must still write that record (it crashed on it, and every later export with it, since
    an incremental export cannot get past a record), and the file verifies."""
    paid: list[float] = []

    def pay(account: str, amount: float) -> dict[str, Any]:
        paid.append(amount)
        return {"ok": True}

    table = EffectTable([ToolSpec(name="pay", effect=Effect.WRITE, fn=pay)])
    table.allow_all("support")
    gate = make_gate(table)
    assert isinstance(gate.call("pay", {"account": "a1", "amount": 1e16}, context("m1")), Executed)
    assert paid == [1e16]
    target = tmp_path / "big.jsonl"
    manifest = export_chain(gate.store, gate.keyring, target, now=clock.now() + 61)
    assert manifest.count == 1
    [line] = target.read_text().splitlines()
    assert json.loads(line)["record"]["args"] == {"amount": 1e16}
    assert verify_export(target, gate.keyring).ok


def test_seal_rules_with_a_keyring_that_is_not_the_ledgers_is_refused(
    shop_gate: ShopGate, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seal-rules` under another keyring (a stale $EFFECTGATE_KEYRING) sealed every rule row under
    a key the ledger does not know, said so (exit 0) and recorded a `rules_sealed` event, while
    the ledger's own audit still found the rows unsealed. Like redact, retain and export it
    refuses a keyring none of the ledger's newest seals verifies under (exit 4), writing nothing."""
    gate = shop_gate.gate
    _unsealed_ledger(shop_gate)
    redact_refund(gate, "m1", "1042", 1200)  # an approval and decisions sealed with the ledger's keyring
    rules_before = set(gate.store.rules())
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    assert main(["--db", store_url, "seal-rules", "--by", "ops"]) == 4
    assert set(gate.store.rules()) == rules_before
    assert [e for e in gate.store.events() if e.kind == "rules_sealed"] == []
    monkeypatch.setenv("EFFECTGATE_KEYRING", gate.keyring.dumps())
    assert main(["--db", store_url, "seal-rules", "--by", "ops"]) == 0
    assert audit(gate.store, keyring=gate.keyring).findings == []


def test_a_pipe_at_the_manifests_path_does_not_hang_an_incremental_export(
    ledger: Ledger,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`export --after` first reads what is at the target's manifest path (it must not be the
    earlier export's): a named pipe planted there blocked that read for ever. It is not a
    manifest: the export goes on and replaces it with its own."""
    gate, first = ledger
    after = Manifest.load(manifest_path(first))
    target = tmp_path / "next.jsonl"
    os.mkfifo(manifest_path(target))
    done: list[Manifest] = []
    worker = threading.Thread(
        target=lambda: done.append(export_chain(gate.store, gate.keyring, target, after=after, now=2e9)),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=30)  # returns at once when the pipe is not read; the bug waits for ever
    hung = worker.is_alive()
    if hung:  # unblock the reader so the thread ends
        os.close(os.open(manifest_path(target), os.O_WRONLY))
        worker.join()
    assert not hung
    assert len(done) == 1
    assert verify_export(target, gate.keyring, after=after).ok


def test_an_export_the_seal_refuses_is_exit_4_refused(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row not yet checkpointed holding what no gate writes (a text time, edited in the
    database) stops the seal the export starts with: that is the export refused (exit 4, as for
    audit findings), not a usage error (2), and nothing is written."""
    path = tmp_path / "ledger.db"
    url = chain_ledger(path, clock, seal=False)
    edit(path, f"UPDATE eg_executions SET at = 'yesterday' WHERE id = {_pay_execution(path)}")
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["export", "--db", url, "--out", str(out)]) == 4
    assert "edited" in capsys.readouterr().err
    assert not out.exists()
    assert not manifest_path(out).exists()


def test_a_row_dated_nan_is_refused_by_the_seal_not_crashing_the_export(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """An execution inserted with a time of NaN (PostgreSQL keeps it) was checkpointed by the seal
    and passed the audit, then the export failed on it with an argument error (exit 2), and so
    did every later export. The seal refuses it as a time no gate writes (ChainError: edited),
    appending no checkpoint, as it does for a text time."""
    gate = shop_gate.gate
    if gate.store.engine.dialect.name == "sqlite":
        pytest.skip("SQLite stores NaN as NULL, which the column refuses")
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    _execution(gate, "update_ticket_tags", TAGS, at=float("nan"), idempotency_key="nan-row")
    assert isinstance(gate.call("update_ticket_tags", {**TAGS, "tags": ["later"]}, context("m2")), Executed)
    with pytest.raises(ChainError, match="edited"):
        export_chain(gate.store, gate.keyring, tmp_path / "a.jsonl", now=clock.now() + 61)
    with gate.store.reading() as conn:
        assert list(gate.store.checkpoints(conn)) == []
    assert not (tmp_path / "a.jsonl").exists()


@pytest.mark.xfail(
    strict=True,
    reason="an approval's token_hash and token_kid are outside its seal and no audit checks them; "
    "vouching for them needs a design decision (seal them, or record them in a chained table)",
)
def test_a_grant_token_hash_edited_in_the_database_is_not_signed_into_an_export(
    ledger: Ledger,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Someone with write access to the database changes which grant token ran a refund (the
    sha256 the export gives for it): the export must refuse or carry the hash of the token that
    ran, never sign the edited one."""
    gate, first = ledger
    ran = {json.loads(row)["record"]["token_hash"] for row in first.read_text().splitlines()} - {None}
    with gate.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET token_hash = :h"), {"h": "f" * 64})
    target = tmp_path / "again.jsonl"
    try:
        export_chain(gate.store, gate.keyring, target, now=2e9)
    except ExportError:
        return
    hashes = {json.loads(row)["record"]["token_hash"] for row in target.read_text().splitlines()} - {None}
    assert hashes == ran
