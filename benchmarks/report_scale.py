"""(f') `effectgate report` over a large ledger: wall time, CPU time and peak memory of the figures
(the database's aggregates) and of drawing them (the HTML report with its five charts).

The ledger is the audit's (`audit_scale.build`: 8 rows per gated call, the rest read events),
written straight into a SQLite file. The report runs in a child process, so its peak RSS is its
own (VmHWM), exactly as `effectgate report --html FILE` would: open the store, compute every
figure in one read transaction, render, write the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import audit_scale

TARGET_SECONDS = 5.0  # the figures: "seconds" for 1M records (the audit's budget is 2 s for its scan)
TARGET_MB = 300.0

_CHILD = """
import json, sys, time
from effectgate import Keyring, open_store
from effectgate.report import figures, write_html
store = open_store(sys.argv[1])
keyring = Keyring.parse(sys.argv[3])  # the seals are checked, as `effectgate report` does
w, c = time.perf_counter(), time.process_time()
report = figures(store, targets={"finance": 300}, keyring=keyring)
w, c = time.perf_counter() - w, time.process_time() - c
w2, c2 = time.perf_counter(), time.process_time()
write_html(report, sys.argv[2])
w2, c2 = time.perf_counter() - w2, time.process_time() - c2
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
m = report.metrics
print(json.dumps({"wall": w, "cpu": c, "draw_wall": w2, "draw_cpu": c2, "rss_mb": peak_mb(),
                  "proposals": m.proposals}))
"""


@dataclass(frozen=True)
class ReportResult:
    records: int
    gated: int
    wall_s: float  # the figures
    cpu_s: float
    draw_s: float  # the HTML report with its charts (matplotlib's import included)
    rss_mb: float
    proposals: int

    @property
    def met(self) -> bool:
        return self.wall_s <= TARGET_SECONDS and self.rss_mb <= TARGET_MB and self.proposals == self.gated


def measure(ledger: audit_scale.Ledger) -> ReportResult:
    """One report in a child process (its own peak memory)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            f"sqlite:///{ledger.path}",
            str(ledger.path.with_suffix(".html")),
            ledger.keyring,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return ReportResult(
        ledger.records,
        ledger.gated,
        data["wall"],
        data["cpu"],
        data["draw_wall"],
        data["rss_mb"],
        data["proposals"],
    )


def run(directory: Path, *, records: int, gated: int) -> ReportResult:
    ledger = audit_scale.build(directory, records=records, gated=gated)
    try:
        return measure(ledger)
    finally:
        for suffix in ("", "-wal", "-shm", ".keys"):
            Path(f"{ledger.path}{suffix}").unlink(missing_ok=True)
        ledger.path.with_suffix(".html").unlink(missing_ok=True)


def report(result: ReportResult) -> str:
    verdict = "met" if result.met else "MISSED"
    return (
        f"  report of {result.records:,} records ({result.gated:,} gated calls): figures "
        f"{result.wall_s:.2f} s wall, {result.cpu_s:.2f} s CPU; HTML with charts {result.draw_s:.2f} s; "
        f"{result.rss_mb:.0f} MB peak (target <= {TARGET_SECONDS:g} s, <= {TARGET_MB:g} MB): {verdict}"
    )


if __name__ == "__main__":  # python -m benchmarks.report_scale RECORDS GATED
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run(Path(tmp), records=int(sys.argv[1]), gated=int(sys.argv[2]))
        print(report(result), f"(built and measured in {time.perf_counter() - start:.0f} s)")
