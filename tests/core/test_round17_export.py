"""Round 17 review of the export, the ledger's chain, replay and the CLI's verdicts.

- `export_chain` wrote a line as long as its record and personal values made it, while
  `verify_export` (and `redact_export`) read at most `MAX_LINE` bytes a line: a write with a
  6 MiB argument of accented text (escaped six bytes a character) gave a signed export that
  `verify` called broken and `redact --export` could not erase. A line the verifier would
  refuse now leaves its longest personal values out (their commitments stay in the chain, as an
  erased value's do), and a record too long on its own refuses the export, nothing written.
- The export file (and `redact_export`'s rewrite) was opened in text mode with the platform's line
  ending: on Windows every line ends "\r\n", which `verify_export` (the exact bytes) calls a
  changed line, so no export made there ever verified. Written with "\n" now (emulated here by
  the translation Windows' default applies).
- A keyring that is not the ledger's was told apart by the newest checkpoints, approval seals and
  decision seals only: a ledger of writes and reads has none of them (only its rule seals), so
  `export` with another environment's keyring checkpointed the chain under that key (the audit
  then refused the export, the checkpoints stayed), and from then on the ledger's own keyring
  was refused (`keyring_mismatch`) by every export, `redact` and `retain`. With nothing else
  signed, the rule seals count now: the foreign keyring is refused before anything is written."""

from __future__ import annotations

import json
import logging
import pathlib
from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, Executed, Keyring
from effectgate.errors import TokenError
from effectgate.examples.shop import context
from effectgate.export import ExportError, export_chain, manifest_path, redact_export, verify_export
from effectgate.redact import redact
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

LIMIT = 4096  # a small bound stands for MAX_LINE (16 MiB): the same code path, cheaply


def _tags(gate: EffectGate, message: str, text: str) -> None:
    out = gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": [text]}, context(message))
    assert isinstance(out, Executed), out


def test_a_line_the_verifier_would_refuse_leaves_its_personal_value_out_and_verifies(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = shop_gate.gate
    _tags(gate, "m1", "short")
    _tags(gate, "m2", "é" * LIMIT)  # six bytes a character once escaped in the line
    path = tmp_path / "e.jsonl"
    with caplog.at_level(logging.WARNING, logger="effectgate"):
        manifest = export_chain(gate.store, gate.keyring, path, now=clock.now() + 61, max_line=LIMIT)
    assert manifest.count == 2
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    assert all(len(text) <= LIMIT for text in path.read_text().splitlines())
    assert "short" in lines[0]["personal"]["args_json"]
    assert lines[1]["personal"] == {}  # left out, as an erased value is
    assert lines[1]["record"]["personal"]["args_json"]  # its commitment stays inside the chain
    assert "left out" in caplog.text
    assert verify_export(path, gate.keyring, max_line=LIMIT).ok
    assert redact_export(path, store=gate.store, user_id="u1", max_line=LIMIT) == 1  # it reaches the file
    assert verify_export(path, gate.keyring, max_line=LIMIT).ok


def test_a_record_too_long_on_its_own_refuses_the_export_and_writes_nothing(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    gate = shop_gate.gate
    _tags(gate, "m1", "short")
    path = tmp_path / "e.jsonl"
    with pytest.raises(ExportError, match="longer than 600 bytes even without"):
        export_chain(gate.store, gate.keyring, path, now=clock.now() + 61, max_line=600)
    assert not path.exists()
    assert not manifest_path(path).exists()
    assert not path.with_name("e.jsonl.partial").exists()


def test_an_export_written_with_windows_line_endings_still_verifies(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = pathlib.Path.open

    def windows_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "b" not in mode and set(mode) & set("wxa") and kwargs.get("newline") is None:
            kwargs["newline"] = "\r\n"  # what text mode writes for "\n" on Windows
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", windows_open)
    gate = shop_gate.gate
    _tags(gate, "m1", "short")
    path = tmp_path / "e.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    assert b"\r" not in path.read_bytes()
    assert verify_export(path, gate.keyring).ok
    assert redact_export(path, store=gate.store, user_id="u1") == 1
    assert b"\r" not in path.read_bytes()
    assert verify_export(path, gate.keyring).ok


def test_another_keyring_cannot_checkpoint_a_ledger_of_writes_under_its_key(
    store: SQLStore, shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    gate = shop_gate.gate
    _tags(gate, "m1", "short")  # a write: no approval, no decision, no checkpoint yet
    with pytest.raises(TokenError, match="keyring_mismatch"):
        export_chain(store, Keyring.generate(), tmp_path / "x.jsonl", now=clock.now() + 61)
    with store.reading() as conn:
        assert store.checkpoints(conn) == []
    assert not (tmp_path / "x.jsonl").exists()
    # the ledger's own keyring still exports, verifies and erases
    mine = tmp_path / "e.jsonl"
    assert export_chain(store, gate.keyring, mine, now=clock.now() + 61).count == 1
    assert verify_export(mine, gate.keyring).ok
    assert redact(store, gate.keyring, user_id="u1", by="dpo", reason="request").values >= 1
