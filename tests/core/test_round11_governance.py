"""Round 11 review of the governance commands and the data lifecycle: a mistyped `keep` name is
refused before anything is erased (it silently erased the fact it meant to keep), and an export
file with another hard link is refused by `redact --export` (the rewrite replaced one name and
left the erased values under the other)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, open_store
from effectgate.cli import keyring_for
from effectgate.examples.shop import app
from effectgate.export import (
    GENESIS,
    ExportError,
    Manifest,
    export_chain,
    link,
    manifest_path,
    redact_export,
    verify_export,
)
from effectgate.redact import RedactionError, hold, holds, redact, release, retain
from effectgate.testing import FakeClock

from . import test_cli_governance
from .test_cli import Run
from .test_redact import ADA_EMAIL
from .test_redact import ledger as ledger

cli = test_cli_governance.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli_governance._cli_env
executed = test_cli_governance.executed


def _approval_args(gate: EffectGate) -> list[str]:
    return sorted(a.args_json for a in gate.store.approvals())


def test_a_mistyped_keep_name_is_refused_and_erases_nothing(
    ledger: EffectGate,
    clock: FakeClock,
) -> None:
    """`keep=("amout", "currency")` (a typo of amount) kept no amount: the refund's amount was
    erased with the rest, unrecoverably. A name that is no fact, no argument of a tool the ledger
    recorded and no argument of a record being erased is refused, changing nothing."""
    before = _approval_args(ledger)
    with pytest.raises(RedactionError, match="amout"):
        redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r", keep=("amout", "currency"))
    with pytest.raises(RedactionError, match="amout"):
        retain(ledger.store, ledger.keyring, {"money": 0}, by="nightly", keep=("amout",), now=clock.now())
    assert _approval_args(ledger) == before
    # a real argument of a recorded tool (the refund's order_id) is kept as asked
    done = redact(
        ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r", keep=("amount", "order_id")
    )
    kept = [
        json.loads(a.args_json)
        for a in ledger.store.approvals()
        if a.user_id == "u1" and "amount" in a.args_json
    ]
    assert kept
    assert all(k == {"$redacted": done.id, "amount": 1200, "order_id": "1042"} for k in kept)


def test_redact_with_a_mistyped_keep_is_a_usage_error_that_changes_nothing(
    executed: str, cli: Callable[..., Run]
) -> None:
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--keep", "amout,currency"
    )
    assert run.code == 2, run.err
    assert "amout" in run.err
    with open_store(executed) as store:
        [approval] = store.approvals()
        assert json.loads(approval.args_json) == {"order_id": "1042", "amount": 5000, "currency": "GBP"}


def test_redact_export_refuses_a_file_with_another_hard_link(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """The rewrite renamed a new file over one name: the other link of the same file still held
    every erased value, with the command reporting them erased. Refused before the ledger is
    erased, both names unchanged."""
    export, other = tmp_path / "x.jsonl", tmp_path / "backup.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    os.link(export, other)
    text = export.read_text()
    assert "1042" in text
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )
    assert run.code == 2, run.err
    assert "link" in run.err
    assert export.read_text() == other.read_text() == text
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json  # the ledger is not erased either


def test_redact_export_function_refuses_a_file_with_another_hard_link(
    ledger: EffectGate,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    export, other = tmp_path / "x.jsonl", tmp_path / "backup.jsonl"
    export_chain(ledger.store, ledger.keyring, export, settle=0, now=clock.now() + 1)
    os.link(export, other)
    text = export.read_text()
    assert ADA_EMAIL in text
    with pytest.raises(ExportError, match="link"):
        redact_export(export, store=ledger.store, user_id="u1")
    assert export.read_text() == other.read_text() == text
    assert not (tmp_path / "x.jsonl.partial").exists()
    # a symlink too: the rename replaced the link and left the file it names as it was
    other.unlink()
    (tmp_path / "alias.jsonl").symlink_to(export)
    with pytest.raises(ExportError, match="link"):
        redact_export(tmp_path / "alias.jsonl", store=ledger.store, user_id="u1")
    assert export.read_text() == text
    assert redact_export(export, store=ledger.store, user_id="u1") == 3  # the file itself (one link): erased
    assert ADA_EMAIL not in export.read_text()


def _first_format(gate: EffectGate, path: Path) -> None:
    """Rewrite a /2 export as an export of the first format wrote it: the whole arguments in the
    chained record, no personal values beside it; its manifest signed as /1."""
    head, rows = GENESIS, []
    for line in [json.loads(text) for text in path.read_text().splitlines()]:
        record = {**line["record"], "args": json.loads(line["personal"]["args_json"])}
        record.pop("personal")
        digest = link(head, record)
        rows.append(json.dumps({"seq": line["seq"], "prev": head, "hash": digest, "record": record}) + "\n")
        head = digest
    path.write_text("".join(rows))
    before = Manifest.load(manifest_path(path))
    old = Manifest(**{**asdict(before), "format": "effectgate-export/1", "head": head, "signature": ""})
    old = Manifest(**{**asdict(old), "signature": gate.keyring.sign("export-manifest", old.body())})
    manifest_path(path).write_text(old.dumps())
    assert verify_export(path, gate.keyring).ok


def test_redact_export_refuses_a_first_format_file_it_cannot_erase(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    """An export of the first format (`effectgate-export/1`) holds the arguments inside its
    chain: `redact_export` found no personal values beside them, changed nothing and returned 0,
    and `redact --export` reported the file erased while Ada's address stayed in it. Refused."""
    path = tmp_path / "old.jsonl"
    export_chain(ledger.store, ledger.keyring, path, settle=0, now=clock.now() + 1)
    _first_format(ledger, path)
    text = path.read_text()
    assert ADA_EMAIL in text
    with pytest.raises(ExportError, match="export/1"):
        redact_export(path, store=ledger.store, user_id="u1")
    assert path.read_text() == text
    assert redact_export(path, store=ledger.store, user_id="nobody") == 0  # no line of the user: none erased


def test_redact_with_a_first_format_export_is_refused_before_the_ledger_is_erased(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    export = tmp_path / "old.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    with open_store(executed) as store:
        _first_format(app(store, keyring=keyring_for(executed)), export)
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )  # fmt: skip
    assert run.code == 2, run.err
    assert "first export format" in run.err
    assert '"1042"' in export.read_text()
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json  # the ledger is not erased either


def test_a_hold_released_in_the_database_alone_still_holds(ledger: EffectGate) -> None:
    """Someone with write access to the database marks a legal hold released (no `release`, no
    `hold_released` event): the next redaction erased the held user's records, and the audit
    said nothing. A hold must hold until it is released through `release`."""
    placed = hold(ledger.store, user_id="u1", by="legal", reason="case 14")
    with ledger.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_holds SET released_at = 1, released_by = 'nobody' WHERE id = :id"),
            {"id": placed.id},
        )
    before = _approval_args(ledger)
    with pytest.raises(RedactionError, match="legal hold"):  # refused: the hold stands
        redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) == before
    assert [h.id for h in holds(ledger.store)] == [placed.id]
    release(ledger.store, placed.id, by="legal", reason="case closed")  # released through `release`
    assert holds(ledger.store) == []
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) != before


def test_a_hold_whose_row_is_deleted_in_the_database_still_holds(ledger: EffectGate) -> None:
    """The hold's row deleted (its `hold` event stays: the events are append-only and chained):
    the hold stands, is listed, and is released only through `release`."""
    placed = hold(ledger.store, user_id="u1", by="legal", reason="case 14")
    with ledger.store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM eg_holds WHERE id = :id"), {"id": placed.id})
    before = _approval_args(ledger)
    with pytest.raises(RedactionError, match="legal hold"):
        redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r")
    assert _approval_args(ledger) == before
    [listed] = holds(ledger.store)
    assert (listed.id, listed.user_id, listed.placed_by) == (placed.id, "u1", "legal")
    release(ledger.store, placed.id, by="legal", reason="case closed")
    assert holds(ledger.store) == []
    with pytest.raises(RedactionError, match="no active legal hold"):  # released once
        release(ledger.store, placed.id, by="legal", reason="again")
