"""Round 19, `effectgate audit` at scale: a split scan reports forged erasure markers as one scan
does (a failed child too), the command loads neither the gate nor PostgreSQL's dialect, and run as
the program it leaves without the interpreter's teardown, its whole answer written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from effectgate import Keyring, open_store
from effectgate.stores import SQLStore
from effectgate.stores._aggregates import AggregateSQL
from effectgate.testing import FakeClock

from .test_audit_parallel import _ledger, _scan, _summary

FORGED = '{"$redacted":"r-forged"}'


def _forge_markers(store: SQLStore) -> None:
    """Erasure markers no redaction wrote, in a decision's reason and an event's detail."""
    with store.transaction() as conn:  # the append-only triggers let a marker through
        conn.execute(
            sa.text("UPDATE eg_decisions SET reason = :m WHERE id = (SELECT min(id) FROM eg_decisions)"),
            {"m": FORGED},
        )
        conn.execute(
            sa.text("UPDATE eg_events SET detail_json = :m WHERE id = (SELECT max(id) FROM eg_events)"),
            {"m": FORGED},
        )


def test_a_split_scan_reports_the_forged_markers_as_one_scan_does(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyring, _ = _ledger(store, clock)
    _forge_markers(store)
    whole = _scan(store, keyring, monkeypatch, split=False)
    assert sum(f.kind == "redaction_forged" for f in whole.findings) == 2
    halves = _scan(store, keyring, monkeypatch, split=True)  # forked, where no other thread runs
    assert _summary(halves) == _summary(whole)
    assert halves.metrics == whole.metrics


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_child_leaves_the_markers_to_this_process(
    store: SQLStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyring, _ = _ledger(store, clock)
    _forge_markers(store)
    whole = _scan(store, keyring, monkeypatch, split=False)

    def fail(self: AggregateSQL) -> None:
        raise RuntimeError("the child cannot open the database")

    monkeypatch.setattr(AggregateSQL, "audit_forked", fail)
    halves = _scan(store, keyring, monkeypatch, split=True)
    assert sum(f.kind == "redaction_forged" for f in halves.findings) == 2
    assert _summary(halves) == _summary(whole)


@pytest.fixture
def ledger_file(tmp_path: Path, clock: FakeClock) -> tuple[str, Keyring]:
    """A SQLite ledger with one execution that no approval allowed (a finding)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url, clock=clock)
    store.setup()
    keyring, _ = _ledger(store, clock)
    store.close()
    return url, keyring


def _python(code: str, keyring: Keyring, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTGATE_KEYRING": keyring.dumps()}
    return subprocess.run(
        [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_audit_command_loads_neither_the_gate_nor_postgresqls_dialect(
    ledger_file: tuple[str, Keyring],
) -> None:
    url, keyring = ledger_file
    code = """
        import json, sys
        from effectgate.cli import main
        code = main(["audit", "--db", sys.argv[1], "--json"])
        wanted = ("effectgate.gate", "sqlalchemy.dialects.postgresql", "effectgate.replay")
        print(json.dumps({"code": code, "loaded": [m for m in wanted if m in sys.modules]}), file=sys.stderr)
    """
    done = _python(code, keyring, url)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"code": 1, "loaded": []}
    assert json.loads(done.stdout)["findings"]


def test_a_sqlite_store_makes_its_partial_indexes_without_postgresqls_dialect(tmp_path: Path) -> None:
    code = """
        import sqlite3, sys
        from effectgate import open_store
        open_store(f"sqlite:///{sys.argv[1]}").setup()
        print("sqlalchemy.dialects.postgresql" in sys.modules)
        rows = sqlite3.connect(sys.argv[1]).execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'eg_events' ORDER BY name"
        )
        print(*(r[0] for r in rows), sep="\\n")
    """
    done = _python(code, Keyring.generate(), str(tmp_path / "fresh.db"))
    assert done.stdout.splitlines() == [
        "False",
        "CREATE INDEX eg_events_approval ON eg_events (approval_id) WHERE approval_id IS NOT NULL",
        "CREATE INDEX eg_events_kind ON eg_events (kind) WHERE kind <> 'read'",
    ], done.stderr


def test_the_audit_program_writes_its_whole_answer_before_it_leaves(ledger_file: tuple[str, Keyring]) -> None:
    """Run as the program, `audit` ends with `os._exit` once its answer is flushed: the answer is
    whole, the exit code is the verdict, and the store was closed first (no WAL file left)."""
    url, keyring = ledger_file
    done = _python("", keyring, "-m", "effectgate.cli", "audit", "--db", url, "--json")
    assert (done.returncode, done.stderr) == (1, "")
    report = json.loads(done.stdout)
    assert report["clean"] is False
    assert report["metrics"]["executions"] > 0
    assert {f["kind"] for f in report["findings"]} >= {"decision_forged", "no_approval"}
    assert not Path(url.removeprefix("sqlite:///") + "-wal").exists()
