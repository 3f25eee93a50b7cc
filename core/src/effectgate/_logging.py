"""The gate's loggers: a log handler or filter that raises changes nothing the gate does.

Python's logging passes an exception from a handler's `emit` (one that does not catch its own
errors, as the standard handlers do) or from a filter straight to the code that logged. The gate
logs between steps that must all happen (a record stored, then its approver paged), so every
module logs through `logger(name)`: the same logger, whose records are the same, but a failure
inside logging is dropped there (there is nowhere left to report it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

INFO = logging.INFO
_QUIET: ContextVar[bool] = ContextVar("effectgate_quiet_logs", default=False)


class GuardedLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose calls never raise; records are those of the logger it wraps (same name,
    level, handlers; the caller's file and line, not this module's)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.logger.isEnabledFor(level) or _QUIET.get():  # the first: as cheap as a plain logger's
            return
        try:
            # one frame more than a plain logger call: this one, so the record names the caller
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            super().log(level, msg, *args, **kwargs)
        except Exception:  # noqa: S110 - a failing handler must not change the gate's outcome
            pass


@contextmanager
def quiet() -> Iterator[None]:
    """No record from the gate's loggers in this context (this thread, or this task): `replay`'s
    sandbox gate proposes, approves and executes nothing of the application's, and its records
    would read exactly like the application's own."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def logger(name: str) -> GuardedLogger:
    """The guarded form of `logging.getLogger(name)`."""
    return GuardedLogger(logging.getLogger(name))


def one_line(text: str) -> str:
    """`text` for a log message, with every character that is not printable (line breaks, `\\r`,
    terminal escapes, bidirectional controls, line separators) written as an escape (`\\u001b`),
    as the command's log handler writes them: text a tool or the model wrote (a tool's error
    quoting its arguments) cannot pass for another log line in a handler that escapes nothing."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"
        for ch in text
    )
