"""`python -m benchmarks.smolagents --smoke` runs to the end and prints its ratio line."""

from __future__ import annotations

import json
from pathlib import Path

from tests._helpers import run_module


def test_smolagents_benchmark_smoke_run_prints_its_ratio(tmp_path: Path) -> None:
    """The smoke run exits 0, prints the Runner.run ratio, and writes its JSON report."""
    report = tmp_path / "bench.json"
    stdout = run_module("benchmarks.smolagents", "--smoke", "--json", str(report), "--dir", str(tmp_path))
    lines = stdout.splitlines()
    assert sum(line.startswith("ratio (h) smolagents read") for line in lines) == 1, stdout
    data = json.loads(report.read_text())
    assert set(data["ratios"]) == {"run"}
