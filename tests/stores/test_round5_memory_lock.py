"""Round 5: the lock that serialises an in-memory SQLite store (`sqlite://`: one connection
that every thread shares, `Checkouts.serial`). Deterministic: threads hand off with events and
joins whose timeout fails the test rather than hanging it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from effectgate import open_store
from effectgate.audit import export_jsonl
from effectgate.stores import SQLStore

JOIN = 10.0  # seconds a thread gets before the test fails (it never waits that long when correct)


@pytest.fixture
def memory() -> Iterator[SQLStore]:
    store = open_store("sqlite://")
    store.setup()
    yield store
    store.close()


def _in_thread(fn: Callable[[], Any]) -> tuple[bool, list[Any]]:
    """Run `fn` in a thread of its own: (finished in time, [its result or its exception])."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(JOIN)
    return not t.is_alive(), out


def test_an_export_consumed_by_different_threads_releases_the_store(memory: SQLStore) -> None:
    """A streamed export (`export_jsonl`, public) served chunk by chunk from a thread pool, as
    Starlette's StreamingResponse does with a sync iterator (each `next` in any worker thread):
    the read transaction is left in another thread than the one that began it. The lock must
    end with it: before, the last `next` raised RuntimeError (an RLock released by a thread that
    does not own it) and the store stayed locked by the first thread: every later use hung."""
    lines = export_jsonl(memory)
    first: list[str] = []
    took, stay = threading.Event(), threading.Event()

    def worker() -> None:  # a pool's worker thread: it lives on after its chunk
        first.append(next(lines))
        took.set()
        stay.wait(JOIN)

    kept = threading.Thread(target=worker, daemon=True)
    kept.start()
    try:
        assert took.wait(JOIN)
        assert first
        done, rest = _in_thread(lambda: list(lines))  # the other chunks, in another worker
        assert done
        assert isinstance(rest[0], list), rest[0]  # the rest of the export, no RuntimeError
        done, used = _in_thread(lambda: memory.events())
        assert done, "the store stays locked after the export ended"
        assert used == [[]]
    finally:
        stay.set()
        kept.join(JOIN)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_uses_the_store_can_use_it(memory: SQLStore) -> None:
    """A fork while another thread is inside a read transaction (a pre-fork server, a
    multiprocessing worker): the child inherits the lock held by a thread it does not have.
    Before, its first use of the store waited for that thread forever."""
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with memory.reading():
            inside.set()
            leave.wait(JOIN)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert inside.wait(JOIN)
    pid = os.fork()
    if pid == 0:  # the child: its use of the store, bounded by an alarm (exit 1), its verdict
        code = 3
        try:
            signal.signal(signal.SIGALRM, lambda *_: os._exit(1))
            signal.alarm(int(JOIN))
            code = 0 if memory.events() == [] else 2
        finally:
            os._exit(code)
    leave.set()
    holder.join(JOIN)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "1: the child hung on the store's lock"


@pytest.mark.parametrize("begin", ["transaction", "reading"])
def test_an_interrupt_inside_a_transaction_frees_the_store(memory: SQLStore, begin: str) -> None:
    """A KeyboardInterrupt (a BaseException) raised inside a transaction or a read leaves the
    store usable by the other threads (the lock is released on that path too)."""
    with pytest.raises(KeyboardInterrupt), getattr(memory, begin)():
        raise KeyboardInterrupt
    done, used = _in_thread(lambda: memory.events())
    assert done, "the store stays locked after the interrupt"
    assert used == [[]]
