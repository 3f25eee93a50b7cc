"""Round 23: read logs are written at exit by one registration over the live logs; each log
used to register two exit hooks of its own, which the interpreter never forgets (a process that
makes a gate per request grew its atexit list by two per gate)."""

from __future__ import annotations

import atexit
import subprocess
import sys
from pathlib import Path

from effectgate import open_store
from effectgate._readlog import ReadLog


def test_making_read_logs_registers_no_exit_hook(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    store.setup()
    before = atexit._ncallbacks()
    logs = [ReadLog(store, interval=3600.0) for _ in range(50)]
    assert atexit._ncallbacks() == before
    for log in logs:
        log.close()
    store.close()


CHILD = """
import sys
from effectgate import CallContext, EffectGate, EffectTable, Keyring, ToolSpec, Effect, open_store
store = open_store(sys.argv[1])
table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lambda item: item)])
table.allow("a", ["lookup"])
for n in range(3):  # three gates, none closed, each with a read buffered for a writer an hour away
    gate = EffectGate(table, store, keyring=Keyring.generate())
    gate._reads._interval = 3600
    ctx = CallContext(session_id="s", origin_message_id=f"m{n}", user_id="u", agent_id="a")
    gate.call("lookup", {"item": f"tea{n}"}, ctx)
    globals()[f"gate{n}"] = gate
"""


def test_every_live_logs_reads_are_written_at_exit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = open_store(url)
    store.setup()
    done = subprocess.run([sys.executable, "-c", CHILD, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(e.tool for e in store.events(kind="read")) == ["lookup"] * 3
    store.close()
