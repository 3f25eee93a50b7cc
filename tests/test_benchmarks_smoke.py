"""`python -m benchmarks --smoke` runs to the end and prints every ratio line (core and installed adapters).

Only that the benchmark works is asserted; its timings are never compared with anything here.
"""

from __future__ import annotations

import json
from pathlib import Path

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
        "ratio (e) langgraph read",
        "ratio (f) langgraph interrupt + resume",
        "ratio (g) openai-agents read",
        "ratio (h) smolagents read",
    ):
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, stdout)
    assert "target" in next(line for line in lines if line.startswith("ratio (a)"))
    assert "target" in next(line for line in lines if line.startswith("ratio (b)"))
    data = json.loads(report.read_text())
    assert data["mode"] == "smoke"
    assert set(data["ratios"]) >= {"read", "money", "claims", "concurrency"}
    assert set(data["frameworks"]["langgraph"]["ratios"]) == {"node", "roundtrip"}
    assert set(data["frameworks"]["openai_agents"]["ratios"]) == {"run"}
    assert set(data["frameworks"]["smolagents"]["ratios"]) == {"run"}
    assert data["money_commits"] == {"propose": 1, "approve": 1, "execute": 2}
