"""smolagents 1.26.0's own agent tests, with every agent they build run through a GatedAgent (`_swap`).

Run: `.venv/bin/pytest tests/framework_suites/smolagents` (collected by `make test` too).
`EFFECTGATE_SUITE_PLAIN=1` runs the same files without the swap: the baseline.

Re-vendoring for another version: `git show vX:tests/test_agents.py` (and `test_monitoring.py`,
`fixtures/`, `conftest.py`, `data/`) from the smolagents repository, with the header; run the
baseline, then the gated suite, and update `_expected.py` and the adapter README's fraction.

Tests that need a package the dev group does not install (numpy or pandas inside the agent's
code, ddgs, transformers) are skipped with that reason, in both modes; `shared_datadir` (the
pytest-datadir fixture upstream uses) is the vendored `data/` folder.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectgate import open_store
from tests._helpers import refuse_remote_sockets

from . import _swap
from ._expected import EXPECTED, NEEDS, TIMING

HERE = Path(__file__).parent
PLAIN = os.environ.get("EFFECTGATE_SUITE_PLAIN") == "1"
KEYRING = "k1:3b0f55408d665bf8ff62e674bc52fcccce10a55767f509cad555df7afaea20c5"  # a test key

if not PLAIN:
    _swap.install()  # before upstream's conftest captures MultiStepAgent.__init__

from .fixtures.agents import *  # noqa: E402,F403
from .fixtures.tools import *  # noqa: E402,F403
from .upstream_conftest import *  # noqa: E402,F403


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        name = f"{Path(str(item.path)).name}::{item.name}"
        if isinstance(item, pytest.Function) and item.cls is not None:
            name = f"{Path(str(item.path)).name}::{item.cls.__name__}::{item.name}"
        base = name.split("[")[0]
        needs = NEEDS.get(name) or NEEDS.get(base)
        missing = [m for m in (needs or "").split(",") if m and importlib.util.find_spec(m) is None]
        if missing:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {', '.join(missing)}, which the dev group does not install")
            )
            continue
        if name in TIMING and not PLAIN:
            item.add_marker(pytest.mark.skip(reason=f"timing-dependent when gated: {TIMING[name]}"))
            continue
        reason = EXPECTED.get(name) or EXPECTED.get(base)
        if reason is not None and not PLAIN:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture
def shared_datadir() -> Path:
    return HERE / "data"


@pytest.fixture(autouse=True)
def _gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's store (a SQLite file), the keyring, and no socket off this machine."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", KEYRING)
    refuse_remote_sockets(monkeypatch)
    if PLAIN:
        yield
        return
    store = open_store(f"sqlite:///{tmp_path}/suite.db")
    store.setup()
    gates = _swap.Gates(store, request.node.nodeid)
    with _swap.active(gates):
        yield
    if gates.reached:
        REACHED.add(request.node.nodeid)
    store.close()


REACHED: set[str] = set()
PASSED: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
        PASSED.add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REACHED:
        terminalreporter.write_line(
            f"smolagents suite: {len(REACHED)} tests ran a gated agent, {len(REACHED & PASSED)} of them "
            f"passed; {len(_swap.OUTSIDE_RUN & PASSED)} passed with run options GatedAgent.run lacks "
            "(stream, images, additional_args)"
        )
