"""How the command prints: model and record values as text, shortened lists, whole cards."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from .._clock import SYSTEM_CLOCK
from .._display import countdown, when
from .._textcheck import _stray, hidden
from ..outcomes import Card, json_value

DEFAULT_DB = "sqlite:///effectgate.db"

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4, 5
EXIT_RAN_FAILED = 6  # approve --execute: the approval is recorded, then its run failed
EXIT_INTERNAL = 70
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a reader that went away

ARG_WIDTH = 60  # characters of one argument value in the `pending` list
LISTED_ARGS = 8  # arguments listed per approval in `pending`; the rest are counted
_PIPE_WIDTH = 100_000  # off a terminal: as wide as the content (a line is never folded)


def _escaped(ch: str) -> str:
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"


def _escape(text: str, *, newlines: bool = False) -> str:
    """`text` with every character that is invisible, reorders the line or drives the terminal
    written as an escape (\\u202e), so what is printed is what is stored. `newlines`: keep line
    breaks (only for text this module laid out, such as indented JSON)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(  # and a variation selector with nothing to vary (`_stray`): hidden text
        ch
        if (ch.isprintable() and not hidden(ch) and not _stray(text, i)) or (newlines and ch == "\n")
        else _escaped(ch)
        for i, ch in enumerate(text)
    )


def _text(value: object, style: str = "") -> Text:
    """Stored or model text as a rich Text: never parsed as markup, and with its line breaks
    escaped, so one value cannot pass for another line of the output."""
    return Text(_escape(str(value)), style=style)


def _one_line(message: object) -> str:
    return _escape(" ".join(str(message).split()))


def _compact(value: Any) -> str:
    return _escape(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _pretty(value: Any) -> str:
    return _escape(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True), newlines=True)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else f"{text[:width]}… (+{len(text) - width} chars)"


def _short(value: Any, width: int = ARG_WIDTH) -> str:
    """`value` as compact JSON in about `width` characters: a long list or object shows the
    items that fit and how many more there are; anything else is cut, with the count of hidden
    characters."""
    text = _compact(value)
    if len(text) <= width or not isinstance(value, list | dict) or not value:
        return _cut(text, width)
    pieces: Iterator[str]
    if isinstance(value, list):
        pieces, noun, (first, last) = (_compact(v) for v in value), "item", "[]"
    else:
        pieces = (f"{_compact(k)}: {_compact(v)}" for k, v in sorted(value.items()))
        noun, (first, last) = "key", "{}"
    shown: list[str] = []
    used = 2
    for piece in pieces:
        if used + len(piece) > width:
            break
        shown.append(piece)
        used += len(piece) + 2
    if not shown:
        return _cut(text, width)
    hidden = len(value) - len(shown)
    noun += "" if hidden == 1 else "s"
    return f"{first}{', '.join(shown)}, … (+{hidden} more {noun}){last}"


def _fields(values: Any) -> list[str]:
    """One `name: value` line per argument, each value shortened; at most LISTED_ARGS lines.
    Arguments edited in the database into something else than an object are one line."""
    if not isinstance(values, Mapping):
        return [_short(values)]
    items = sorted(values.items())
    lines = [f"{_cut(_escape(name), 24)}: {_short(v)}" for name, v in items[:LISTED_ARGS]]
    if len(items) > LISTED_ARGS:
        lines.append(f"… (+{len(items) - LISTED_ARGS} more arguments)")
    return lines


# -- the database, the keyring and the gate


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 (in our table: audit findings); `main` stops quietly instead.
        raise BrokenPipeError


def _console(*, demo: bool = False) -> Console:
    """Rich output for people: no markup, emoji codes or highlighting, and off a terminal nothing
    is wrapped (lines are as long as their content, so a pipe, grep or a CI log sees whole values).
    The demo prints its own styled script (markup on) at the terminal's or the pipe's width."""
    if demo:
        return _Console(highlight=False, emoji=False)
    options: dict[str, Any] = {"highlight": False, "emoji": False, "markup": False}
    console = _Console(**options)
    return console if console.is_terminal else _Console(width=_PIPE_WIDTH, **options)


def _write_json(data: Any) -> None:
    """Standard JSON: a number that has none (an expiry edited to infinity) is written as its
    name in a string ("Infinity", "-Infinity", "NaN"), never as a bare non-standard constant; a
    value JSON has no form for (a column edited into a BLOB) as its repr, as the text view shows it."""
    try:
        text = json.dumps(data, indent=2, ensure_ascii=True, allow_nan=False, default=repr)
    except ValueError:
        text = json.dumps(_finite(data), indent=2, ensure_ascii=True, allow_nan=False, default=repr)
    sys.stdout.write(text + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # its name as JSON's encoder spells it
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _run(runs: Sequence[Any]) -> dict[str, Any] | None:
    """An approval's latest run (execution row) as `show` gives it: succeeded, failed or
    needs_reconciliation (its outcome unknown), and why; None before any run."""
    return {"status": runs[-1].status, "error": runs[-1].error, "at": runs[-1].at} if runs else None


def _card_panel(
    card: Card,
    *,
    now: float | None = None,
    run: Mapping[str, Any] | None = None,
    status: tuple[str, str] | None = None,
) -> Text:
    """The whole card as `key  value` lines: every argument in full, the expiry with its
    countdown, the warnings first, the reason, and with `run` (`_run`) how its latest run ended.
    With `status` (`_display.card_status`: the column and what the executions and sealed
    decisions say) the card shows what they say, warned when the column (no seal's) differs.
    No box and no padding, so a pipe gets each value once at its own length (the demos print it)."""
    now = SYSTEM_CLOCK.now() if now is None else now
    column, shown = status or (card.status, card.status)
    said = f"its status column says {column}, but the executions and sealed decisions say {shown}"
    warnings = (*card.warnings, *((f"{said}: it was changed outside effectgate",) if shown != column else ()))
    ran = () if run is None else (f"{run['status']}: {run['error']}" if run["error"] else str(run["status"]),)
    rows: list[tuple[str, str, str]] = [
        *(("WARNING", _escape(w), "bold red") for w in warnings),
        ("tool", _escape(f"{card.tool}  ({card.effect}, {card.reversibility})"), ""),
        ("status", _escape(f"{shown}, version {card.version}"), ""),
        *(("run", _escape(r), "" if run and run["status"] == "succeeded" else "bold red") for r in ran),
        ("approver role", _escape(card.approver_role), ""),
        ("approvals", _escape(f"{card.approvals_given} of {card.approvals_required}"), ""),
        ("subject", _pretty(json_value(card.subject)) if card.subject else "-", ""),
        ("arguments", _pretty(json_value(card.args)), ""),
        ("args sha256", _escape(card.args_hash), ""),
        ("session / user", _escape(f"{card.session_id} / {card.user_id}"), ""),
        ("owner", _escape(card.owner or "-"), ""),
        ("created", _escape(when(card.created_at)), ""),
        ("expires", _escape(f"{when(card.expires_at)} ({countdown(card.expires_at, now)})"), ""),
        *(("note", _escape(n) if isinstance(n, str) else _compact(n), "") for n in card.notes),
        *((("reason", _escape(card.reason), ""),) if card.reason else ()),
    ]
    view = Text(_escape(f"approval {card.approval_id}"), style="bold red" if warnings else "bold")
    for key, value, style in rows:
        for i, line in enumerate(value.split("\n")):
            view.append(f"\n  {key if i == 0 else '':<15} ", style="bold")
            view.append(line, style=style)
    return view


def _pending_entry(card: Card, now: float) -> Text:
    """One approval in the `pending` list: a heading line (the whole id, which `approve` needs),
    then each argument, shortened, on its own indented line."""
    entry = Text.assemble(
        (_escape(card.approval_id), "bold"),
        _text(
            f"  v{card.version}  {card.tool}  role {card.approver_role}  "
            f"{card.approvals_given}/{card.approvals_required} approvals  "
            f"expires {countdown(card.expires_at, now)}"
        ),
    )
    if card.warnings:
        entry.append(f"  ! {len(card.warnings)} warning(s): see show", "bold red")
    for line in _fields(card.args):
        entry.append("\n    " + line)
    return entry


# -- commands
