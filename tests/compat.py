"""The adapter suites on the lowest and on the newest framework versions each adapter declares.

    python3 tests/compat.py                          # every adapter, both bounds (`make compat`)
    python3 tests/compat.py --adapter smolagents --bound lowest
    python3 tests/compat.py --adapter openai_agents --bound lowest --pin openai-agents==0.22.3

Each (adapter, bound) gets a throwaway venv under `.compat/` holding `core/`, that adapter (both
editable) and pytest, nothing else, so an import the declared ranges do not cover fails here:

- lowest: every framework requirement in `integrations/<adapter>/pyproject.toml` pinned to its
  `>=` bound; the rest resolves as a user's install would (newest that fits). A requirement
  without both a lower and an upper bound is an error: the range is the promise being tested.
- newest: resolved from the index within the declared ranges, not from `uv.lock` (which may lag).

Then `tests/integrations/<adapter>` runs on SQLite (`-m "not postgres"`: the store contract is
tested on PostgreSQL by `make test`; these runs are about the framework). Logs go to
`.compat/<adapter>-<bound>.log`; the exit code is non-zero when any run fails. `--pin` replaces a
requirement by name (to probe a version below a bound before declaring it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".compat"
#: Longest suite first (about 95 s, 75 s, 60 s each), so two workers finish close together.
ADAPTERS = ("openai_agents", "langgraph", "smolagents")
BOUNDS = ("lowest", "newest")
#: Test tools, at the versions uv.lock holds (the suites' own dependencies come from the ranges).
TOOLS = ("pytest", "pytest-timeout")
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


@dataclass(frozen=True)
class Run:
    adapter: str
    bound: str
    requirements: tuple[str, ...]
    pinned: str = ""

    @property
    def name(self) -> str:
        return f"{self.adapter}-{self.bound}{self.pinned}"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def framework_requirements(adapter: str) -> list[tuple[str, str, str]]:
    """(name, lower bound, full requirement) for each dependency of the adapter but effectgate's own."""
    project = tomllib.loads((ROOT / "integrations" / adapter / "pyproject.toml").read_text())["project"]
    found = []
    for requirement in project["dependencies"]:
        match = _REQ.match(requirement)
        if match is None:
            raise SystemExit(f"{adapter}: cannot read the requirement {requirement!r}")
        name, _extras, spec = match.groups()
        if _normalize(name).startswith("effectgate"):
            continue
        clauses = [c.strip() for c in spec.split(",") if c.strip()]
        lower = [c[2:].strip() for c in clauses if c.startswith(">=")]
        upper = [c for c in clauses if c.startswith("<") and not c.startswith("<=")]
        if len(lower) != 1 or not upper:
            raise SystemExit(f"{adapter}: {requirement!r} must declare a range: >=LOWEST,<NEXT")
        found.append((name, lower[0], requirement))
    return found


def locked_tools() -> list[str]:
    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    versions = {_normalize(p["name"]): p["version"] for p in packages}
    return [f"{tool}=={versions[tool]}" for tool in TOOLS]


def plan(adapters: list[str], bounds: list[str], pins: list[str]) -> list[Run]:
    overrides = {}
    for pin in pins:
        match = _REQ.match(pin)
        if match is None:
            raise SystemExit(f"--pin {pin!r}: expected NAME==VERSION")
        overrides[_normalize(match.group(1))] = pin
    # Probes get their own venv and log, so several can run side by side.
    pinned = "".join(f"+{re.sub(r'[^A-Za-z0-9.]+', '-', p)}" for p in pins)
    runs = []
    for adapter in adapters:
        declared = framework_requirements(adapter)
        names = {_normalize(name) for name, _, _ in declared}
        # A pin for a package the adapter does not declare is added (a transitive one, e.g. openai).
        extra = tuple(pin for name, pin in overrides.items() if name not in names)
        for bound in bounds:
            chosen = [
                overrides.get(_normalize(name)) or (f"{name}=={lower}" if bound == "lowest" else requirement)
                for name, lower, requirement in declared
            ]
            runs.append(Run(adapter, bound, (*chosen, *extra), pinned))
    return runs


def execute(run: Run, uv: list[str], log_dir: Path, probes: list[str]) -> tuple[Run, int, float, str]:
    """Build the venv, install, run the suite; returns the exit code, seconds and the versions."""
    started = time.monotonic()
    venv = WORK / run.name
    shutil.rmtree(venv, ignore_errors=True)
    python = venv / "bin" / "python"
    log = log_dir / f"{run.name}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    extra = []
    if probes:  # a probe may sit outside the declared range: uv's override replaces it everywhere
        (log_dir / f"{run.name}.override").write_text("\n".join(probes) + "\n")
        extra = ["--override", str(log_dir / f"{run.name}.override")]
    if run.bound == "newest":  # ask the index again rather than trust a cached listing
        extra += [arg for name in _framework_names(run) for arg in ("--refresh-package", name)]
    steps = [
        [*uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        [
            *uv, "pip", "install", "--quiet", "--python", str(python),
            "-e", "core", "-e", f"integrations/{run.adapter}", *run.requirements, *locked_tools(), *extra,
        ],
    ]  # fmt: skip
    test = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not postgres"]
    steps.append([*test, f"tests/integrations/{run.adapter}"])
    versions = ""
    with log.open("w") as out:
        for i, step in enumerate(steps):
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            code = subprocess.call(step, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            if code != 0:
                return run, code, time.monotonic() - started, versions
            if i == 1:
                versions = installed(run, uv, python)
                out.write(f"framework versions: {versions}\n")
    return run, 0, time.monotonic() - started, versions


def installed(run: Run, uv: list[str], python: Path) -> str:
    listing = subprocess.run(
        [*uv, "pip", "freeze", "--python", str(python)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    wanted = {_normalize(r) for r in _framework_names(run)}
    pins = [line for line in listing.splitlines() if _normalize(line.split("==")[0]) in wanted]
    return " ".join(sorted(pins))


def _framework_names(run: Run) -> list[str]:
    names = [m.group(1) for r in run.requirements if (m := _REQ.match(r))]
    # Transitive packages the adapters import directly, reported beside the declared ones.
    return [*names, "langgraph-prebuilt", "langgraph-checkpoint", "openai"]


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--adapter", action="append", choices=ADAPTERS)
    parser.add_argument("--bound", action="append", choices=BOUNDS)
    parser.add_argument("--pin", action="append", default=[], help="NAME==VERSION instead of the bound")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    uv = os.environ.get("UV", f"{sys.executable} -m uv").split()
    WORK.mkdir(exist_ok=True)
    (WORK / ".gitignore").write_text("*\n")  # venvs and logs: never committed, never linted
    runs = plan(args.adapter or list(ADAPTERS), args.bound or list(BOUNDS), args.pin)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda r: execute(r, uv, WORK, args.pin), runs))
    failed = 0
    for run, code, seconds, versions in results:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"{run.name:22} {status:18} {seconds:6.0f}s  {versions}")
        if code != 0:
            failed += 1
            tail = (WORK / f"{run.name}.log").read_text().splitlines()[-40:]
            print("\n".join(f"    {line}" for line in tail))
    print(f"compat: {len(runs) - failed}/{len(runs)} runs passed in {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
