"""File tools confined to one work directory, as effect-table rows.

    table = EffectTable(file_tools("work", approver_role="ops"))

`file_tools(root, ...)` returns five `ToolSpec`s for your effect table. An adapter that builds
its tools from the table (smolagents `table_tools`, LangGraph `GatedToolNode(gate, agent_id=...)`)
offers them like any other row; a tool error reaches the model as each framework reports one
(LangGraph: give the node `handle_tool_errors=True`, as for any tool that raises).

| tool           | effect      | what it does                                                      |
|----------------|-------------|-------------------------------------------------------------------|
| `read_file`    | read        | a UTF-8 text file, at most `max_read_bytes`                       |
| `list_dir`     | read        | a directory's entries (name, type, size), at most `max_results`   |
| `search_files` | read        | files under a directory by name (glob or substring) and/or text   |
| `write_file`   | write       | writes UTF-8 text atomically; the file's state before and after   |
|                |             | is recorded (size, sha256, and the text when small)               |
| `delete_file`  | destructive | unlinks a file, after `approver_role` (two approvers by default)  |

`delete_file` is in the list only when `approver_role` names who approves deletions. Results are
a string (`read_file`) or JSON objects; every path in them is normalized and relative.

Every path is relative to the work directory and is walked on file descriptors, never resolved
(see `_confine`): absolute paths, `..` out of the directory, NUL bytes, symlinks (anywhere,
also pointing inside: refused, not followed), device files, FIFOs, directories where a file is
expected, and files over the size limit are refused with `PathRefused`, whose message says why.
A symlink swapped in between a check and the use cannot escape: the check is the `O_NOFOLLOW`
open itself. A write replaces only a file its user may write into (another user's file, or one
made read-only, is refused as `denied`, as a write into it would be), and a search says
`truncated` when it could not read a file or a directory. `PathRefused` and `FileNotFoundError`
are the rows' definite failures: a gated delete or write that raises one is recorded as failed,
with nothing changed; one whose path is refused as text is refused when proposed (its `confirm`
check), before anyone is asked. A `contains` with a line break (it could never match a line) is
refused with ValueError.

Two calls naming one file differently (`a.txt`, `./a.txt`) are two subjects to the gate. The
work directory and the limits are not part of a row's fingerprint (the code is, by name). POSIX
only (Linux, macOS): elsewhere `file_tools` raises TableError.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from ..context import Confirmation
from ..effects import Effect
from ..errors import TableError
from ..table import ToolSpec
from ._confine import (
    PathRefused,
    names_a_file,
    open_file,
    open_root,
    parent,
    read_capped,
    remove_file,
    replace_file,
    steps,
    supported,
    walk,
)
from ._search import Search, utf8

HASH_LIMIT = 64 << 20  # a snapshot hashes files up to this size

_PATH = "a path relative to the work directory, e.g. notes/todo.md"


class _Files:
    """The tools over one work directory; each method is one tool (see the module docstring)."""

    def __init__(
        self,
        root: str,
        *,
        max_read_bytes: int,
        max_write_bytes: int,
        max_results: int,
        max_search_files: int,
        snapshot_text_bytes: int,
    ) -> None:
        self.root = root
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes
        self.max_results = max_results
        self.max_search_files = max_search_files
        self.snapshot_text_bytes = snapshot_text_bytes

    @contextmanager
    def _root(self) -> Iterator[int]:
        fd = open_root(self.root)
        try:
            yield fd
        finally:
            os.close(fd)

    def read_file(self, path: str) -> str:
        """Read a UTF-8 text file in the work directory."""
        target = steps(path)
        with self._root() as root, parent(root, target) as (dir_fd, name):
            fd = open_file(dir_fd, name, target)
            try:
                data = read_capped(fd, target, self.max_read_bytes)
            finally:
                os.close(fd)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PathRefused(path, "not_text", f"{target.shown} is not UTF-8 text") from None

    def list_dir(self, path: str = ".") -> dict[str, Any]:
        """List a directory of the work directory: each entry's name, type and (files) size."""
        target = steps(path)
        with self._root() as root:
            fd = walk(root, target, target.steps)
            try:
                with os.scandir(fd) as found:
                    entries = sorted((e for e in found if utf8(e.name)), key=lambda e: e.name)
                listed = [_entry(e) for e in entries[: self.max_results]]
            finally:
                os.close(fd)
        return {
            "path": target.shown,
            "entries": [e for e in listed if e is not None],
            "truncated": len(entries) > self.max_results,
        }

    def search_files(
        self, pattern: str = "*", contains: str | None = None, path: str = "."
    ) -> dict[str, Any]:
        """Find files under a directory of the work directory by name and, with `contains`, by
        text (one match per matching line)."""
        target = steps(path)
        search = Search(
            pattern,
            contains,
            max_results=self.max_results,
            max_files=self.max_search_files,
            max_bytes=self.max_read_bytes,
        )
        with self._root() as root:
            fd = walk(root, target, target.steps)
            try:
                search.directory(fd, target.parts, depth=0)
            finally:
                os.close(fd)
        truncated = search.truncated or search.skipped
        return {"path": target.shown, "matches": search.found, "truncated": truncated}

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        """Write a UTF-8 text file in the work directory (replacing it atomically if it exists;
        missing directories on the way are made)."""
        target = steps(path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise PathRefused(path, "not_text", "the content is not valid UTF-8 text") from None
        if len(data) > self.max_write_bytes:
            raise PathRefused(
                path, "too_large", f"the content is larger than the {self.max_write_bytes}-byte limit"
            )
        with self._root() as root, parent(root, target, create=True) as (dir_fd, name):
            existed = replace_file(dir_fd, name, target, data)
        return {"path": target.shown, "bytes": len(data), "created": not existed}

    def delete_file(self, path: str) -> dict[str, Any]:
        """Delete a file in the work directory (not a directory, not a symlink)."""
        target = steps(path)
        with self._root() as root, parent(root, target) as (dir_fd, name):
            size = remove_file(dir_fd, name, target)
        return {"path": target.shown, "deleted": True, "bytes": size}

    def state(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The snapshot of a write or delete: whether the file exists, its size and sha256, and
        its text when it is UTF-8 of at most `snapshot_text_bytes`. A path the tools refuse is
        refused here too (before anything runs)."""
        target = steps(args.get("path"))
        absent = {"path": target.shown, "exists": False}
        try:
            with self._root() as root, parent(root, target) as (dir_fd, name):
                fd = open_file(dir_fd, name, target)
                try:
                    return {"path": target.shown, "exists": True, **self._describe(fd)}
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return absent

    @staticmethod
    def check(args: Mapping[str, Any], check: Confirmation) -> str | None:
        """A gated write's or delete's `confirm` check: a path refused as text (absolute, `..` out
        of the work directory, a directory) can never run, so no one is asked to approve it."""
        try:
            names_a_file(steps(args.get("path")))
        except PathRefused as exc:
            return str(exc)
        return None

    def _describe(self, fd: int) -> dict[str, Any]:
        size = os.fstat(fd).st_size
        if size > HASH_LIMIT:
            return {"size": size, "sha256": None}
        digest = hashlib.sha256()
        head = b""
        left = size  # the size found: a file another process keeps appending to is read once
        while left > 0 and (chunk := os.read(fd, min(1 << 16, left))):
            left -= len(chunk)
            digest.update(chunk)
            if len(head) <= self.snapshot_text_bytes:
                head += chunk[: self.snapshot_text_bytes + 1 - len(head)]
        out: dict[str, Any] = {"size": size, "sha256": digest.hexdigest()}
        if len(head) <= self.snapshot_text_bytes:
            with suppress(UnicodeDecodeError):
                out["text"] = head.decode("utf-8")
        return out


def _entry(entry: os.DirEntry[str]) -> dict[str, Any] | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None  # gone meanwhile
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return {"name": entry.name, "type": "file", "size": st.st_size}
    kind = "dir" if stat.S_ISDIR(mode) else "symlink" if stat.S_ISLNK(mode) else "other"
    return {"name": entry.name, "type": kind}


def _schema(properties: Mapping[str, Any], *required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def file_tools(
    root: str | os.PathLike[str],
    *,
    approver_role: str | None = None,
    prefix: str = "",
    max_read_bytes: int = 1 << 20,
    max_write_bytes: int = 1 << 20,
    max_results: int = 200,
    max_search_files: int = 10_000,
    snapshot_text_bytes: int = 4096,
) -> list[ToolSpec]:
    """The file tools over the existing directory `root` (resolved once, here), as table rows.

    `approver_role` approves `delete_file` (omitted without one) and a `write_file` a stricter
    policy gates. `prefix` is put before every tool name (two work directories in one table).
    Limits: `max_read_bytes` per file read or searched, `max_write_bytes` per write,
    `max_results` entries or matches, `max_search_files` files a search looks at, and
    `snapshot_text_bytes`: a written or deleted file's text is recorded up to this size."""
    if not supported():
        raise TableError(
            f"{prefix}read_file", "root", "the file tools need POSIX dir_fd support (Linux, macOS)"
        )
    limits = {
        "max_read_bytes": max_read_bytes,
        "max_write_bytes": max_write_bytes,
        "max_results": max_results,
        "max_search_files": max_search_files,
        "snapshot_text_bytes": snapshot_text_bytes,
    }
    for key, value in limits.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (0 if key == "snapshot_text_bytes" else 1)
        ):
            raise TableError(f"{prefix}read_file", key, f"must be a positive integer, not {value!r}")
    real = os.path.realpath(os.fspath(root))
    os.close(open_root(real))  # FileNotFoundError / NotADirectoryError now, not at the first call
    files = _Files(real, **limits)
    path = {"path": {"type": "string", "description": _PATH}}
    where = {
        "path": {"type": "string", "description": "a directory relative to the work directory (default .)"}
    }
    refused = "Absolute paths, .. out of the work directory and symlinks are refused."
    common: dict[str, Any] = {"definite_failures": (PathRefused, FileNotFoundError)}
    specs = [
        ToolSpec(
            name=f"{prefix}read_file",
            effect=Effect.READ,
            fn=files.read_file,
            schema=_schema(path, "path"),
            subject=("path",),
            description=f"Read a UTF-8 text file (at most {max_read_bytes} bytes). {refused}",
            **common,
        ),
        ToolSpec(
            name=f"{prefix}list_dir",
            effect=Effect.READ,
            fn=files.list_dir,
            schema=_schema(where),
            description=f"List a directory: each entry's name, type and size. {refused}",
            **common,
        ),
        ToolSpec(
            name=f"{prefix}search_files",
            effect=Effect.READ,
            fn=files.search_files,
            schema=_schema(
                {
                    "pattern": {
                        "type": "string",
                        "description": "a glob (*.py, src/*.md) or a substring of file names (default *)",
                    },
                    "contains": {
                        "type": "string",
                        "description": "text a line must contain, without line breaks (optional)",
                    },
                    **where,
                }
            ),
            description=f"Find files by name and, with `contains`, lines by text. {refused}",
            **common,
        ),
        ToolSpec(
            name=f"{prefix}write_file",
            effect=Effect.WRITE,
            fn=files.write_file,
            schema=_schema(
                {**path, "content": {"type": "string", "description": "the whole new text"}},
                "path",
                "content",
            ),
            approver_role=approver_role,
            subject=("path",),
            snapshot=files.state,
            confirm=files.check,
            description=(
                f"Write a UTF-8 text file (at most {max_write_bytes} bytes), replacing it whole; "
                f"missing directories are made. {refused}"
            ),
            **common,
        ),
    ]
    if approver_role is not None:
        specs.append(
            ToolSpec(
                name=f"{prefix}delete_file",
                effect=Effect.DESTRUCTIVE,
                fn=files.delete_file,
                schema=_schema(path, "path"),
                approver_role=approver_role,
                subject=("path",),
                snapshot=files.state,
                confirm=files.check,
                description=f"Delete a file (waits for approval). {refused}",
                **common,
            )
        )
    return specs


__all__ = ["PathRefused", "file_tools"]
