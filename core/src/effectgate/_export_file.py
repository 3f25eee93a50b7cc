"""Reading an export file or manifest that is not trusted yet (`effectgate.export`): lines are
streamed with a bound on their length, and JSON is parsed strictly (a key named twice, or NaN and
Infinity, is not JSON the exporter writes)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from ._logging import logger
from .canonical import MAX_SAFE_INTEGER

log = logger("effectgate.export")

#: The longest line `verify_export` and `redact_export` read (bytes, without its newline): a
#: longer one is refused before it is held in memory whole.
MAX_LINE = 16 * 1024 * 1024


class LineError(ValueError):
    """A line of an export file that cannot be a chain line (too long, not UTF-8, no newline)."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each named once (a repeated key could show one value to a
    reader and another to a parser: Python keeps the last, others the first)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a repeated key")
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_loads(text: str | bytes) -> Any:
    """`json.loads`, refusing a repeated key at any depth and NaN/Infinity (ValueError)."""
    return json.loads(text, object_pairs_hook=_once, parse_constant=_no_constant)


def line_text(line: Mapping[str, Any]) -> str:
    """A chain line as the exporter writes it (and `verify_export` requires it, byte for byte)."""
    return json.dumps(line)


def fitted(line: dict[str, Any], max_line: int, error: Callable[[str], Exception]) -> str:
    """`line_text(line)`, at most `max_line` bytes (what `read_lines` reads back): its longest
    personal values (outside the chain, their commitments inside it) are left out until it fits,
    as an erased value is, and logged; `error(message)` is raised when the record alone is longer."""
    text, personal = line_text(line), dict(line.get("personal") or {})  # ASCII: one byte a character
    while len(text) > max_line and personal:
        column = max(personal, key=lambda c: len(personal[c]))
        del personal[column]
        text = line_text({**line, "personal": personal})
        log.warning(
            "export: record %s's %s left out of the file (longer than %d bytes)",
            line["seq"],
            column,
            max_line,
        )
    if len(text) > max_line:
        why = f"is longer than {max_line} bytes even without its personal values: nothing was exported"
        raise error(f"record {line['seq']} {why}")
    return text


def doubles(value: Any) -> Any:
    """A record's facts as the numbers their canonical text holds: RFC 8785 writes a float past
    2**53 as digits (1e16 as 10000000000000000), which parse back as an integer canonical JSON
    refuses (and no gate stores: `freeze` refuses it), so it is that float again."""
    if type(value) is int and abs(value) > MAX_SAFE_INTEGER:
        return float(value)
    if isinstance(value, dict):
        return {k: doubles(v) for k, v in value.items()}
    return [doubles(v) for v in value] if isinstance(value, list) else value


def read_lines(path: str | Path, *, max_line: int = MAX_LINE) -> Iterator[tuple[int, str]]:
    """Each line of the file (1-based number, text without its newline), read one at a time.
    Raises LineError for a line longer than `max_line` bytes, one that is not UTF-8, or a last line
    without its newline (the exporter ends every line with one); OSError when it cannot be read or
    is not a regular file (a named pipe put in its place would block the read for ever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a pipe does not wait for a writer
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        number = 0
        while raw := f.readline(max_line + 1):
            number += 1
            if not raw.endswith(b"\n"):
                if len(raw) > max_line:
                    raise LineError(number, f"longer than {max_line} bytes (not a chain line)")
                raise LineError(number, "the file does not end with a newline (cut short or changed)")
            try:
                text = raw[:-1].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LineError(number, f"not UTF-8 ({exc.reason})") from exc
            yield number, text


def read_small(path: str | Path, *, limit: int | None) -> bytes:
    """The whole file, when it is a regular file of at most `limit` bytes (None: any size;
    ValueError otherwise: a named pipe would block the read for ever; OSError when it cannot be
    read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a pipe does not wait for a writer
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = f.read(-1 if limit is None else limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError(f"{path} is longer than {limit} bytes")
    return data


def linked(target: Path) -> bool:
    """`target` is a symlink, or has another hard link: renaming a new file over it would leave
    the old content (what an erasure removed) under the other name."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    return stat.S_ISLNK(st.st_mode) or st.st_nlink > 1


@contextmanager
def rewrite(target: Path, busy: Callable[[str], Exception], *, erasing: bool = False) -> Iterator[TextIO]:
    """Write `target` anew: into `target.partial`, created by this writer alone, flushed to disk
    and renamed over `target` when the block ends, and removed if it fails. `busy(message)` is
    raised, nothing written, when the partial exists: another rewrite of `target` is under way (two
    writers of one file would interleave, and the last rename would bring back what the other
    erased), or one was interrupted and left it. `erasing`: `target` must be its content's only
    name (`linked`)."""
    if erasing and linked(target):
        raise busy(
            f"{target} was not changed: it is a symlink or has another hard link, which would keep "
            "the erased values (give the file itself, with no other link)"
        )
    partial = target.with_name(target.name + ".partial")
    try:
        out = partial.open("x", encoding="utf-8", newline="")  # "\n" as written, never "\r\n"
    except FileExistsError:
        raise busy(
            f"{target} was not changed: {partial} exists (another rewrite of it is under way, or an "
            "interrupted one left it: if none is running, remove it and run again)"
        ) from None
    try:
        with suppress(FileNotFoundError):  # the file it replaces keeps its permissions (0600: not
            os.chmod(partial, stat.S_IMODE(target.stat().st_mode))  # widened to the umask's)
        with out:
            yield out
            out.flush()  # on disk before its rename: after a power loss the name holds it whole
            os.fsync(out.fileno())
        partial.replace(target)  # a rename that fails (a directory there) leaves no partial behind
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _sync_dir(target.parent)  # and the rename itself lasts


def _sync_dir(path: Path) -> None:
    """Flush a directory's entries to disk (where a directory cannot be opened, as on Windows,
    there is nothing to do)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
