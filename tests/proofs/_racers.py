"""The racing processes of the concurrency proofs: a pool of spawned workers, and what they do.

A worker is started once per test module with the spawn context and then takes commands; each
command opens its own store and gate on that test's database (the parent alone ran `setup()`),
parses the shared keyring from its `dumps()` text, and closes both when done. A race is
started the way a barrier would start it: every racer reports "ready" once connected, and acts
only when the parent, having heard from all of them, says "go". Everything a worker says is a
plain tuple on the shared results queue; anything unexpected is sent as ("crashed", index,
traceback) so the parent fails instead of waiting.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

from effectgate import EffectGate, Keyring, open_store
from effectgate.errors import TokenError

from ._money import Refunds, context, money_table, refund_args

Start = Callable[[], None]


class _Opened:
    """A gate on its own store and provider client, closed on exit."""

    def __init__(self, url: str, keyring: str, provider: str) -> None:
        self.refunds = Refunds(provider)
        self.gate = EffectGate(money_table(self.refunds), open_store(url), keyring=Keyring.parse(keyring))

    def __enter__(self) -> EffectGate:
        self.gate.store.approvals(limit=1)  # connect before the start, so the race is the gate's work
        return self.gate

    def __exit__(self, *exc: object) -> None:
        self.gate.close()
        self.gate.store.close()
        self.refunds.close()


def execute_grant(start: Start, url: str, keyring: str, provider: str, token: str) -> tuple[Any, ...]:
    """Present one token once, at the same moment as the others."""
    with _Opened(url, keyring, provider) as gate:
        start()
        try:
            outcome = gate.execute(token)
        except TokenError as exc:
            return ("token_error", exc.reason)
        return ("executed", outcome.replay)


def propose_intent(start: Start, url: str, keyring: str, provider: str) -> tuple[Any, ...]:
    """Propose the same refund from the same session and origin message as every other racer."""
    with _Opened(url, keyring, provider) as gate:
        start()
        outcome = gate.call("refund", refund_args("o-race"), context("s1", "m1"))
        return (
            type(outcome).__name__,
            getattr(outcome, "approval_id", None),
            getattr(outcome, "replay", None),
        )


def propose_rounds(
    start: Start, url: str, keyring: str, provider: str, session: str, rounds: int
) -> list[tuple[Any, ...]]:
    """In each round, propose a refund on that round's order at the same moment as the rival session."""
    seen = []
    with _Opened(url, keyring, provider) as gate:
        for i in range(rounds):
            start()
            outcome = gate.call("refund", refund_args(f"busy-{i}"), context(session, f"{session}-m{i}"))
            code, approval_id = getattr(outcome, "code", None), getattr(outcome, "approval_id", None)
            seen.append((i, session, type(outcome).__name__, code, approval_id))
    return seen


def execute_grants(
    start: Start, url: str, keyring: str, provider: str, tokens: list[str]
) -> list[tuple[Any, ...]]:
    """Execute `tokens` one after another; every outcome's approval, key and replay flag."""
    with _Opened(url, keyring, provider) as gate:
        return [(o.approval_id, o.idempotency_key, o.replay) for o in map(gate.execute, tokens)]


RACES: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (execute_grant, propose_intent, propose_rounds, execute_grants)
}


def serve(index: int, commands: Queue[Any], results: Queue[Any]) -> None:
    """A worker's loop: run (name, args) commands until None arrives."""

    def start() -> None:
        results.put(("ready", index))
        assert commands.get(timeout=300) == "go"

    while (command := commands.get()) is not None:
        name, args = command
        try:
            results.put(("done", index, RACES[name](start, *args)))
        except BaseException:
            results.put(("crashed", index, traceback.format_exc()))


class Pool:
    """Spawned workers (never forked: the parent holds engines) that race on command."""

    def __init__(self, size: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.results: Queue[Any] = spawn.Queue()
        self.commands: list[Queue[Any]] = [spawn.Queue() for _ in range(size)]
        self.procs = [
            spawn.Process(target=serve, args=(i, q, self.results), daemon=True)
            for i, q in enumerate(self.commands)
        ]
        for p in self.procs:
            p.start()
        self.closed = False

    def race(self, name: str, argsets: list[tuple[Any, ...]], *, timeout: float = 240) -> list[Any]:
        """Worker i runs `name(*argsets[i])`; whenever all running workers are ready, all of them
        are told to go. Returns what each returned, in worker order."""
        assert not self.closed, "a worker crashed earlier; the pool is closed"
        assert len(argsets) <= len(self.commands)
        workers = range(len(argsets))
        for i in workers:
            self.commands[i].put((name, argsets[i]))
        done: dict[int, Any] = {}
        ready: set[int] = set()
        try:
            while len(done) < len(argsets):
                kind, index, *rest = self.results.get(timeout=timeout)
                if kind == "crashed":
                    raise AssertionError(f"worker {index} crashed:\n{rest[0]}")
                if kind == "ready":
                    ready.add(index)
                    if len(ready) == len(argsets) - len(done):
                        ready.clear()
                        for i in workers:
                            if i not in done:
                                self.commands[i].put("go")
                else:
                    done[index] = rest[0]
        except BaseException:
            self.close()  # workers may be mid-command: this pool cannot be trusted any more
            raise
        return [done[i] for i in workers]

    def close(self) -> None:
        self.closed = True
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
