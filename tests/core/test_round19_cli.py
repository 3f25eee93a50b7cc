"""Round 19, the CLI's export paths:

- `audit --pinned FILE` with a JSON object that is not a manifest (another JSON file, or a line of
  the export itself given for its manifest) answered with Python's own TypeError text
  (`Manifest.__init__() missing 9 required positional arguments`): a clear error now (which
  fields are missing or unknown), exit 4, nothing changed.
- `redact --export` for a user under a legal hold is refused before anything is written: the
  ledger and the export file unchanged (as `redact_export(store=...)` refuses one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate.export import ExportError, Manifest
from effectgate.redact import hold
from effectgate.stores import open_store

from . import test_cli
from .test_cli import Run
from .test_cli_round4 import two_users as two_users

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env


def _snapshot(url: str, where: Path) -> tuple[Any, ...]:
    """What an answer must leave as it was: the files beside the ledger, its events and approvals."""
    with open_store(url) as store:
        rows = ([(e.id, e.kind) for e in store.events()], [(a.id, a.args_json) for a in store.approvals()])
    return sorted((p.name, p.read_bytes()) for p in where.iterdir() if p.is_file()), rows


@pytest.mark.parametrize(
    "content",
    [
        {"hello": "world"},
        {"format": "effectgate-export/2", "key_id": "k1"},
        "export-line",
    ],
    ids=["another-json-object", "fields-missing", "a-line-of-the-export"],
)
def test_audit_pinned_with_a_json_object_that_is_not_a_manifest_says_so(
    two_users: str, tmp_path: Path, cli: Callable[..., Run], content: Any
) -> None:
    """A JSON object that is not a manifest is refused with what is wrong with it, in the CLI's
    words (never Python's `__init__()` message), exit 4, and nothing is changed."""
    export = tmp_path / "one.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    given = tmp_path / "given.json"
    if content == "export-line":  # the export's first line given where its manifest goes
        content = json.loads(export.read_text().splitlines()[0])
    given.write_text(json.dumps(content))
    before = _snapshot(two_users, tmp_path)
    run = cli("audit", "--db", two_users, "--pinned", str(given))
    assert run.code == 4, (run.code, run.out, run.err)
    assert "is not an export manifest" in run.err
    assert "__init__" not in run.err
    assert "field" in run.err
    assert run.out == ""
    assert _snapshot(two_users, tmp_path) == before


def test_manifest_load_names_missing_and_unknown_fields(tmp_path: Path) -> None:
    """`Manifest.load` refuses an object with fields missing or unknown, naming them."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": "effectgate-export/2", "zz": 1}))
    with pytest.raises(ExportError, match=r"unknown field\(s\) 'zz'"):
        Manifest.load(path)
    path.write_text(json.dumps({"format": "effectgate-export/2"}))
    with pytest.raises(ExportError, match=r"missing field\(s\) .*'key_id'"):
        Manifest.load(path)


def test_redact_export_of_a_held_user_is_refused_before_anything_is_written(
    two_users: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """`redact --user u1 --export x` with u1 under a legal hold: refused (exit 4, the hold named),
    the ledger's values and the export file as they were, no partial file left."""
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    with open_store(two_users) as store:
        hold(store, user_id="u1", by="legal", reason="case 19")
    before = _snapshot(two_users, tmp_path)
    run = cli(
        "redact", "--db", two_users, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )
    assert run.code == 4, (run.code, run.out, run.err)
    assert "legal hold" in run.err
    assert run.out == ""
    assert _snapshot(two_users, tmp_path) == before
    assert not (tmp_path / "x.jsonl.partial").exists()
    with open_store(two_users) as store:
        assert not any(a.args_json.startswith('{"$redacted"') for a in store.approvals())
