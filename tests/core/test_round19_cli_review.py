"""Round 19 review of the lighter `effectgate audit` (53257e2): a store set up over the caller's
own engine still makes the partial indexes (their WHERE clause was given only by `make_engine`),
`import effectgate` still binds its submodules (`effectgate.errors`) though the public names load
lazily, and the program's `os._exit` keeps the answer, the exit code and the verdict of a reader
that went away, as the command gave them when it built a gate."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import effectgate
from effectgate import Keyring

from .test_round19_audit import _python, ledger_file

__all__ = ["ledger_file"]


def test_setup_over_the_callers_own_engine_makes_the_partial_indexes(tmp_path: Path) -> None:
    """`SQLStore(engine)` is public: its `setup` in a fresh process (no `make_engine` yet) made
    full indexes on eg_events, every read record entering both (the README's rule)."""
    code = """
        import sqlite3, sys
        import sqlalchemy as sa
        from effectgate.stores import SQLStore
        store = SQLStore(sa.create_engine(f"sqlite:///{sys.argv[1]}"))
        store.setup()
        store.close()
        rows = sqlite3.connect(sys.argv[1]).execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'eg_events' ORDER BY name"
        )
        print(*(r[0] for r in rows), sep="\\n")
    """
    done = _python(code, Keyring.generate(), str(tmp_path / "own.db"))
    assert done.stdout.splitlines() == [
        "CREATE INDEX eg_events_approval ON eg_events (approval_id) WHERE approval_id IS NOT NULL",
        "CREATE INDEX eg_events_kind ON eg_events (kind) WHERE kind <> 'read'",
    ], done.stderr


def test_import_effectgate_binds_its_submodules_and_first_use_is_thread_safe() -> None:
    code = """
        import sys, threading
        import effectgate
        assert "effectgate.gate" not in sys.modules
        print(effectgate.errors.StoreError.__name__, effectgate.stores.SQLStore.__name__)
        print(hasattr(effectgate, "no_such_name"), "effectgate.gate" in sys.modules)
        failed, start = [], threading.Barrier(8)
        def first_use(i):
            start.wait()
            names = effectgate.__all__[i:] + effectgate.__all__[:i]
            try:
                [getattr(effectgate, n) for n in names]
            except Exception as exc:
                failed.append(repr(exc))
        threads = [threading.Thread(target=first_use, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(failed)
    """
    done = _python(code, Keyring.generate())
    assert done.stdout.splitlines() == ["StoreError SQLStore", "False False", "[]"], done.stderr


def test_the_lazy_names_star_import_dir_and_pickle() -> None:
    namespace: dict[str, object] = {}
    exec("from effectgate import *", namespace)
    assert set(effectgate.__all__) <= set(namespace)
    assert set(effectgate.__all__) <= set(dir(effectgate))
    refused = effectgate.Refused(code="denied", message="no", tool="pay", approval_id="a1")
    assert pickle.loads(pickle.dumps(refused)) == refused
    assert effectgate.Refused is effectgate.outcomes.Refused


def _program(keyring: Keyring, *args: str) -> subprocess.CompletedProcess[str]:
    return _python("", keyring, "-m", "effectgate.cli", "audit", *args)


def test_the_audit_program_keeps_its_answer_and_exit_codes(
    ledger_file: tuple[str, Keyring], tmp_path: Path
) -> None:
    """Through a pipe, without --json: the whole report and the verdict (1); a missing database
    is still exit 3 with its one line."""
    url, keyring = ledger_file
    done = _program(keyring, "--db", url, "--chain")
    assert done.returncode == 1
    assert done.stderr == ""
    assert done.stdout.splitlines()[-1].startswith("DIVERGED: ")
    assert "no_approval" in done.stdout
    missing = _program(keyring, "--db", f"sqlite:///{tmp_path / 'missing.db'}")
    assert (missing.returncode, missing.stdout) == (3, "")
    assert missing.stderr.startswith("effectgate: error: no database at")


def test_a_reader_that_went_away_keeps_the_verdict(ledger_file: tuple[str, Keyring]) -> None:
    url, keyring = ledger_file
    env = {**os.environ, "EFFECTGATE_KEYRING": keyring.dumps()}
    child = subprocess.Popen(
        [sys.executable, "-m", "effectgate.cli", "audit", "--db", url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()  # `effectgate audit | head -0`
    assert child.wait(timeout=120) == 1
    assert child.stderr.read() == b""
    child.stderr.close()
    assert not Path(url.removeprefix("sqlite:///") + "-wal").exists()
