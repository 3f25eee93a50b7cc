"""Tamper-evident export (issue 18): decision records as a hash chain with a signed manifest.

Round trip on SQLite and PostgreSQL, incremental exports continuing one chain, and `verify_export`
naming the first break for a flipped byte, a deleted record, a reordered pair, a file cut short
and a forged manifest. An edited ledger is never exported (the audit runs first)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending
from effectgate.examples.shop import context
from effectgate.export import (
    GENESIS,
    ExportError,
    Manifest,
    export_chain,
    manifest_path,
    redact_export,
    verify_export,
)
from effectgate.redact import entries, redact
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")
TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}


def refund(gate: EffectGate, message: str, amount: int) -> Executed:
    pending = gate.call(
        "refund_order", {"order_id": "1042", "amount": amount, "currency": "GBP"}, context(message)
    )
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    return done


def export(gate: EffectGate, clock: FakeClock, path: Path, after: Manifest | None = None) -> Manifest:
    """Export everything up to now (the settle window measured on the gate's fake clock)."""
    return export_chain(gate.store, gate.keyring, path, after=after, now=clock.now() + 61)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(path: Path, rows: list[str]) -> None:
    path.write_text("".join(row + "\n" for row in rows))


@pytest.fixture
def ledger(shop_gate: ShopGate, clock: FakeClock, tmp_path: Path) -> tuple[EffectGate, Path]:
    """A ledger with a write and two refunds, exported once."""
    gate = shop_gate.gate
    assert isinstance(gate.call("update_ticket_tags", TAGS, context("m1")), Executed)
    refund(gate, "m2", 1200)
    refund(gate, "m3", 3400)
    path = tmp_path / "one.jsonl"
    export(gate, clock, path)
    return gate, path


def test_an_export_verifies_and_says_who_authorised_each_refund(ledger: tuple[EffectGate, Path]) -> None:
    gate, path = ledger
    manifest = Manifest.load(manifest_path(path))
    records = [line["record"] for line in lines(path)]
    assert [(r["tool"], r["effect"]) for r in records] == [
        ("update_ticket_tags", "write"),
        ("refund_order", "money"),
        ("refund_order", "money"),
    ]
    assert [r["args"].get("amount") for r in records[1:]] == [1200, 3400]
    assert [[(a["id"], a["role"]) for a in r["approvers"]] for r in records] == [
        [],
        [("fiona", "finance")],
        [("fiona", "finance")],
    ]
    tokens = {a.id: (a.token_kid, a.token_hash) for a in gate.store.approvals()}
    assert [(r["token_kid"], r["token_hash"]) for r in records] == [
        (None, None),
        *(tokens[r["approval_id"]] for r in records[1:]),
    ]
    assert all(r["token_kid"] == gate.keyring.current for r in records[1:])
    executions = gate.store.executions()
    assert [r["seq"] for r in records] == [e.id for e in executions]
    assert [r["args_hash"] for r in records] == [e.args_hash for e in executions]
    assert manifest.count == 3
    assert manifest.start == GENESIS
    assert (manifest.first_seq, manifest.last_seq) == (executions[0].id, executions[-1].id)
    assert verify_export(path, gate.keyring).ok


def test_an_incremental_export_holds_only_what_is_new_and_continues_the_chain(
    ledger: tuple[EffectGate, Path], clock: FakeClock, tmp_path: Path
) -> None:
    gate, first = ledger
    before = Manifest.load(manifest_path(first))
    refund(gate, "m4", 500)
    second = tmp_path / "two.jsonl"
    after = export(gate, clock, second, after=before)
    assert [line["record"]["args"]["amount"] for line in lines(second)] == [500]
    assert after.start == before.head
    assert verify_export(second, gate.keyring, after=before).ok
    # nothing new: an empty file whose chain stays where it was
    third = tmp_path / "three.jsonl"
    empty = export(gate, clock, third, after=after)
    assert (empty.count, empty.head, empty.after_seq) == (0, after.head, after.after_seq)
    assert verify_export(third, gate.keyring, after=after).ok
    # a file checked against an export it does not continue
    assert not verify_export(second, gate.keyring, after=empty).ok


def test_records_inside_the_settle_window_wait_for_the_next_export(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    gate = shop_gate.gate
    refund(gate, "m2", 1200)
    now = clock.now()
    early = export_chain(gate.store, gate.keyring, tmp_path / "a.jsonl", now=now + 1, settle=60)
    assert early.count == 0
    later = export_chain(gate.store, gate.keyring, tmp_path / "b.jsonl", after=early, now=now + 61, settle=60)
    assert later.count == 1


@pytest.mark.parametrize("kind", ["flipped", "deleted", "reordered", "cut", "added"])
def test_verify_names_the_first_broken_record(ledger: tuple[EffectGate, Path], kind: str) -> None:
    gate, path = ledger
    rows = path.read_text().splitlines()
    if kind == "flipped":  # 1200 -> 1290 in the second record
        rows[1] = rows[1].replace('"amount": 1200', '"amount": 1290')
        expected_line = 2
    elif kind == "deleted":
        del rows[1]
        expected_line = 2
    elif kind == "reordered":
        rows[1], rows[2] = rows[2], rows[1]
        expected_line = 2
    elif kind == "cut":
        rows = rows[:2]
        expected_line = 3
    else:  # a record copied to the end: it does not follow the last one
        rows.append(rows[1])
        expected_line = 4
    assert rows != path.read_text().splitlines()
    rewrite(path, rows)
    verdict = verify_export(path, gate.keyring)
    assert not verdict.ok
    assert verdict.line == expected_line


def test_a_forged_manifest_does_not_verify(ledger: tuple[EffectGate, Path]) -> None:
    """A manifest rewritten to match a shortened file, signed with another key, or with its
    signature copied: refused."""
    gate, path = ledger
    rows = path.read_text().splitlines()[:2]
    rewrite(path, rows)
    data = json.loads(manifest_path(path).read_text())
    data.update(count=2, head=json.loads(rows[-1])["hash"], last_seq=json.loads(rows[-1])["seq"])
    manifest_path(path).write_text(json.dumps(data))  # the old signature kept
    verdict = verify_export(path, gate.keyring)
    assert not verdict.ok
    assert verdict.problem is not None
    assert "signature" in verdict.problem
    other = Keyring.generate()
    forged = Manifest(**{**data, "signature": ""})
    forged = Manifest(**{**data, "signature": other.sign("export-manifest", forged.body())})
    manifest_path(path).write_text(forged.dumps())
    assert not verify_export(path, gate.keyring).ok


def test_an_edited_ledger_is_not_exported(
    ledger: tuple[EffectGate, Path], store: SQLStore, tmp_path: Path
) -> None:
    """An approval whose arguments were edited in the database: the audit finds it and the
    export refuses, writing nothing (a signature never vouches for an edited row)."""
    gate, _ = ledger
    [first] = [a for a in gate.store.approvals() if '"amount":1200' in a.args_json]
    edited = first.args_json.replace('"amount":1200', '"amount":9900')
    with store.transaction() as conn:
        statement = sa.text("UPDATE eg_approvals SET args_json = :a WHERE id = :i")
        conn.execute(statement, {"a": edited, "i": first.id})
    target = tmp_path / "refused.jsonl"
    with pytest.raises(ExportError, match="audit finding"):
        export_chain(gate.store, gate.keyring, target, now=1e12)
    assert not target.exists()
    assert not manifest_path(target).exists()


def test_a_previous_manifest_from_another_keyring_is_refused(
    ledger: tuple[EffectGate, Path], tmp_path: Path
) -> None:
    gate, path = ledger
    before = Manifest.load(manifest_path(path))
    with pytest.raises(ExportError, match="signature"):
        export_chain(gate.store, Keyring.generate(), tmp_path / "x.jsonl", after=before, now=1e12)
    assert not (tmp_path / "x.jsonl").exists()


def test_an_export_continues_a_chain_begun_in_the_first_format(
    ledger: tuple[EffectGate, Path], clock: FakeClock, tmp_path: Path
) -> None:
    """A manifest of format /1 (signed by this keyring) is still read: the next export continues
    its chain; an unknown format is refused."""
    gate, first = ledger
    before = Manifest.load(manifest_path(first))
    old = Manifest(**{**asdict(before), "format": "effectgate-export/1", "signature": ""})
    old = Manifest(**{**asdict(old), "signature": gate.keyring.sign("export-manifest", old.body())})
    refund(gate, "m5", 100)
    later = tmp_path / "later.jsonl"
    assert export(gate, clock, later, after=old).start == before.head
    assert verify_export(later, gate.keyring, after=old).ok
    unknown = Manifest(**{**asdict(old), "format": "effectgate-export/9"})
    with pytest.raises(ExportError, match="unknown export format"):
        unknown.check(gate.keyring)


def test_redact_export_erases_exactly_what_the_ledger_erased(ledger: tuple[EffectGate, Path]) -> None:
    """A subject's redaction (order 1042: both refunds) leaves u1's ticket write in the file, as
    in the ledger; a value whose entry commits to another value (another ledger's file) stays."""
    gate, path = ledger
    before = lines(path)
    redact(gate.store, gate.keyring, user_id="u1", subject={"order_id": "1042"}, by="dpo", reason="r")
    erased = entries(gate.store)
    first = ("eg_executions", str(before[1]["seq"]), "args_json")
    forged = {
        **erased,
        first: erased[first].model_copy(update={"commitment": before[0]["record"]["personal"]["args_json"]}),
    }
    assert redact_export(path, store=gate.store, user_id="u1", erased=forged) == 1  # the second refund only
    assert [line["personal"] for line in lines(path)] == [before[0]["personal"], before[1]["personal"], {}]
    assert redact_export(path, store=gate.store, user_id="u1", erased=erased) == 1
    after = lines(path)
    assert [line["personal"] for line in after] == [before[0]["personal"], {}, {}]
    assert [line["record"] for line in after] == [line["record"] for line in before]
    assert verify_export(path, gate.keyring).ok
    assert redact_export(path, store=gate.store, user_id="u2", erased=erased) == 0  # only the user's lines
