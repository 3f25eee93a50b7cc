"""Review round 3 of the command: `pending` and `show` on rows edited in the database."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from effectgate import Pending, open_store
from effectgate.cli import keyring_for, main
from effectgate.examples.shop import app, context


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def _edited(tmp_path: Path, column: str, value: str) -> tuple[str, str]:
    """A pending email whose approval row has `column` set to the SQL `value`: (url, id)."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        p = gate.call("send_email", {"to": ["x@example.com"], "subject": "s", "body": "b"}, context("m1"))
        gate.close()
        assert isinstance(p, Pending), p
        with store.engine.begin() as conn:
            edit = sa.text(f"UPDATE eg_approvals SET {column} = {value} WHERE id = :i")
            conn.execute(edit, {"i": p.approval_id})
    return url, p.approval_id


def test_show_prints_notes_edited_into_other_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Notes edited into null and a number (no --app: the stored notes are what the card shows)
    are printed as their JSON, not an internal error (exit 70)."""
    url, approval_id = _edited(tmp_path, "notes_json", "'[null, 7]'")
    assert main(["--db", url, "show", approval_id]) == 0
    out = capsys.readouterr().out
    notes = [line.split()[1] for line in out.splitlines() if line.strip().startswith("note ")]
    assert notes == ["null", "7"]


@pytest.mark.parametrize("command", ["pending", "show"])
def test_an_expiry_edited_into_text_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """An expiry edited into text (SQLite keeps it) is printed as it is, as the inbox shows it,
    not an internal error (exit 70)."""
    url, approval_id = _edited(tmp_path, "expires_at", "'soon\u001b[2J'")
    argv = ["--db", url, command, *([approval_id] if command == "show" else [])]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(not a time)" in out
    assert "\x1b" not in out
