"""Round 4 review of the benchmark harness: what each timer covers, and what the JSON keeps.

Nothing here compares timings: the tests count the work inside a timer (read records written,
connections opened) with the clock the benchmark reads replaced by one that takes that count.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import sqlite3
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import benchmarks.__main__ as bench_main
import effectgate
from benchmarks import (
    _adapter,
    arg_sizes,
    audit_scale,
    claims,
    concurrency,
    money_path,
    processes,
    read_path,
    report_scale,
)
from benchmarks._timing import Plan, Stats, interleaved
from effectgate import EffectGate


def _reads_written(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (n,) = conn.execute("SELECT count(*) FROM eg_events WHERE kind = 'read'").fetchone()
    return int(n)


def _clock_noting(count: Callable[[], int]) -> tuple[types.SimpleNamespace, list[int]]:
    """A stand-in for the `time` module whose `perf_counter_ns` notes `count()` at each reading."""
    seen: list[int] = []

    def perf_counter_ns() -> int:
        seen.append(count())
        return time.perf_counter_ns()

    return types.SimpleNamespace(perf_counter_ns=perf_counter_ns), seen


def _quiet(gate: EffectGate) -> EffectGate:
    """The background read writer waits an hour: only an explicit flush writes the records."""
    gate._reads._interval = 3600.0
    return gate


def _framework_case(name: str, tmp_path: Path) -> tuple[EffectGate, Callable[[int], int], Path, Any]:
    module = importlib.import_module(f"benchmarks.{name}")
    if name == "langgraph":
        gate = _quiet(module._gate(tmp_path))
        return gate, module._node_blocks(gate)["gated_node"], tmp_path / "langgraph.db", module
    if name == "openai_agents":
        module.set_tracing_disabled(True)
    gate = _quiet(_adapter.read_gate(tmp_path, f"{name}.db"))
    return gate, module._blocks(gate)["gated_run"], tmp_path / f"{name}.db", module


@pytest.mark.parametrize("name", ["langgraph", "openai_agents", "smolagents"])
def test_framework_gated_block_writes_its_read_records_inside_the_timer(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As (a) does: the read records a gated block makes are written before its timer stops,
    not later by the background writer (in the plain block's timer, or never timed at all)."""
    framework = {"langgraph": "langgraph", "openai_agents": "agents", "smolagents": "smolagents"}[name]
    pytest.importorskip(framework)
    gate, gated, db, module = _framework_case(name, tmp_path)
    try:
        before = len(gate._reads._items) + _reads_written(db)  # the untimed checks' reads
        clock, seen = _clock_noting(lambda: _reads_written(db))
        timer_module = _adapter if name == "smolagents" else module
        monkeypatch.setattr(timer_module, "time", clock)
        gated(3)
        monkeypatch.undo()
        # the clock was read twice: at the start and at the stop of the timer
        assert seen[-1] == before + 3, (seen, before)
    finally:
        gate.close()
        gate.store.close()


def test_concurrency_gate_pool_connections_open_before_the_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw side's workers each open their connection before the timer; the store's pool
    must have as many open when the timer starts, however the untimed first operations were
    scheduled (here: one after the other, so one pooled connection could serve them all)."""
    workers = 4
    connects = [0]

    def on_connect(*_: Any) -> None:
        connects[0] += 1

    sa.event.listen(sa.pool.Pool, "connect", on_connect)
    try:
        gate_make, ran = concurrency._gate(f"sqlite:///{tmp_path / 'gate.db'}", workers)
        serial = threading.Lock()

        def make(w: int) -> Callable[[int], None]:
            op = gate_make(w)

            def one(i: int) -> None:
                if i < 0:
                    with serial:  # the untimed first operations run one at a time
                        op(i)
                else:
                    op(i)

            return one

        readings: list[int] = []
        real = time.perf_counter

        def perf_counter() -> float:
            readings.append(connects[0])
            return real()

        monkeypatch.setattr(concurrency, "time", types.SimpleNamespace(perf_counter=perf_counter))
        concurrency._rate(workers, 3, make)
        assert ran() == workers * 4
        started, stopped = readings  # the timer's two readings
        assert stopped == started, "connections were opened inside the timer"
    finally:
        sa.event.remove(sa.pool.Pool, "connect", on_connect)
        while concurrency._OPENED:
            concurrency._OPENED.pop()()


def _stats(*values: float) -> Stats:
    return Stats(tuple(values), tuple(values))


@pytest.fixture
def synthetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m benchmarks` with every measurement replaced by a fixed result."""
    s = _stats(1000.0, 1000.0, 1000.0)
    monkeypatch.setattr(bench_main, "_pg_database", lambda: None)
    monkeypatch.setattr(read_path, "run", lambda d, p: read_path.ReadResult(s, s))
    monkeypatch.setattr(
        money_path,
        "run",
        lambda d, p: money_path.MoneyResult(s, s, s, dict(money_path.EXPECTED_COMMITS)),
    )
    monkeypatch.setattr(claims, "run", lambda d, p: claims.ClaimsResult(s, s))
    monkeypatch.setattr(arg_sizes, "run", lambda d, p: [])
    audit = audit_scale.AuditResult(100, 10, 3.0, 3.0, 50.0, 0, 3.5)  # over the 2 s target
    monkeypatch.setattr(audit_scale, "run", lambda d, records, gated: audit)
    report = report_scale.ReportResult(100, 10, 1.0, 1.0, 1.0, 400.0, 10)  # over 300 MB
    monkeypatch.setattr(report_scale, "run", lambda d, records, gated: report)
    rates = [
        concurrency.Rate("sqlite", 1, 1000.0, 100.0),  # no target at one worker
        concurrency.Rate("sqlite", 8, 1000.0, 400.0),  # 0.4x: missed
        concurrency.Rate("sqlite", 32, 1000.0, 900.0),  # 0.9x: met
    ]
    monkeypatch.setattr(concurrency, "run", lambda d, pg, ops, rounds: rates)
    monkeypatch.setattr(processes, "run", lambda d, sweep: [])
    monkeypatch.setattr(bench_main, "_frameworks", lambda d, smoke: {})


def test_json_keeps_every_target_beside_its_figure(
    synthetic: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json` carries, for each measurement that has a target, the target and whether it was
    met, as the printed lines do: the concurrency rates, the audit and the report included."""
    out = tmp_path / "bench.json"
    code = bench_main.main(["--json", str(out), "--dir", str(tmp_path), "--repeats", "3"])
    printed = capsys.readouterr().out
    assert code == 1  # the audit, the report and (d) at 8 workers missed
    data = json.loads(out.read_text())["ratios"]
    by_workers = {r["workers"]: r for r in data["concurrency"]}
    assert by_workers[8]["target"] == concurrency.TARGET
    assert by_workers[8]["met"] is False
    assert by_workers[32]["met"] is True
    assert by_workers[1]["met"] is None  # the target is at 8 and 32 workers
    for audit in data["audit"]:  # the realistic ledger and the stress case
        assert (audit["target_seconds"], audit["target_mb"], audit["met"]) == (
            audit_scale.TARGET_SECONDS,
            audit_scale.TARGET_MB,
            False,
        )
    [report] = data["report"]
    assert (report["target_seconds"], report["target_mb"], report["met"]) == (
        report_scale.TARGET_SECONDS,
        report_scale.TARGET_MB,
        False,
    )
    # the printed verdicts agree with the JSON's: one worker is not reported as a missed target
    one = next(line for line in printed.splitlines() if line.startswith("ratio (d) sqlite with  1"))
    assert "MISSED" not in one, one
    eight = next(line for line in printed.splitlines() if line.startswith("ratio (d) sqlite with  8"))
    assert "MISSED" in eight, eight


def test_concurrency_store_stays_open_through_its_own_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store the effectgate side is timed on is closed after its rate, not by the cleanup
    of the raw rate timed before it (it would then run on a closed store, its pool emptied)."""
    events: list[str] = []
    real_open = effectgate.open_store

    def open_store(url: str, **kwargs: Any) -> Any:
        store = real_open(url, **kwargs)
        close = store.close

        def closing() -> None:
            events.append("store closed")
            close()

        store.close = closing  # type: ignore[method-assign]
        return store

    def perf_counter() -> float:
        events.append("clock")
        return time.perf_counter()

    monkeypatch.setattr("benchmarks.concurrency.open_store", open_store)
    monkeypatch.setattr(concurrency, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(concurrency, "WORKERS", (2,))
    monkeypatch.setattr(concurrency, "ROUNDS", 1)
    [rate] = concurrency.run(tmp_path, None, ops=4)
    assert rate.workers == 2
    # raw: start, stop; effectgate: start, stop; then its store is closed
    assert events == ["clock", "clock", "clock", "clock", "store closed"], events


@pytest.mark.xfail(
    strict=True,
    reason="design decision: _timing.interleaved (and _writer.timed) turn the cyclic collector off "
    "inside each timed block and collect before it, outside the timer, so the garbage a gated "
    "block makes is collected where no timer runs; a user's process pays for those collections",
)
def test_interleaved_block_pays_for_collecting_its_own_garbage() -> None:
    """The collections a block's own allocations trigger happen inside its timer, as they would
    in the user's process (collecting before each block already keeps another's garbage out)."""
    inside = [False]
    during: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and inside[0]:
            during.append(info["generation"])

    def cyclic(n: int) -> int:
        inside[0] = True
        start = time.perf_counter_ns()
        for _ in range(n):
            node: list[Any] = []
            node.append(node)  # a cycle: only the collector frees it
        elapsed = time.perf_counter_ns() - start
        inside[0] = False
        return elapsed

    gc.callbacks.append(note)
    try:
        interleaved({"cyclic": cyclic}, Plan(n=5000, repeats=2, warmup=0))
    finally:
        gc.callbacks.remove(note)
    assert during, "no collection ran inside the timed blocks"
