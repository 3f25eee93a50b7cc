"""Confinement to a work directory on file descriptors (POSIX): every path is walked, never resolved.

A path is checked as text first (`steps`): not empty, no NUL byte, valid UTF-8, relative, at most
`MAX_PATH_BYTES` and `MAX_STEPS` components of at most `MAX_NAME_BYTES` each, and no `..` that
climbs above the work directory. Then it is walked from a descriptor of the work directory, one
component at a time: each directory is opened relative to the previous descriptor with
`O_NOFOLLOW | O_DIRECTORY`, and a `..` goes back to a descriptor already held (the disk's `..`
is never opened). The file itself is opened relative to its directory's descriptor with
`O_NOFOLLOW` (reads also `O_NONBLOCK | O_NOCTTY`, so a FIFO or a terminal cannot block or
attach), and what was opened is checked with `fstat` on the descriptor.

So there is no check-then-use gap: the check *is* the open. A symlink swapped in for any
component between a look and the open makes that open fail (refused as a symlink), and the
kernel never leaves the work directory, because it is never asked to resolve more than one name.
Symlinks are refused everywhere, also those pointing inside the work directory: a link's target
may change after any check, and a refused link is an error the model can read.

Writes go to a fresh temporary file in the target's directory (`O_CREAT | O_EXCL | O_NOFOLLOW`,
through the directory's descriptor) and are renamed over the target with `renameat`, which
replaces a directory entry and never follows a symlink at the target. Deletes are `unlinkat`,
which never follows one either.

What this does not cover: a hard link (which is a file, not a path) to a file outside, bind
mounts inside the work directory, and another process that moves directories out of it while a
call runs. The work directory itself is trusted (resolved once, by whoever built the tools).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import NoReturn

from .._owned import owned
from ..errors import EffectGateError

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_STEPS = 128  # each step holds a descriptor while a path is walked

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SYMLINK_ERRNOS = {errno.ELOOP, errno.EMLINK}  # O_NOFOLLOW on a link: ELOOP (Linux), EMLINK (BSD)


class PathRefused(EffectGateError, ValueError):
    """A file tool refused a path or a file; nothing was read or changed.

    `code` says why, for programs: `empty`, `nul`, `encoding`, `absolute`, `escapes`, `too_long`,
    `too_deep`, `symlink`, `not_a_directory`, `not_regular`, `work_directory`, `too_large`,
    `not_text`, `denied` (the file system refused a write or a delete: read-only, full, immutable),
    `protected` (one of effectgate's own files: a store's database, its journals, a key file).
    The message says it for people (and the model)."""

    def __init__(self, path: str, code: str, reason: str) -> None:
        self.path = path
        self.code = code
        # a name in it may hold terminal escapes or a bidi override: shown escaped, as repr does
        self.reason = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in reason)
        shown = path if len(path) <= 80 else path[:77] + "..."
        super().__init__(f"refused {shown!r}: {self.reason}")


def _supported() -> bool:
    needed = (os.open, os.stat, os.mkdir, os.rename, os.unlink)
    return all(f in os.supports_dir_fd for f in needed) and hasattr(os, "O_NOFOLLOW")


_SUPPORTED = _supported()  # at import: a wrapper put on os.open later must not change the answer


def supported() -> bool:
    """Whether this platform has what confinement needs (dir_fd for open, stat, rename, unlink)."""
    return _SUPPORTED


@dataclass(frozen=True)
class Target:
    """A checked path: the steps to walk (`..` kept), the normalized path it names, and whether
    it can only name a directory (it ends in `/`, `.` or `..`)."""

    given: str
    steps: tuple[str, ...]
    parts: tuple[str, ...]
    directory: bool = False

    @property
    def shown(self) -> str:
        """The path relative to the work directory, normalized ("." for the directory itself)."""
        return "/".join(self.parts) or "."


def steps(path: object) -> Target:
    """Check `path` as text and split it (see the module docstring); raise PathRefused."""
    if not isinstance(path, str):
        raise PathRefused(repr(path), "encoding", "a path must be a string")
    if path == "":
        raise PathRefused(path, "empty", "the path is empty")
    if "\x00" in path:
        raise PathRefused(path, "nul", "the path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise PathRefused(path, "encoding", "the path is not valid UTF-8 text") from None
    if path.startswith("/"):
        raise PathRefused(
            path, "absolute", "absolute paths are refused: give a path relative to the work directory"
        )
    if len(encoded) > MAX_PATH_BYTES:
        raise PathRefused(path, "too_long", f"the path is longer than {MAX_PATH_BYTES} bytes")
    walk: list[str] = []
    parts: list[str] = []
    for name in path.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise PathRefused(path, "escapes", "the path escapes the work directory")
            parts.pop()
        elif len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathRefused(path, "too_long", f"a path component is longer than {MAX_NAME_BYTES} bytes")
        else:
            parts.append(name)
        walk.append(name)
    if len(walk) > MAX_STEPS:
        raise PathRefused(path, "too_deep", f"the path has more than {MAX_STEPS} components")
    return Target(path, tuple(walk), tuple(parts), directory=path.rsplit("/", 1)[-1] in ("", ".", ".."))


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(target: Target, mode: int) -> PathRefused:
    return PathRefused(target.given, "not_regular", f"not a regular file: {target.shown} is {_kind(mode)}")


def _explain(exc: OSError, dir_fd: int, name: str, target: Target) -> Exception:
    """The error to raise for a failed open/rename/unlink of `name` in `dir_fd`: a refusal that
    says why (symlink, not a directory, too long), FileNotFoundError naming the relative path,
    or `exc` itself."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        mode = None
    if exc.errno in _SYMLINK_ERRNOS or (mode is not None and stat.S_ISLNK(mode)):
        return PathRefused(target.given, "symlink", f"symlinks are not followed: {name!r} is a symlink")
    if exc.errno == errno.ENOTDIR:
        return PathRefused(target.given, "not_a_directory", f"{name!r} is not a directory")
    if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) and mode is not None:
        return not_regular(target, mode)
    if exc.errno == errno.ENAMETOOLONG:
        return PathRefused(target.given, "too_long", "the path is too long for this file system")
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "no such file or directory", target.shown)
    return exc


def _fail(
    exc: OSError, dir_fd: int, name: str, target: Target, *, refused: frozenset[int] = frozenset()
) -> NoReturn:
    """Raise what `_explain` says; an errno in `refused` (a call that changed nothing) as `denied`."""
    explained = _explain(exc, dir_fd, name, target)
    if explained is exc and exc.errno in refused:
        explained = PathRefused(target.given, "denied", f"the file system refused: {exc.strerror}")
    if explained is exc:
        raise exc
    raise explained from exc


def _open_dir(dir_fd: int, name: str, target: Target, *, create: bool) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", target.shown) from None
    except OSError as exc:
        _fail(exc, dir_fd, name, target)
    refuse_owned(dir_fd, name, target, None)  # a directory named as a journal breaks the store
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile: the open below checks what it is
    except OSError as exc:
        _fail(exc, dir_fd, name, target, refused=_REFUSED)
    return _open_dir(dir_fd, name, target, create=False)


def open_subdir(dir_fd: int, name: str) -> int | None:
    """A descriptor of the directory `name` in `dir_fd`, or None when it is anything else (a
    symlink included) or gone: for walking a tree that is not the model's path. One this user
    may not open raises PermissionError (a search must say it left it out)."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        raise
    except OSError:
        return None


def open_root(root: str) -> int:
    """A descriptor of the work directory (the last component is not followed)."""
    return os.open(root, _DIR)


def walk(root_fd: int, target: Target, walk_steps: Sequence[str], *, create: bool = False) -> int:
    """A new descriptor of the directory `walk_steps` lead to from `root_fd` (see the module
    docstring). `create` makes missing directories on the way (each then opened as any other),
    but not one a later `..` climbs out of, nor one above it: `new/../a.txt` names a.txt only
    where `new` exists, as the snapshot's walk (which makes nothing) finds it, and a walk that
    fails there has made nothing."""
    kept: list[int] = []  # the steps that stay in the path the walk ends at
    for i, name in enumerate(walk_steps):
        if name != "..":
            kept.append(i)
        elif kept:
            kept.pop()
    # the last step a `..` climbs out of: it must exist, and so must every directory above it
    climbed = max((i for i, name in enumerate(walk_steps) if name != ".." and i not in kept), default=-1)
    held = [os.dup(root_fd)]
    try:
        for i, name in enumerate(walk_steps):
            if name == "..":
                if len(held) == 1:  # `steps` refuses this already; never leave the root
                    raise PathRefused(target.given, "escapes", "the path escapes the work directory")
                os.close(held.pop())
            else:
                held.append(_open_dir(held[-1], name, target, create=create and i > climbed))
        return held.pop()
    finally:
        for fd in held:
            os.close(fd)


def names_a_file(target: Target) -> None:
    """The work directory itself, or a path ending in `/`, `.` or `..`, names no file: refused."""
    if not target.parts:
        raise PathRefused(
            target.given, "work_directory", "the path names the work directory itself, not a file"
        )
    if target.directory:
        raise PathRefused(
            target.given, "not_regular", "not a regular file: a path ending in /, . or .. names a directory"
        )


@contextmanager
def parent(root_fd: int, target: Target, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The descriptor of the directory holding the target's file, and the file's name in it."""
    names_a_file(target)
    fd = walk(root_fd, target, target.steps[:-1], create=create)
    try:
        yield fd, target.steps[-1]
    finally:
        os.close(fd)


def open_file(dir_fd: int, name: str, target: Target) -> int:
    """A read descriptor of the regular file `name` in `dir_fd`; anything else is refused
    (checked on the open descriptor, so what is read is what was checked). What is seen not to
    be a regular file is refused unopened: opening a FIFO, even without blocking, releases a
    writer waiting for a reader (whose write then fails), and opening a device runs its driver."""
    seen = lstat_at(dir_fd, name)
    refuse_owned(dir_fd, name, target, seen)
    if seen is not None and not stat.S_ISREG(seen.st_mode) and not stat.S_ISLNK(seen.st_mode):
        raise not_regular(target, seen.st_mode)
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as exc:
        _fail(exc, dir_fd, name, target)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(target, mode)
    return fd


def read_capped(fd: int, target: Target, limit: int) -> bytes:
    """The file's bytes, refused when it is over `limit` (by its size, and again by what a read
    returns, since a file can grow after `fstat`)."""
    if os.fstat(fd).st_size > limit:
        raise PathRefused(target.given, "too_large", f"{target.shown} is larger than the {limit}-byte limit")
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, min(1 << 16, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise PathRefused(target.given, "too_large", f"{target.shown} is larger than the {limit}-byte limit")
    return b"".join(chunks)


def refuse_owned(dir_fd: int, name: str, target: Target, seen: os.stat_result | None) -> None:
    """Refuse one of effectgate's own files (`_owned`): its grant keys, its ledger."""
    if owned(dir_fd, name, seen):
        raise PathRefused(
            target.given,
            "protected",
            f"{target.shown} is one of effectgate's own files (a store's database, its journal or its "
            "keys): the file tools never read, write or delete it",
        )


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def replace_file(dir_fd: int, name: str, target: Target, data: bytes) -> bool:
    """Write `data` as the file `name` in `dir_fd` atomically (temporary file, fsync, renameat);
    a symlink or non-regular file at `name` is refused. True when the file already existed."""
    old = lstat_at(dir_fd, name)
    refuse_owned(dir_fd, name, target, old)
    if old is not None and stat.S_ISLNK(old.st_mode):
        raise PathRefused(target.given, "symlink", f"symlinks are not followed: {name!r} is a symlink")
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise not_regular(target, old.st_mode)
    # a rename needs only the directory's permission: refuse what a write into it could not change
    if old is not None and not os.access(name, os.W_OK, dir_fd=dir_fd, effective_ids=True):
        raise PathRefused(target.given, "denied", f"the file system refused: {target.shown} is not writable")
    temp = f".effectgate-{secrets.token_hex(8)}.tmp"
    try:  # private until it has the old file's mode: no one else can open it and read the new text
        fd = os.open(temp, _CREATE, 0o666 if old is None else 0o600, dir_fd=dir_fd)
    except OSError as exc:
        _fail(exc, dir_fd, name, target, refused=_ANY)  # nothing was made
    refused = _ANY  # until the rename, the target is untouched: any failure changed nothing
    try:
        try:
            if old is not None:  # its group (one this user is in) and, as root, its owner, as a
                with suppress(OSError):  # write into it keeps them: its user must not lose it
                    os.fchown(fd, -1, old.st_gid)
                    os.fchown(fd, old.st_uid, -1)
                # its permissions, never set-ID bits (a write into it clears them)
                os.fchmod(fd, stat.S_IMODE(old.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        refused = _REFUSED
        # renameat replaces the entry `name`, whatever it is now; it never follows a symlink.
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        with suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        if isinstance(exc, OSError):
            _fail(exc, dir_fd, name, target, refused=refused)
        raise
    # The file is replaced now, for every reader. Syncing the directory makes the rename survive
    # a crash; where it fails (a file system that cannot sync a directory) the write still happened.
    with suppress(OSError):
        os.fsync(dir_fd)
    return old is not None


def remove_file(dir_fd: int, name: str, target: Target) -> int:
    """Unlink the regular file `name` in `dir_fd` (unlinkat: a symlink swapped in is removed
    itself, never followed); a symlink or non-regular file is refused. Returns its size."""
    old = lstat_at(dir_fd, name)
    refuse_owned(dir_fd, name, target, old)
    if old is None:
        raise FileNotFoundError(errno.ENOENT, "no such file or directory", target.shown)
    if stat.S_ISLNK(old.st_mode):
        raise PathRefused(target.given, "symlink", f"symlinks are not followed: {name!r} is a symlink")
    if not stat.S_ISREG(old.st_mode):
        raise not_regular(target, old.st_mode)
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError as exc:  # unlinkat removes all or nothing: a refusal removed nothing
        _fail(exc, dir_fd, name, target, refused=_REFUSED)
    return old.st_size


#: the file system's refusals of a mkdir, rename or unlink, which then did nothing (an immutable
#: file, a sticky directory, a read-only, busy or full mount)
_REFUSED = frozenset({errno.EPERM, errno.EACCES, errno.EROFS, errno.EBUSY, errno.ENOSPC, errno.EDQUOT})
_ANY = frozenset(errno.errorcode)  # a write's failure before its rename: the target is untouched
