"""`python -m benchmarks --smoke` runs to the end and prints every ratio line (core and installed adapters).

Only that the benchmark works is asserted; its timings are never compared with anything here.
The writer-process benchmark's error accounting is checked on its own: a failure must show.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
from pathlib import Path

import sqlalchemy as sa

from benchmarks import _writer, processes
from tests._helpers import run_module


def test_benchmark_smoke_run_prints_every_ratio(tmp_path: Path) -> None:
    """The smoke run exits 0, prints one ratio line per measurement, and writes its JSON report."""
    report = tmp_path / "bench.json"
    stdout = run_module("benchmarks", "--smoke", "--json", str(report), "--dir", str(tmp_path))
    lines = stdout.splitlines()
    for prefix in (
        "ratio (a) read path",
        "ratio (b) money path",
        "ratio (c) claims",
        "ratio (f') report of",
        "ratio (e) langgraph read",
        "ratio (f) langgraph interrupt + resume",
        "ratio (g) openai-agents read",
        "ratio (h) smolagents read",
    ):
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, stdout)
    assert "target" in next(line for line in lines if line.startswith("ratio (a)"))
    assert "target" in next(line for line in lines if line.startswith("ratio (b)"))
    writers = [line for line in lines if line.startswith("ratio (c) SQLite writer processes")]
    assert len(writers) == 2, stdout  # smoke: 1 and 2 processes
    assert all("FAILED" not in line for line in writers), writers
    data = json.loads(report.read_text())
    assert data["mode"] == "smoke"
    assert set(data["ratios"]) >= {"read", "money", "claims", "concurrency", "processes"}
    assert [w["processes"] for w in data["ratios"]["processes"]] == [1, 2]
    for writers in data["ratios"]["processes"]:
        assert {"throughput_ratio", "p99_ratio", "target_throughput", "target_p99", "met"} <= set(writers)
        assert writers["gate"]["errors"] == 0, writers["gate"]["first_error"]
        assert writers["gate"]["records_ok"]
        assert writers["raw"]["records_ok"]
    assert set(data["frameworks"]["langgraph"]["ratios"]) == {"node", "roundtrip"}
    assert set(data["frameworks"]["openai_agents"]["ratios"]) == {"run"}
    assert set(data["frameworks"]["smolagents"]["ratios"]) == {"run"}
    assert data["money_commits"] == {"propose": 1, "approve": 1, "execute": 2}
    # (b) holds against the gate's own rows replayed, and reports the small-row baseline beside it
    assert "the same rows" in next(line for line in lines if line.startswith("ratio (b)"))
    assert {"ratio", "ratio_minimal_rows", "met"} <= set(data["ratios"]["money"])
    assert "money_raw_minimal" in data["cases"]


def test_writer_errors_are_counted_and_fail_the_store_side() -> None:
    """A writer's error is counted (lock waits apart), never retried or hidden, and fails the store."""
    barrier = mp.get_context("spawn").Barrier(1)

    def contended(key: str) -> None:
        if key.endswith(("1", "3")):
            driver = sqlite3.OperationalError("database is locked")
            raise sa.exc.OperationalError("INSERT ...", {}, driver) from driver
        if key.endswith("5"):
            raise RuntimeError("lease lost")

    outcome = _writer.timed(contended, [f"k{i}" for i in range(8)], barrier)
    assert (outcome.errors, outcome.locked, len(outcome.latencies_ns)) == (3, 2, 5)
    assert outcome.first_error is not None
    assert "database is locked" in outcome.first_error
    clean = _writer.Outcome(0, 10_000, 5_000, (1_000,) * 8, 0, 0, None)
    result = processes.ProcessesResult(
        processes=16,
        ops_per_process=8,
        rounds=1,
        raw=processes.summarise([[clean]], [], completed=8),
        gate=processes.summarise([[outcome]], [], completed=5),
    )
    assert result.failed
    assert result.met is False
    lines, met = processes.report([result])
    assert not met
    assert "store FAILED: 3 errors (2 lock waits given up)" in lines[-1]
    assert lines[-1].startswith("ratio (c) SQLite writer processes, 16")
    assert "MISSED" in lines[-1]
