"""What the command line accepts before anything is read or written: numbers (finite, and
non-negative where a negative means nothing), times, and output paths (never the ledger itself)."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from .._export_file import LineError, read_lines, rewrite, strict_loads
from .._manifest import Manifest, manifest_path, refuse_overwriting
from .._owned import store_files
from ..effects import Effect
from ..export import ExportError
from ..stores._redaction import UNCLASSIFIED
from ._store import UsageError, _parse

# -- argparse types: a bad value is a usage error (exit 2) raised while parsing, before any work


def _number(text: str, *, what: str, minimum: float | None = None, above: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and (value <= minimum if above else value < minimum)):
        bound = "" if minimum is None else f" {'>' if above else '>='} {minimum:g}"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give a finite number{bound}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds >= 0 (`export --settle`)."""
    return _number(text, what="a number of seconds", minimum=0)


def moment(text: str) -> float:
    """A time as finite epoch seconds or ISO 8601 (a date alone is midnight UTC). Eight digits
    are a date (`20261201`, ISO 8601's basic form), never seconds in 1970: eight that make no
    date (`20261301`) are a usage error."""
    bare = text.strip()
    eight_digits = len(bare) == 8 and bare.isascii() and bare.isdigit()
    if not eight_digits:
        try:
            return _number(text, what="a time")
        except argparse.ArgumentTypeError:
            pass
    try:
        when = datetime.fromisoformat(bare)
    except ValueError:
        if eight_digits:  # a mistyped date: said, never read as 1970
            raise argparse.ArgumentTypeError(
                f"{text!r}: eight digits are a date (YYYYMMDD) and this is none; give ISO 8601 "
                "(2026-12-01) or epoch seconds"
            ) from None
        raise argparse.ArgumentTypeError(
            f"{text!r}: give ISO 8601 (2026-12-01T09:00) or epoch seconds"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _pair(text: str, shape: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write {shape}")
    return key.strip(), value


def target(text: str) -> tuple[str, float]:
    """`ROLE=SECONDS`, a p95 latency target: a finite number of seconds > 0."""
    role, value = _pair(text, "ROLE=SECONDS, e.g. finance=300")
    return role, _number(value, what="a number of seconds", minimum=0, above=True)


_KINDS = frozenset({str(e) for e in Effect} | {UNCLASSIFIED})


def retention_rule(text: str) -> tuple[str, float]:
    """`KIND=DAYS`: a record kind (an effect class, or unclassified) and a finite number >= 0."""
    kind, value = _pair(text, "KIND=DAYS, e.g. read=30")
    if kind not in _KINDS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown kind {kind!r}; use one of {', '.join(sorted(_KINDS))}"
        )
    return kind, _number(value, what="a number of days", minimum=0)


# -- output and input files


def file_name(text: str) -> str:
    """A file option's value: never empty (`--pinned "$MANIFEST"` with the variable unset would
    skip the check it asks for, and `--html ""` would write nothing, both silently)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty file name: give the file's path")
    return text


def _ledger_files(url: str) -> list[tuple[Path, str]]:
    """The files of a SQLite ledger, each with what it is (`_owned.store_files`)."""
    _parse(url)  # a URL that cannot be parsed: StoreUnavailable, as before anything is opened
    return [(Path(path), what) for path, what in store_files(url)]


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(
    url: str, option: str, path: str, *, also: Iterable[Path] = (), renamed: bool = False
) -> None:
    """Refuse (usage error, nothing written) an output that would overwrite the ledger or its key
    file (`path`, or a file written beside it: `also`), is a directory, or lies in a directory that
    does not exist or cannot be written; `renamed` (a file written beside `path`, then renamed over
    it): a `path` that is not a regular file (a device, a pipe, a symlink: the rename would replace
    it, not write into it)."""
    if path.endswith(("/", os.sep)):  # Path() drops the slash: `newdir/` would become a file
        raise UsageError(f"{option} {path}: names a directory; give a file name")
    ledger = _ledger_files(url)
    for out in (Path(path), *also):
        for own, what in ledger:
            if _same(out, own):
                raise UsageError(f"{option} {path}: that is {what} ({own}); nothing was written")
        if out.is_dir():
            raise UsageError(f"{option} {path}: {out} is a directory")
        if renamed and out == Path(path) and not _plain(out):
            raise UsageError(f"{option} {path}: not a regular file (it would be replaced, not written into)")
        parent = out.parent
        if not parent.is_dir():
            raise UsageError(f"{option} {path}: no directory {parent}")
        if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
            raise UsageError(f"{option} {path}: cannot write {out}")


def check_new(option: str, *paths: Path, force: bool, after: Manifest | None = None) -> None:
    """Refuse (usage error, nothing written) an export over a file already there, an earlier
    export or its signed manifest (evidence), unless `force`: a symlink to a file with content too
    (`export --jsonl` writes through it); a device, a pipe, or a symlink to one or to an empty file
    (/dev/stdout) is written into. `after`'s own export is refused first, `force` or not."""
    if after is not None:
        refuse_overwriting(paths[0], after)
    for path in [] if force else paths:
        if path.is_file() and (not path.is_symlink() or path.stat().st_size > 0):
            raise UsageError(
                f"{option} {paths[0]}: {path} exists (an earlier export?): give a new file name, or "
                "--force to replace it; nothing was written"
            )


def check_not_export(option: str, path: Path) -> None:
    """Refuse (usage error, nothing written) a report written over an export's evidence: a file
    with a signed manifest beside it, or a manifest itself (a completion slip would replace it)."""
    evidence = manifest_path(path).is_file()
    if not evidence and path.is_file():
        with suppress(ExportError):
            evidence = bool(Manifest.load(path))
    if evidence:
        raise UsageError(
            f"{option} {path}: that is an export (or its signed manifest): give another file name; "
            "nothing was written"
        )


def check_export_file(url: str, path: str) -> None:
    """An export file `redact --export` may rewrite: it exists, can be read and replaced, and every
    line is an export line (a JSON object with its record, its personal values an object of
    texts or absent, and the record's commitments an object or absent: what `redact_export`
    reads); a usage error otherwise, raised before the ledger is erased."""
    target = Path(path)
    if not target.is_file():
        raise UsageError(f"--export {path}: no such export file; nothing was erased")
    partial = target.with_name(target.name + ".partial")
    check_output(url, "--export", path, also=[partial], renamed=True)  # a symlink: its target kept the values
    check_unfinished("--export", path, [partial], "nothing was erased")  # refused after the erasure
    try:  # as the export's own reader reads it (`_export_file`): streamed, strict, bounded
        for number, line in read_lines(target):
            try:
                parsed = strict_loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
                parsed = None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("record"), dict):
                raise UsageError(f"--export {path}: line {number} is not an export line; nothing was erased")
            if "personal" not in parsed:  # the first format (/1): its arguments are inside its chain
                raise UsageError(
                    f"--export {path}: line {number} is of the first export format, whose arguments no "
                    "erasure reaches: export the ledger anew and delete this file; nothing was erased"
                )
            personal, committed = parsed.get("personal"), parsed["record"].get("personal")
            texts = isinstance(personal, dict) and all(map(_is_str, personal.values()))
            if not (personal is None or texts):
                raise UsageError(
                    f"--export {path}: line {number}'s personal values are not an object of texts; "
                    "nothing was erased"
                )
            if not (committed is None or isinstance(committed, dict)):
                raise UsageError(
                    f"--export {path}: line {number}'s record.personal is not an object; nothing was erased"
                )
    except LineError as exc:  # too long, not UTF-8, or cut short (no final newline)
        raise UsageError(f"--export {path}: {exc}; nothing was erased") from exc
    except OSError as exc:
        raise UsageError(f"--export {path}: cannot read it ({exc}); nothing was erased") from exc


def check_unfinished(option: str, path: str, partials: Iterable[Path], done: str) -> None:
    """Refuse (ExportError, exit 4) a file whose rewrite would find its partial (`rewrite`) there,
    before the ledger is touched: else `export` refused it after sealing the ledger's chain and
    writing the whole file, and `redact --export` after the ledger's erasure."""
    for partial in partials:
        if partial.exists() or partial.is_symlink():
            raise ExportError(
                f"{option} {path}: {partial} exists (another rewrite of it is under way, or an "
                f"interrupted one left it: if none is running, remove it); {done}"
            )


@contextmanager
def jsonl_output(path: str | None) -> Iterator[TextIO]:
    """Where `export --jsonl` writes: stdout; a device or pipe, written into; or a file, written
    beside it and renamed over it once whole (a failure half-way leaves the previous one as it was)."""
    if path is None:
        yield sys.stdout
    elif not _plain(Path(path)):
        with Path(path).open("w", encoding="utf-8") as f:
            yield f
    else:
        with rewrite(Path(path), ExportError) as f:
            yield f


def _plain(path: Path) -> bool:
    """No file yet, or a regular file that is not a symlink: what a rename may replace."""
    return not path.is_symlink() and (path.is_file() or not path.exists())


def _is_str(value: object) -> bool:
    return isinstance(value, str)


# -- the inbox's network options


def allowed_host(text: str) -> str:
    """A Host name the inbox serves (`serve --allowed-host`): a name, an address, or a
    `*.example.com` wildcard, without a port; `*` alone would serve any name (DNS rebinding)."""
    name = text.strip().lower()
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if ":" in bare:
        try:
            return str(ipaddress.IPv6Address(bare))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a host name (no port)") from None
    if not bare or any(ch.isspace() or ch in "/@[]" for ch in bare):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name (no scheme, no port, no path)")
    if "*" in bare and not (bare.startswith("*.") and "*" not in bare[1:] and len(bare) > 2):
        raise argparse.ArgumentTypeError(f"{text!r}: a wildcard is written *.example.com (never * alone)")
    return bare


def trusted_proxy(text: str) -> str:
    """The address or network of a proxy whose X-Forwarded-For is believed (`serve --trusted-proxy`)."""
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address or network (e.g. 127.0.0.1 or 10.0.0.0/8)"
        ) from None


def signing_in(approvers: Any, path: str, *, sso: bool) -> None:
    """`serve --approvers FILE`: refused (a usage error) when it registers no one, or, without
    --sso-header, an approver without a `secret`, who could never sign in (every attempt would
    read as a wrong secret)."""
    if not len(approvers):
        raise UsageError(f"{path} registers no approver")
    lacking = [] if sso else sorted(a.id for a in approvers._current().values() if not a.secret_hash)
    if lacking:
        raise UsageError(
            f"{path}: approver(s) {', '.join(map(repr, lacking))} have no secret and could never sign "
            "in (without --sso-header): add secret = the line `effectgate hash-secret` prints"
        )
