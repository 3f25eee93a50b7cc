"""`python -m benchmarks.langgraph --smoke` runs to the end and prints its two ratio lines."""

from __future__ import annotations

import json
from pathlib import Path

from tests._helpers import run_module


def test_langgraph_benchmark_smoke_run_prints_both_ratios(tmp_path: Path) -> None:
    """The smoke run exits 0, prints the node and round-trip ratios, and writes its JSON report."""
    report = tmp_path / "bench.json"
    stdout = run_module("benchmarks.langgraph", "--smoke", "--json", str(report), "--dir", str(tmp_path))
    lines = stdout.splitlines()
    for prefix in ("ratio (e) langgraph read", "ratio (f) langgraph interrupt + resume"):
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, stdout)
    data = json.loads(report.read_text())
    assert set(data["ratios"]) == {"node", "roundtrip"}
