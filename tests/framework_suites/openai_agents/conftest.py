"""openai-agents 0.24.0's own tool tests, with every FunctionTool they build gated (see `_swap`).

Run: `.venv/bin/pytest tests/framework_suites/openai_agents` (collected by `make test` too).
`EFFECTGATE_SUITE_PLAIN=1` runs the same files without the swap: the baseline, where every test
passes (the expected failures below then xpass, which strict xfail reports as failures).

Re-vendoring for another SDK version: `pip download --no-deps --no-binary :all: openai-agents==X`
(the sdist carries `tests/`), copy the same files and their helpers with the header, rewrite only
`from tests.X` to `from tests.framework_suites.openai_agents.X`, run the baseline, then the gated
suite, and update `_expected.py` and the adapter README's measured fraction.

Test-runner stand-ins (the repository's dev group has neither package): `async def` tests run on
a fresh event loop each (upstream uses pytest-asyncio in auto mode), and `inline_snapshot.snapshot`
is the identity when inline-snapshot is not installed (a snapshot compares equal to its value).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents.tracing import setup as tracing_setup
from agents.tracing.provider import DefaultTraceProvider
from agents.tracing.setup import set_trace_provider

from effectgate import open_store
from tests._helpers import refuse_remote_sockets

from . import _swap
from ._expected import EXPECTED
from .testing_processor import SPAN_PROCESSOR_TESTING

if "inline_snapshot" not in sys.modules:
    try:
        import inline_snapshot  # noqa: F401
    except ImportError:
        stub = types.ModuleType("inline_snapshot")
        stub.snapshot = lambda value=None: value  # type: ignore[attr-defined]
        sys.modules["inline_snapshot"] = stub

from .upstream_conftest import *  # noqa: F403 (upstream's fixtures: span processor, no real models)


# Upstream's two session-wide fixtures, scoped to each vendored module here so that nothing leaks
# into the rest of the repository's session (the trace provider is put back, the key removed).
@pytest.fixture(scope="module", autouse=True)
def setup_span_processor() -> Iterator[None]:
    previous = tracing_setup.GLOBAL_TRACE_PROVIDER
    provider = DefaultTraceProvider()
    provider.set_processors([SPAN_PROCESSOR_TESTING])
    set_trace_provider(provider)
    yield
    provider.shutdown()
    tracing_setup.GLOBAL_TRACE_PROVIDER = previous


@pytest.fixture(autouse=True)
def ensure_openai_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.environ.get("OPENAI_API_KEY"):
        monkeypatch.setenv("OPENAI_API_KEY", "test_key")


HERE = Path(__file__).parent
PLAIN = os.environ.get("EFFECTGATE_SUITE_PLAIN") == "1"
KEYRING = "k1:3b0f55408d665bf8ff62e674bc52fcccce10a55767f509cad555df7afaea20c5"  # a test key

if not PLAIN:
    _swap.install()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asyncio: upstream's pytest-asyncio marker (run on a fresh loop)")
    config.addinivalue_line("markers", "allow_call_model_methods: upstream marker")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """Tools the vendored modules build at import are swapped too."""
    token = _swap.SWAPPING.set(not PLAIN)
    try:
        return (yield)
    finally:
        _swap.SWAPPING.reset(token)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PLAIN:
        return
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        name = f"{Path(str(item.path)).name}::{item.name}"
        reason = EXPECTED.get(name) or EXPECTED.get(name.split("[")[0])
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


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
    gates = _swap.Gates(store)
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
            f"openai-agents suite: {len(REACHED)} tests reached the gate, "
            f"{len(REACHED & PASSED)} of them passed"
        )
