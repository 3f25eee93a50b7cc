"""langgraph-prebuilt 1.1.3's own ToolNode tests, with every ToolNode they build a gated node.

Run: `.venv/bin/pytest tests/framework_suites/langgraph_prebuilt -q` (collected by `make test`).
`EFFECTGATE_SUITE_PLAIN=1` runs the same files with langgraph's ToolNode: the baseline.
`EFFECTGATE_SUITE_NO_ORIGIN=1` does not supply the user message id (see `_swap.py`): most tests
then fail with MissingIdentity, which is what this suite measured before it was supplied.

The swap is `_swap.py`; the tests that do not pass with it are `_expected.py`, each a strict
xfail, so a test that starts passing or starts failing fails the run. Upstream's checkpointer
fixtures are taken in its default fast mode (`LANGGRAPH_TEST_FAST`: the in-memory saver only, no
PostgreSQL server); `anyio_backend` is upstream's. No test needs the network or an API key.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver

from tests._helpers import refuse_remote_sockets

from . import _swap
from ._expected import EXPECTED
from .memory_assert import MemorySaverAssertImmutable

HERE = Path(__file__).parent
PLAIN = os.environ.get("EFFECTGATE_SUITE_PLAIN") == "1"
NO_ORIGIN = os.environ.get("EFFECTGATE_SUITE_NO_ORIGIN") == "1"
_outcomes: dict[str, int] = {"passed": 0, "xfailed": 0, "failed": 0, "skipped": 0}


def _test_id(item: pytest.Item) -> str:
    return f"{Path(str(item.path)).name}::{item.name}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        name = _test_id(item)
        reason = EXPECTED.get(name) or EXPECTED.get(name.split("[")[0])
        if reason is not None and not PLAIN:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count this suite's outcomes for the summary line (the measured fraction)."""
    if HERE not in Path(report.fspath).resolve().parents:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            _outcomes["xfailed" if report.skipped else "failed"] += 1
        else:
            _outcomes[report.outcome] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    total = sum(_outcomes.values())
    if total:
        mode = "ToolNode (plain)" if PLAIN else "the gated node"
        passing = _outcomes["passed"]
        terminalreporter.write_line(
            f"langgraph-prebuilt 1.1.3 ToolNode tests with {mode}: {passing} of {total} pass unchanged "
            f"({100 * passing / total:.1f}%); xfailed {_outcomes['xfailed']}, failed "
            f"{_outcomes['failed']}, skipped {_outcomes['skipped']}"
        )


@pytest.fixture(autouse=True)
def gated_tool_node(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every ToolNode the test builds is a gated node on a SQLite store of its own; no network."""
    refuse_remote_sockets(monkeypatch)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    if PLAIN:
        yield
        return
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + secrets.token_hex(32))
    _swap.install(monkeypatch, request.module, f"sqlite:///{tmp_path}/effectgate.db", origin=not NO_ORIGIN)
    try:
        yield
    finally:
        _swap.uninstall()


# -- upstream's fixtures (libs/prebuilt/tests/conftest.py, fast mode)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sync_checkpointer() -> Iterator[BaseCheckpointSaver[str]]:
    with MemorySaverAssertImmutable() as saver:  # closing it removes its temporary file
        yield saver


@pytest.fixture
async def async_checkpointer() -> AsyncIterator[BaseCheckpointSaver[str]]:
    async with MemorySaverAssertImmutable() as saver:
        yield saver
