"""A rule row whose fingerprint a hand edit turned into a blob (SQLite keeps it) names no rule,
for every reader of the recorded rules: `effectgate seal-rules` sorted the keys (bytes against
text: TypeError, exit 70) and the report read it too. It is left out where the rules are read
(`SQLStore.rules`), so the others are sealed and the approvals made under it are `rule_missing`."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.cli import main
from effectgate.stores import open_store
from effectgate.testing import FakeClock

from .test_round6_chain_audit import edit, ledger


def test_seal_rules_and_report_read_a_ledger_holding_a_blob_rule_key(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.db"
    url = ledger(path, clock, seal=False)
    edit(path, "UPDATE eg_rules SET fingerprint = CAST(fingerprint AS BLOB) WHERE rowid = 1")
    with open_store(url) as store:
        assert all(type(fp) is str for fp in store.rules())
    capsys.readouterr()
    assert main(["seal-rules", "--db", url, "--by", "ops"]) == 0
    assert main(["report", "--db", url, "--json"]) == 0
