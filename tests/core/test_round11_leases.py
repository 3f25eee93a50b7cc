"""Round 11: leases, the read-record writer and store URLs (each reproduced first)."""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from collections.abc import Iterator
from typing import Any, cast

import pytest

from effectgate import (
    EffectGate,
    Executed,
    Policy,
    _readlog,
    open_store,
)
from effectgate._readlog import ReadLog
from effectgate.errors import StoreError
from effectgate.stores.protocol import Store
from effectgate.testing import EffectRecorder, FakeClock

from .test_lease_renewal import LEASE, _granted, _table


def test_a_slow_tool_on_a_store_in_memory_is_not_taken_over_and_run_twice(clock: FakeClock) -> None:
    """SQLite in memory: a tool that outlives its lease while another thread of the same process
    runs `recover()` (a reconcile that finds nothing at the provider runs the tool again). Its
    lease must be renewed, as on a file: the money moves once."""
    store = open_store("sqlite://", clock=clock)
    store.setup()
    receiver = EffectRecorder()
    started, go = threading.Event(), threading.Event()

    def pay(account: str, amount: int) -> dict[str, int]:
        """Pay `amount` to an account (the first run waits to be let go)."""
        receiver.record("pay", account=account, amount=amount)
        if receiver.count("pay") == 1:
            started.set()
            assert go.wait(30)
        return {"paid": amount}

    renewed = threading.Event()
    renew = store.renew_lease

    def counted(key: str, owner: str, *, lease_seconds: float) -> bool:
        ok = renew(key, owner, lease_seconds=lease_seconds)
        renewed.set()
        return ok

    store.renew_lease = counted  # type: ignore[method-assign]
    outcomes: list[Any] = []
    with EffectGate(_table(pay), store, clock=clock, policy=Policy(lease_seconds=LEASE)) as gate:
        token = _granted(gate).token
        runner = threading.Thread(target=lambda: outcomes.append(_outcome(gate, token)))
        runner.start()
        try:
            assert started.wait(30)
            for _ in range(3):  # three leases' worth of (fake) time, each step renewed (awaited)
                clock.advance(LEASE * 2 / 3)
                renewed.clear()
                renewed.wait(2)
            recovered = gate.recover()  # the same process: the run is live
        finally:
            go.set()
            runner.join(30)
    store.close()
    assert receiver.count("pay") == 1
    assert recovered == []
    assert [type(o) for o in outcomes] == [Executed]


def _outcome(gate: EffectGate, token: str) -> Any:
    try:
        return gate.execute(token)
    except Exception as exc:  # recorded for the assertion, not raised in the thread
        return exc


@pytest.mark.parametrize(
    ("query", "option"),
    [
        ("timeout=abc", "timeout"),
        ("detect_types=x", "detect_types"),
        ("cached_statements=many", "cached_statements"),
        ("check_same_thread=maybe", "check_same_thread"),
        ("timeout=1&timeout=2", "timeout"),  # given twice: a tuple SQLAlchemy cannot convert
        ("uri=true&timeout=abc", "timeout"),
        ("uri=maybe", "uri"),
        # SQLAlchemy read the pair as true (a URI), `in_memory` the last one (not one): an
        # in-memory database on a pool of connections, each its own empty database
        ("uri=true&uri=false", "uri"),
    ],
)
def test_a_malformed_sqlite_url_option_is_refused_by_name(tmp_path: Any, query: str, option: str) -> None:
    """A query option the driver cannot take was a bare ValueError (or TypeError) from inside
    SQLAlchemy that named no option; now a StoreError naming it, and nothing is created."""
    with pytest.raises(StoreError, match=option):
        open_store(f"sqlite:///{tmp_path / 'x.db'}?{query}")
    assert list(tmp_path.iterdir()) == []


class _DownThenUp:
    """A store as `ReadLog` uses it, unreachable for `down` writes (each one `step` seconds of the
    writer's clock after the last), then reachable: the write that lands stops the writer's loop."""

    def __init__(self, now: list[float], *, down: int, step: float) -> None:
        self.now, self.down, self.step = now, down, step
        self.attempts = 0
        self.rows: list[tuple[Any, ...]] = []
        self.readlog: ReadLog | None = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.attempts += 1
        self.now[0] += self.step
        if self.attempts <= self.down:
            raise ConnectionError("database unreachable")
        yield None

    def append_reads(self, _conn: Any, rows: Any) -> None:
        self.rows.extend(rows)
        assert self.readlog is not None
        self.readlog._wake = threading.Event()  # what close() does: this loop ends


def test_a_database_down_for_minutes_does_not_flood_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer retries every `interval` (0.2 s) while the database is down: before, each retry
    logged a WARNING with a full traceback (1500 of them in five minutes). Now the first failure
    is logged with its traceback, then a summary at most once a minute, then one line when the
    records are written again; none of the buffered records is lost."""
    now = [1000.0]
    monkeypatch.setattr(_readlog, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = _DownThenUp(now, down=1500, step=0.2)  # five minutes down
    readlog = ReadLog(cast(Store, store), interval=0)
    store.readlog = readlog
    readlog._items.extend([("read 1",), ("read 2",)])
    with caplog.at_level(logging.WARNING, logger="effectgate"):
        readlog._run(readlog._wake)  # the writer thread's loop, here in the test's thread
    assert store.rows == [("read 1",), ("read 2",)]  # written once the database is back
    assert store.attempts == 1501
    logged = [r for r in caplog.records if r.name == "effectgate" and "read records" in r.getMessage()]
    assert 3 <= len(logged) <= 8
    assert [r.exc_info is not None for r in logged] == [True] + [False] * (len(logged) - 1)
    assert "1500" in logged[-1].getMessage()  # the recovery line counts the failed attempts


@pytest.mark.parametrize("query", ["uri=true&mode=ro", "mode=ro&uri=true", "uri=true&mode=memory"])
def test_sqlite_uri_options_on_a_plain_name_are_refused(tmp_path: Any, query: str) -> None:
    """With uri=true SQLAlchemy appends the URI's options to the name; SQLite reads them only in a
    `file:` name: `sqlite:///x.db?mode=ro&uri=true` opened (and `setup` created) a read-write
    database in a new file named `x.db?mode=ro`, while `sqlite_file` (the key file, the CLI's
    checks) and `in_memory` read the URL as naming x.db, or a database in memory."""
    url = f"sqlite:///{tmp_path / 'x.db'}?{query}"
    with pytest.raises(StoreError, match="file:"):
        open_store(url).setup()
    assert list(tmp_path.iterdir()) == []


def test_sqlite_uri_options_on_a_file_name_still_open(tmp_path: Any) -> None:
    made = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    made.setup()
    made.close()
    store = open_store(f"sqlite:///file:{tmp_path / 'x.db'}?mode=ro&uri=true")
    store.check()
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir() if "?" in p.name) == []


def test_a_path_given_as_the_database_url_is_refused_clearly(tmp_path: Any) -> None:
    """`open_store(Path(...))` failed inside its own error message (`"://" in url`: "argument of
    type 'PosixPath' is not iterable"); now a StoreError that gives the URL to write."""
    path = tmp_path / "x.db"
    with pytest.raises(StoreError, match=f"sqlite:///{path}"):
        open_store(path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", [None, 5, b"postgresql+psycopg://u:s3cret@h/db"])
def test_a_database_url_that_is_no_string_is_refused_without_quoting_it(url: Any) -> None:
    with pytest.raises(StoreError, match="str") as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value)
