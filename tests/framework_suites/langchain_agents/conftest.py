"""langchain 1.5.2's own create_agent tests, with effectgate's middleware on every agent with tools.

Run: `.venv/bin/pytest tests/framework_suites/langchain_agents -q` (collected by `make test`).
`EFFECTGATE_SUITE_PLAIN=1` runs the same files with create_agent as it is: the baseline.

The swap is `_swap.py`; the tests that do not pass with it are `_expected.py`, each a strict
xfail, so a test that starts passing or starts failing fails the run. The summary line counts
every vendored test, and apart the tests that built an agent with the gate (the others build no
agent with tools, so the swap leaves them as they are).

Test-runner stand-ins (the repository's dev group has neither pytest-asyncio nor pytest-mock):
an `async def` test without the anyio marker runs on a fresh event loop (upstream runs them with
pytest-asyncio in auto mode); `anyio_backend` is upstream's. No vendored file uses upstream's
checkpointer, store or `deterministic_uuids` fixtures. No test needs the network or an API key.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._helpers import refuse_remote_sockets

from . import _swap
from ._expected import EXPECTED

HERE = Path(__file__).parent
PLAIN = os.environ.get("EFFECTGATE_SUITE_PLAIN") == "1"
_results: dict[str, str] = {}  # test node id -> passed, xfailed, failed or skipped
_built: set[str] = set()  # the tests that built an agent with the gate
_answered: set[str] = set()  # those in which the gate answered a tool call


def _test_id(item: pytest.Item) -> str:
    return f"{Path(str(item.path)).name}::{item.name}"


def _ours(path: object) -> bool:
    return HERE in Path(str(path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not _ours(item.path):
            continue
        name = _test_id(item)
        reason = EXPECTED.get(name) or EXPECTED.get(name.split("[")[0])
        if reason is not None and not PLAIN:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """An `async def` test of these files runs on a fresh event loop (anyio runs its own)."""
    if not _ours(pyfuncitem.path) or not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    if pyfuncitem.get_closest_marker("anyio") is not None:
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count this suite's outcomes for the summary line (the measured fraction)."""
    if not _ours(report.fspath):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            _results[report.nodeid] = "xfailed" if report.skipped else "failed"
        else:
            _results[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _results:
        return
    counts = {k: list(_results.values()).count(k) for k in ("passed", "xfailed", "failed", "skipped")}
    total, passing = len(_results), counts["passed"]
    mode = "create_agent (plain)" if PLAIN else "effectgate's middleware"
    terminalreporter.write_line(
        f"langchain 1.5.2 create_agent tests with {mode}: {passing} of {total} pass unchanged "
        f"({100 * passing / total:.1f}%); xfailed {counts['xfailed']}, failed {counts['failed']}, "
        f"skipped {counts['skipped']}"
    )
    gated = [outcome for node, outcome in _results.items() if node in _built]
    if gated:
        ok = gated.count("passed")
        terminalreporter.write_line(
            f"  {len(gated)} of them built an agent with the gate: {ok} pass unchanged "
            f"({100 * ok / len(gated):.1f}%); in {len(_answered)} the gate answered a tool call"
        )


@pytest.fixture(autouse=True)
def gated_agents(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every agent with tools the test builds is gated, on a SQLite store of its own; no network."""
    refuse_remote_sockets(monkeypatch)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    if PLAIN:
        yield
        return
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + secrets.token_hex(32))
    _swap.install(monkeypatch, request.module, f"sqlite:///{tmp_path}/effectgate.db")
    try:
        yield
    finally:
        agents, calls = _swap.built()
        if agents:
            _built.add(request.node.nodeid)
        if calls:
            _answered.add(request.node.nodeid)
        _swap.uninstall()


# -- upstream's fixtures (libs/langchain_v1/tests/unit_tests/agents/conftest.py)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
