"""`python -m benchmarks.openai_agents --smoke` runs to the end and prints its ratio line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_openai_agents_benchmark_smoke_run_prints_its_ratio(tmp_path: Path) -> None:
    """The smoke run exits 0, prints the Runner.run ratio, and writes its JSON report."""
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.openai_agents",
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
    assert sum(line.startswith("ratio (g) openai-agents read") for line in lines) == 1, done.stdout
    data = json.loads(report.read_text())
    assert set(data["ratios"]) == {"run"}
