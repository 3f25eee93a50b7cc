"""Round 14: legal holds, erasure and export files (SQLite and PostgreSQL where a store is
used). A hold placed through the Python API on an id no call is recorded under (stray whitespace,
an invisible character) is refused, as the command line refuses it; `redact --export` says whether
the rewritten file verifies instead of claiming it; a call left pending past its deadline (it can
never be decided) no longer blocks a redaction or escapes retention; and (strict xfail) an export
file's values of a user held after the ledger's erasure must stay."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, Pending, Refused, open_store
from effectgate import export as export_module
from effectgate.audit import audit
from effectgate.errors import ApprovalExpired
from effectgate.examples.shop import context
from effectgate.export import export_chain, redact_export
from effectgate.redact import RedactionError, entries, hold, holds, redact, retain
from effectgate.testing import FakeClock

from . import test_cli_governance
from .conftest import ShopGate
from .test_cli import Run
from .test_redact import ADA_EMAIL, LEAD, everything
from .test_redact import ledger as ledger

cli = test_cli_governance.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli_governance._cli_env
executed = test_cli_governance.executed


def _hold_events(gate: EffectGate) -> list[dict[str, object]]:
    return [json.loads(e.detail_json) for e in gate.store.events() if e.kind == "hold"]


@pytest.mark.parametrize("user", ["u1 ", " u1", "u1\u200b", "\u200b", "u1\n", "\u2060"])
def test_a_python_hold_on_an_id_with_stray_whitespace_or_invisible_text_is_refused(
    ledger: EffectGate, user: str
) -> None:
    """A hold on "u1 " or "u1\\u200b" holds nothing: no call of u1 is recorded under that id, so
    the next retention pass erased u1's records while the hold was shown as placed (the command
    line refuses such an id; `hold()` placed it). Refused, nothing placed or recorded."""
    with pytest.raises(RedactionError, match="user_id"):
        hold(ledger.store, user_id=user, by="legal", reason="case 14")
    assert holds(ledger.store) == []
    assert _hold_events(ledger) == []
    placed = hold(ledger.store, user_id="u1", by="legal", reason="case 14")  # the exact id: placed
    assert [h.id for h in holds(ledger.store)] == [placed.id]


def test_an_export_file_of_a_user_held_after_the_erasure_keeps_its_values(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path
) -> None:
    """Legal holds u1 after the ledger's erasure but before the export file was done: the file
    is then the only copy of u1's values, and `redact_export` must not erase it."""
    export = tmp_path / "x.jsonl"
    export_chain(ledger.store, ledger.keyring, export, settle=0, now=clock.now() + 1)
    redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="r", now=clock.now())
    erased = entries(ledger.store)
    hold(ledger.store, user_id="u1", by="legal", reason="case 14")
    text = export.read_text()
    assert ADA_EMAIL in text
    with pytest.raises(RedactionError, match="legal hold"):
        redact_export(export, store=ledger.store, user_id="u1", erased=erased)
    assert export.read_text() == text


def test_a_hold_placed_while_an_export_file_is_rewritten_keeps_the_file_whole(
    ledger: EffectGate, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold is checked again before the rewritten file replaces the old one: a hold placed
    while the lines were read leaves the file as it was (no partial file left beside it)."""
    export = tmp_path / "x.jsonl"
    export_chain(ledger.store, ledger.keyring, export, settle=0, now=clock.now() + 1)
    text, real = export.read_text(), export_module.read_lines

    def read_then_hold(*args: Any, **kwargs: Any) -> Any:
        for n, line in enumerate(real(*args, **kwargs)):
            if n == 1:
                hold(ledger.store, user_id="u1", by="legal", reason="case 14")
            yield line

    monkeypatch.setattr(export_module, "read_lines", read_then_hold)
    with pytest.raises(RedactionError, match="legal hold"):
        redact_export(export, store=ledger.store, user_id="u1")
    assert export.read_text() == text
    assert not export.with_name(export.name + ".partial").exists()


def test_redact_export_does_not_claim_a_broken_file_still_verifies(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """`redact --export FILE` printed "the file still verifies" and exited 0 for a file whose
    chain was already broken (a record edited after the export): a false statement about the
    evidence. The values are still erased from the file, and the command says it does not
    verify, exiting 1 as `verify` does for a broken export."""
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    export.write_text(export.read_text().replace('"succeeded"', '"failed"', 1))
    assert cli("verify", "--db", executed, str(export)).code == 1
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )
    assert run.code == 1, run
    assert "still verifies" not in run.out
    [line] = [json.loads(text) for text in export.read_text().splitlines()]
    assert line["personal"] == {}  # erased from the file all the same
    with open_store(executed) as store:
        [approval] = store.approvals()
        assert '"1042"' not in approval.args_json  # and from the ledger
    intact = tmp_path / "y.jsonl"  # an intact file: erased, verified, exit 0
    assert cli("export", "--db", executed, "--out", str(intact), "--settle", "0").code == 0
    again = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(intact)
    )
    assert again.code == 0, again
    assert "still verifies" in again.out


EMAIL = {"to": [ADA_EMAIL], "subject": "Your refund", "body": "Dear Ada, it is on its way."}
DAY = 86400.0


def _forgotten(shop_gate: ShopGate, clock: FakeClock) -> tuple[EffectGate, str]:
    """u1's email proposed, then left undecided long past its deadline (no sweep since)."""
    gate = shop_gate.gate
    pending = gate.call("send_email", EMAIL, context("m1"))
    assert isinstance(pending, Pending)
    gate.flush()
    clock.advance(400 * DAY)
    [row] = gate.store.approvals()
    assert row.status == "pending"
    assert row.expires_at is not None
    assert row.expires_at < clock.now()
    return gate, pending.approval_id


def test_a_pending_approval_past_its_deadline_does_not_block_erasure(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """A call left undecided past its deadline can never be approved or run (the gate answers
    `expired`, swept or not), yet `redact` refused the user forever ("deny, execute or reconcile
    it first": none of which an expired call allows) and retention never erased it. It is erased
    like any closed call; the same message again is still refused as expired, and the audit
    stays clean."""
    gate, approval_id = _forgotten(shop_gate, clock)
    done = redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request 77", now=clock.now())
    assert done.values > 0
    assert ADA_EMAIL not in everything(gate.store)
    [row] = gate.store.approvals()
    assert row.args_json.startswith('{"$redacted":')
    again = gate.call("send_email", EMAIL, context("m1"))
    assert isinstance(again, Refused)
    assert again.code == "expired"
    with pytest.raises(ApprovalExpired):
        gate.approve(approval_id, version=1, approver=LEAD)
    gate.flush()
    assert audit(gate.store, gate.table, keyring=gate.keyring).clean


def test_retention_erases_a_pending_approval_past_its_deadline(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Retention skipped the forgotten call as open, keeping its personal values for ever."""
    gate, _ = _forgotten(shop_gate, clock)
    done = retain(gate.store, gate.keyring, {"send": 30}, by="nightly", now=clock.now())
    assert done.values > 0
    assert ADA_EMAIL not in everything(gate.store)
