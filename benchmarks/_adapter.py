"""The command line every adapter benchmark module shares: `python -m benchmarks.<adapter>`.

An adapter's module provides `FULL`, `SMOKE`, `run(directory, plans)`, `report(result)` (lines and
whether its target was met) and `to_json(result)`, and calls `main(module, title, argv)`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from ._timing import Stats


def duration(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def rows(cases: Sequence[tuple[str, Stats]]) -> list[str]:
    """One table row (median, p10, p90) per labelled case."""
    return [
        f"  {label:<52} {duration(s.median):>11} {duration(s.p10):>11} {duration(s.p90):>11}"
        for label, s in cases
    ]


def main(module: ModuleType, title: str, argv: Sequence[str] | None = None) -> int:
    name = module.__name__
    parser = argparse.ArgumentParser(
        prog=f"python -m {name}", description=(module.__doc__ or title).split("\n")[0]
    )
    parser.add_argument("--smoke", action="store_true", help="a few iterations; always exits 0")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--dir", metavar="DIR", help="where the database file goes (default: a temp dir)")
    args = parser.parse_args(argv)
    plans = module.SMOKE if args.smoke else module.FULL
    with tempfile.TemporaryDirectory(
        prefix=f"effectgate-bench-{name.rsplit('.', 1)[-1]}-", dir=args.dir
    ) as tmp:
        result = module.run(Path(tmp), plans)
    lines, met = module.report(result)
    mode = "smoke" if args.smoke else "full"
    print(f"effectgate {title} benchmarks ({mode}; median per operation over blocks, after warm-up)")
    print(f"  {'per operation':<52} {'median':>11} {'p10':>11} {'p90':>11}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": mode, **module.to_json(result)}, indent=2) + "\n")
    return 0 if args.smoke or met else 1
