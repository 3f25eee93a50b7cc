"""Review of the gate's background machinery: the read-record writer across `os.fork`."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from effectgate._readlog import ReadLog


class _Sink:
    """A store as `ReadLog` uses it: the rows appended, and an event set on each write."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.wrote = threading.Event()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        yield None

    def append_reads(self, _conn: Any, rows: Any) -> None:
        self.rows.extend(rows)
        self.wrote.set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_writes_its_own_reads_and_not_the_parents() -> None:
    """A pre-fork worker (the gate made before the fork) must write its reads in the background
    like its parent, and must not write again the rows its parent still buffers (the parent
    writes them): before, the child had no writer thread (its reads waited for an explicit flush
    or an exit that `os._exit` skips) and a flush in the child wrote the parent's rows twice."""
    sink = _Sink()
    log = ReadLog(sink, interval=3600)  # type: ignore[arg-type]
    log.add(("parent",))  # buffered: the writer waits an hour or a batch
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            sink.rows.clear()
            sink.wrote.clear()
            log._batch = 1  # the next row wakes the writer at once
            log.add(("child",))
            code = 0 if sink.wrote.wait(10) and sink.rows == [("child",)] else 1
            if code == 0:
                log.flush()
                code = 0 if sink.rows == [("child",)] else 2
        finally:
            sys.stdout.flush()
            os._exit(code)  # as multiprocessing's forked workers end: no atexit
    _, status = os.waitpid(pid, 0)
    log.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert sink.rows == [("parent",)]


def test_reads_after_close_are_written_in_the_background_again() -> None:
    """A gate used again after `close()` (as its lease keeper allows: "a later hold starts it
    again") must keep writing its reads: before, they piled up in memory, unwritten until an
    explicit flush or a clean interpreter exit (lost on SIGTERM or `os._exit`)."""
    sink = _Sink()
    log = ReadLog(sink, batch=1, interval=3600)  # type: ignore[arg-type]
    log.add(("before",))
    assert sink.wrote.wait(10)
    log.close()
    sink.wrote.clear()
    log.add(("after",))
    try:
        assert sink.wrote.wait(10)
        assert sink.rows == [("before",), ("after",)]
    finally:
        log.close()
