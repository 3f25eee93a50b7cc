"""`python -m benchmarks [--smoke] [--json FILE] [--dir DIR] [--repeats N]`.

Prints a table (median, p10, p90 per operation) and one ratio line per measurement with its
target; a ratio is the median over blocks of the gate's block divided by the baseline block
timed next to it. A full run exits 1 when a target is missed; `--smoke` runs a few iterations, finishes
in seconds, prints the same lines and always exits 0 (it checks the benchmark runs, not speed).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import effectgate

from . import arg_sizes, audit_scale, claims, concurrency, money_path, processes, read_path, report_scale
from ._timing import Plan, Stats

READ_OVERHEAD_TARGET_US = 10.0
MONEY_RATIO_TARGET = 1.5
MONEY_CPU_TARGET_MS = 0.6

FULL = {
    "read": Plan(n=1024, repeats=15, warmup=2),
    "money": Plan(20, 15, 1),
    "claims": Plan(50, 15, 1),
    "sizes": Plan(200, 7, 1),
}
SMOKE = {
    "read": Plan(n=256, repeats=3, warmup=1),
    "money": Plan(3, 3, 1),
    "claims": Plan(5, 3, 1),
    "sizes": Plan(5, 2, 1),
}
#: (f) the audit: a realistic ledger of 1M records (25k gated calls, the rest reads), and the
#: stress case of 1M records that are all gated calls; smoke runs one small ledger.
AUDIT_FULL = ((1_000_000, 25_000), (1_000_000, 125_000))
AUDIT_SMOKE = ((20_000, 500),)
#: (f') the report over the realistic ledger (smoke: the small one).
REPORT_FULL = AUDIT_FULL[:1]


def _duration(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def _row(label: str, stats: Stats) -> str:
    return (
        f"  {label:<52} {_duration(stats.median):>11} {_duration(stats.p10):>11} {_duration(stats.p90):>11}"
    )


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def _pg_database() -> str | None:
    """A fresh database on the throwaway test server (started if needed), or None without one."""
    import uuid

    import sqlalchemy as sa

    from tests import pgserver

    try:
        base = pgserver.start()
    except (pgserver.Unavailable, OSError):
        return None
    name = f"bench_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return pgserver.url(name)


Framework = tuple[list[str] | None, bool, dict[str, Any] | None]


# Each adapter's benchmark module exposes SMOKE, FULL, run(directory, plans), report(result) -> (lines,
# met) and to_json(result); it is skipped when its framework is not installed.
FRAMEWORK_BENCHMARKS = ("langgraph", "openai_agents", "smolagents")


def _frameworks(directory: Path, *, smoke: bool) -> dict[str, Framework]:
    """Each installed adapter's benchmark: its report lines, whether its target was met, its JSON."""
    results: dict[str, Framework] = {}
    for name in FRAMEWORK_BENCHMARKS:
        if importlib.util.find_spec(f"benchmarks.{name}") is None:
            continue  # that adapter has no benchmark yet
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError:  # the adapter or its framework is not installed
            results[name] = (None, True, None)
            continue
        result = module.run(directory, module.SMOKE if smoke else module.FULL)
        lines, met = module.report(result)
        results[name] = (lines, met, module.to_json(result))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few iterations; always exits 0")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--dir", metavar="DIR", help="where the database files go (default: a temp dir)")
    parser.add_argument("--repeats", type=int, help="timed blocks per case (default 15, smoke 3)")
    args = parser.parse_args(argv)
    plans = SMOKE if args.smoke else FULL
    sweep = processes.SMOKE if args.smoke else processes.FULL
    if args.repeats:
        plans = {k: dataclasses.replace(p, repeats=args.repeats) for k, p in plans.items()}
        sweep = processes.with_repeats(sweep, args.repeats)

    with tempfile.TemporaryDirectory(prefix="effectgate-bench-", dir=args.dir) as tmp:
        directory = Path(tmp)
        began = time.perf_counter()
        read = read_path.run(directory, plans["read"])
        money = money_path.run(directory, plans["money"])
        claim = claims.run(directory, plans["claims"])
        sizes = arg_sizes.run(directory, plans["sizes"])
        audits = [
            audit_scale.run(directory, records=r, gated=g)
            for r, g in (AUDIT_SMOKE if args.smoke else AUDIT_FULL)
        ]
        reports = [
            report_scale.run(directory, records=r, gated=g)
            for r, g in (AUDIT_SMOKE if args.smoke else REPORT_FULL)
        ]
        rounds = 1 if args.smoke else None  # smoke: that it runs, not a median
        rates = concurrency.run(directory, _pg_database(), ops=40 if args.smoke else 1920, rounds=rounds)
        writers = processes.run(directory, sweep)
        frameworks = _frameworks(directory, smoke=args.smoke)
        elapsed = time.perf_counter() - began

    mode = "smoke" if args.smoke else "full"
    raw_commits = sum(money.commits.values())
    print(
        f"effectgate {effectgate.__version__} benchmarks ({mode}; median of {plans['read'].repeats} "
        f"blocks after warm-up; SQLite {sqlite3.sqlite_version} file, WAL, synchronous=FULL; "
        f"Python {platform.python_version()}; {elapsed:.1f}s)"
    )
    print(f"  {'per operation':<52} {'median':>11} {'p10':>11} {'p90':>11}")
    print(_row("(a) add(1, 2), called directly", read.direct))
    print(_row('(a) gate.call("add", ...), a read tool', read.gated))
    print(_row("(b) gate: propose + approve + execute, no-op money", money.gated))
    print(_row(f"(b) raw sqlite3: the gate's rows, replayed in {raw_commits} commits", money.raw))
    print(_row(f"(b) raw sqlite3: small rows, minimal schema, {raw_commits} commits", money.minimal))
    print(_row("(c) store.claim + store.complete, distinct keys", claim.gated))
    print(_row("(c) raw sqlite3: the same writes in 2 commits", claim.raw))
    writer_lines, writers_met = processes.report(writers)
    print("\n".join(line for line in writer_lines if not line.startswith("ratio ")))
    for s_ in sizes:
        print(_row(f"(g) gate.call read with {s_.label} of arguments", s_.gated))
        print(_row(f"(g) json encode + sha256 of the same {s_.label}", s_.floor))
    print(
        f"  CPU per operation (all threads): read direct {_duration(read.direct.cpu_median or 0)}, "
        f"read gated {_duration(read.gated.cpu_median or 0)}, money gated "
        f"{_duration(money.gated.cpu_median or 0)}, money raw (the gate's rows) "
        f"{_duration(money.raw.cpu_median or 0)}, money raw (small rows) "
        f"{_duration(money.minimal.cpu_median or 0)}"
    )
    counted = ", ".join(f"{k} {v}" for k, v in money.commits.items())
    expected = ", ".join(f"{k} {v}" for k, v in money_path.EXPECTED_COMMITS.items())
    same = money.commits == money_path.EXPECTED_COMMITS
    print(
        f"  commits on the money path: {counted} ({'as the code says' if same else f'EXPECTED {expected}'})"
    )
    print()

    read_met = read.overhead_us < READ_OVERHEAD_TARGET_US
    money_met = money.ratio <= MONEY_RATIO_TARGET
    print(
        f"ratio (a) read path, gate.call / direct call: {read.ratio:,.0f}x; overhead "
        f"{read.overhead_us:.1f} us per call (target: overhead < {READ_OVERHEAD_TARGET_US:.0f} us) "
        f"{_verdict(read_met)}"
    )
    print(
        f"ratio (b) money path, gate / the same rows in {raw_commits} raw commits: {money.ratio:.2f}x "
        f"(target: <= {MONEY_RATIO_TARGET}x) {_verdict(money_met)}; against small rows in a minimal "
        f"schema {money.minimal_ratio:.2f}x (no target)"
    )
    print(
        f"ratio (c) claims, claim + complete / 2 raw commits: {claim.ratio:.2f}x; "
        f"{claim.per_second:,.0f} claims per second (no target)"
    )
    print("\n".join(line for line in writer_lines if line.startswith("ratio ")))
    money_cpu_added_ms = ((money.gated.cpu_median or 0) - (money.raw.cpu_median or 0)) / 1e6
    cpu_met = money_cpu_added_ms <= MONEY_CPU_TARGET_MS
    minimal_added_ms = ((money.gated.cpu_median or 0) - (money.minimal.cpu_median or 0)) / 1e6
    print(
        f"ratio (b') money path CPU added by the gate to the same rows' commits: {money_cpu_added_ms:.2f} ms "
        f"per cycle (target: <= {MONEY_CPU_TARGET_MS} ms) {_verdict(cpu_met)}; to small rows' "
        f"{minimal_added_ms:.2f} ms (no target)"
    )
    for s_ in sizes:
        print(
            f"ratio (g) arguments of {s_.label}, gate.call / encode + hash: {s_.ratio:.2f}x "
            f"(one walk, one encode, one hash per call; no target)"
        )
    for a_ in audits:
        print("ratio (f)" + audit_scale.report(a_).strip().removeprefix("audit"))
    for r_ in reports:
        print("ratio (f') " + report_scale.report(r_).strip())

    rates_met = True
    for r in rates:
        rates_met = rates_met and r.met is not False  # the target is at 8 and 32 workers
        target = "target at 8 and 32 workers)" if r.met is None else f"target: >= {concurrency.TARGET}x)"
        print(
            f"ratio (d) {r.backend} with {r.workers:>2} workers, execute path / raw 2 commits: "
            f"{r.ratio:.2f}x ({r.gate_per_s:,.0f} vs {r.raw_per_s:,.0f} per s; {target}"
            + ("" if r.met is None else f" {_verdict(r.met)}")
        )
    if not any(r.backend == "postgresql" for r in rates):
        print("ratio (d) postgresql: not measured (no PostgreSQL server; see tests/pgserver.py)")

    frameworks_met = True
    for name, (lines, met, _) in frameworks.items():
        if lines is None:
            print(f"ratio {name}: not measured (install the adapter: uv sync --all-packages)")
            continue
        frameworks_met = frameworks_met and met
        print("\n".join(line for line in lines if line.startswith("ratio ")))

    if args.json:
        report: dict[str, Any] = {
            "mode": mode,
            "effectgate": effectgate.__version__,
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "seconds": elapsed,
            "plans": {k: dataclasses.asdict(p) for k, p in plans.items()}
            | {"processes": dataclasses.asdict(sweep)},
            "cases": {
                "read_direct": read.direct.to_dict(),
                "read_gated": read.gated.to_dict(),
                "money_gated": money.gated.to_dict(),
                "money_raw": money.raw.to_dict(),
                "money_raw_minimal": money.minimal.to_dict(),
                "claims_gated": claim.gated.to_dict(),
                "claims_raw": claim.raw.to_dict(),
            },
            "money_commits": money.commits,
            "ratios": {
                "read": {
                    "ratio": read.ratio,
                    "overhead_us": read.overhead_us,
                    "target_overhead_us": READ_OVERHEAD_TARGET_US,
                    "met": read_met,
                },
                "money": {
                    "ratio": money.ratio,
                    "target": MONEY_RATIO_TARGET,
                    "met": money_met,
                    "ratio_minimal_rows": money.minimal_ratio,
                },
                "claims": {"ratio": claim.ratio, "per_second": claim.per_second, "target": None},
                "money_cpu": {
                    "added_ms": money_cpu_added_ms,
                    "added_ms_minimal_rows": minimal_added_ms,
                    "target_ms": MONEY_CPU_TARGET_MS,
                    "met": cpu_met,
                },
                "sizes": [{"label": s_.label, "ratio": s_.ratio, "target": None} for s_ in sizes],
                "audit": [
                    dataclasses.asdict(a_)
                    | {"target_seconds": audit_scale.TARGET_SECONDS, "target_mb": audit_scale.TARGET_MB}
                    | {"met": a_.met}
                    for a_ in audits
                ],
                "report": [
                    dataclasses.asdict(r_)
                    | {"target_seconds": report_scale.TARGET_SECONDS, "target_mb": report_scale.TARGET_MB}
                    | {"met": r_.met}
                    for r_ in reports
                ],
                "concurrency": [
                    dataclasses.asdict(r)
                    | {"ratio": r.ratio, "target": None if r.met is None else concurrency.TARGET}
                    | {"met": r.met}
                    for r in rates
                ],
                **processes.to_json(writers)["ratios"],
            },
            "frameworks": {name: data for name, (_, _, data) in frameworks.items()},
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")

    if args.smoke:
        return 0
    audit_met = audits[0].met  # the realistic ledger carries the target; the stress case is reported
    report_met = reports[0].met
    met = read_met and money_met and cpu_met and audit_met and same and frameworks_met and writers_met
    met = met and report_met and rates_met
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
