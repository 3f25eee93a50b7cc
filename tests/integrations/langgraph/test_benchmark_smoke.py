"""`python -m benchmarks.langgraph --smoke` runs to the end and prints its two ratio lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_langgraph_benchmark_smoke_run_prints_both_ratios(tmp_path: Path) -> None:
    """The smoke run exits 0, prints the node and round-trip ratios, and writes its JSON report."""
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.langgraph",
            "--smoke",
            "--json",
            str(report),
            "--dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for prefix in ("ratio (e) langgraph read", "ratio (f) langgraph interrupt + resume"):
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, done.stdout)
    data = json.loads(report.read_text())
    assert set(data["ratios"]) == {"node", "roundtrip"}
