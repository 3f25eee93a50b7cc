"""`verify_export` reads an export file as untrusted bytes: each line must be exactly what the
exporter wrote (no key named twice, no extra field, the same serialisation), and lines are read
one at a time with a bound on their length, so an edited line never verifies and a huge one is
refused without being held in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate import EffectGate
from effectgate.export import ExportError, Manifest, manifest_path, redact_export, verify_export

from .test_export import ledger, rewrite  # noqa: F401 - the fixture

Ledger = tuple[EffectGate, Path]


def forged(row: str) -> str:
    """The review's forgery: a first copy of `status`, `args` and `approvers` inside the record
    (a first-wins reader shows them) and an extra field after it."""
    assert '"record": {' in row
    row = row.replace(
        '"record": {',
        '"record": {"status": "failed", "args": {"amount": 99999, "currency": "GBP"}, '
        '"approvers": [{"id": "ceo", "role": "finance_lead"}], ',
        1,
    )
    return row[:-1] + ', "approved_by_cfo": true}'


@pytest.mark.parametrize(
    "edit",
    [
        "forged",
        "repeated_top_level",
        "extra_field",
        "compact",
        "escaped",
    ],
)
def test_a_line_not_written_as_the_exporter_wrote_it_does_not_verify(ledger: Ledger, edit: str) -> None:  # noqa: F811
    """A repeated key (at any depth), an extra field, or the same JSON serialised differently is
    a changed line: verify names it, although the record it parses to still matches its hash."""
    gate, path = ledger
    rows = path.read_text().splitlines()
    line = json.loads(rows[1])
    if edit == "forged":
        rows[1] = forged(rows[1])
    elif edit == "repeated_top_level":  # a first-wins reader sees seq 99
        rows[1] = '{"seq": 99, ' + rows[1][1:]
    elif edit == "extra_field":
        rows[1] = json.dumps({**line, "approved_by_cfo": True})
    elif edit == "compact":
        rows[1] = json.dumps(line, separators=(",", ":"))
    else:  # the same text, with a character written as an escape
        rows[1] = rows[1].replace('"refund_order"', '"refund\\u005forder"', 1)
    assert rows[1] != path.read_text().splitlines()[1]
    rewrite(path, rows)
    verdict = verify_export(path, gate.keyring)
    assert not verdict.ok
    assert verdict.line == 2


def test_a_last_line_without_its_newline_does_not_verify(ledger: Ledger) -> None:  # noqa: F811
    gate, path = ledger
    path.write_bytes(path.read_bytes()[:-1])
    verdict = verify_export(path, gate.keyring)
    assert (verdict.ok, verdict.line) == (False, 3)


def test_a_line_longer_than_the_cap_is_refused_unread(ledger: Ledger) -> None:  # noqa: F811
    """A line over `max_line` bytes is a break named at its line (the file is read a line at a
    time, so a huge one is never held whole); the same file verifies under the default cap."""
    gate, path = ledger
    longest = max(len(row) for row in path.read_bytes().splitlines())
    assert verify_export(path, gate.keyring, max_line=longest).ok
    verdict = verify_export(path, gate.keyring, max_line=longest - 1)
    assert not verdict.ok
    assert verdict.line is not None
    assert verdict.problem is not None
    assert "longer than" in verdict.problem
    rows = path.read_text().splitlines()
    rewrite(path, [rows[0], "x" * 5000, *rows[1:]])
    verdict = verify_export(path, gate.keyring, max_line=4096)
    assert (verdict.ok, verdict.line) == (False, 2)
    assert verdict.problem is not None
    assert "longer than 4096 bytes" in verdict.problem


def test_verify_never_reads_the_file_whole(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The file is streamed: reading it whole (as text or bytes) is never needed."""
    gate, path = ledger

    def whole(self: Path, *args: object, **kwargs: object) -> str:
        raise AssertionError(f"{self} read whole")

    monkeypatch.setattr(Path, "read_text", whole)
    monkeypatch.setattr(Path, "read_bytes", whole)
    assert verify_export(path, gate.keyring).ok


def test_redact_export_refuses_a_line_over_the_cap_and_changes_nothing(ledger: Ledger) -> None:  # noqa: F811
    gate, path = ledger
    before = path.read_bytes()
    with pytest.raises(ExportError, match="longer than 64 bytes"):
        redact_export(path, store=gate.store, user_id="u1", max_line=64)
    assert path.read_bytes() == before
    assert not path.with_name(path.name + ".partial").exists()
    assert verify_export(path, gate.keyring).ok


def test_a_manifest_with_a_repeated_key_is_not_read(ledger: Ledger) -> None:  # noqa: F811
    """The signature covers the manifest as parsed; a repeated key could show a reader another
    head or count, so it is refused."""
    gate, path = ledger
    text = manifest_path(path).read_text()
    manifest_path(path).write_text('{"count": 99,' + text.lstrip()[1:])
    with pytest.raises(ExportError, match="repeated key"):
        Manifest.load(manifest_path(path))
    assert not verify_export(path, gate.keyring).ok
