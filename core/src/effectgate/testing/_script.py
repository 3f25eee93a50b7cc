from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count(1)


class ScriptError(AssertionError):
    """The scripted planner was asked for more than it holds, or left steps unused."""


@dataclass(frozen=True)
class Call:
    """One tool call the model makes; `id` is the tool-call id a framework would carry."""

    name: str
    args: Mapping[str, Any]
    id: str = field(default_factory=lambda: f"call_{next(_ids)}")


@dataclass(frozen=True)
class Say:
    """The model answers in text and makes no call."""

    text: str


@dataclass(frozen=True)
class Step:
    """One model turn: several tool calls at once (parallel calls)."""

    calls: tuple[Call, ...]


def call(name: str, /, *, id: str | None = None, **args: Any) -> Call:
    """A call of `name` with `args`; `id=` is the call's id, never an argument (for a tool that
    takes an argument named `id`, write `Call(name, {"id": ...})`)."""
    return Call(name, args) if id is None else Call(name, args, id)


def say(text: str) -> Say:
    return Say(text)


def step(*calls: Call) -> Step:
    if not calls:
        raise ValueError("a step needs at least one call")
    return Step(tuple(calls))


Turn = Step | Say


def _well_formed(turn: Any) -> bool:
    """Whether `turn` is a Say of text or a Step of calls each with a text name and id and its
    arguments in a mapping of text keys (what every adapter's fake model replays as it is)."""
    if isinstance(turn, Say):
        return isinstance(turn.text, str)
    calls = turn.calls if isinstance(turn, Step) and isinstance(turn.calls, tuple | list) else ()
    return bool(calls) and all(
        isinstance(c, Call)
        and isinstance(c.name, str)
        and isinstance(c.id, str)
        and isinstance(c.args, Mapping)
        and all(isinstance(k, str) for k in c.args)
        for c in calls
    )


class Script:
    """A deterministic planner: each `next_turn()` returns the next turn, in order, once."""

    def __init__(self, turns: Iterable[Call | Say | Step]) -> None:
        self.turns: tuple[Turn, ...] = tuple(Step((t,)) if isinstance(t, Call) else t for t in turns)
        for n, turn in enumerate(self.turns, 1):  # a str meant as say(), a list meant as step()
            if not _well_formed(turn):
                raise TypeError(
                    f"turn {n} is {turn!r}: each turn is call(...), say(...) or step(...), with a text "
                    "name and id, arguments in a mapping of text keys, and text to say"
                )
        self._pos = 0
        self._lock = threading.Lock()
        self.seen: list[Any] = []

    def next_turn(self, observation: Any = None) -> Turn:
        """The next turn; `observation` (what the model was shown) is kept for assertions."""
        with self._lock:
            if self._pos >= len(self.turns):
                raise ScriptError(
                    f"the model was asked for turn {self._pos + 1} but the script has {len(self.turns)}"
                )
            turn = self.turns[self._pos]
            self._pos += 1
            self.seen.append(observation)
            return turn

    @property
    def remaining(self) -> int:
        return len(self.turns) - self._pos

    def assert_complete(self) -> None:
        if self.remaining:
            raise ScriptError(f"{self.remaining} scripted turn(s) were never used: {self.turns[self._pos :]}")
