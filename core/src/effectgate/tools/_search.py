"""`search_files`: a depth-first walk on directory descriptors, never through a symlink.

Directories are opened with `O_NOFOLLOW | O_DIRECTORY` relative to their parent's descriptor, so
a directory swapped for a symlink during the walk is skipped, not entered; files are opened as
`read_file` opens them. Entries are visited in name order; the walk stops at a match beyond
`max_results`, a file beyond `max_files`, or a directory `MAX_DEPTH` down (`truncated` then: more
may match than was shown; a search that ends exactly at a limit is not truncated). A file over
`max_bytes` is not searched for text, nor is a file or directory this user may not read: the walk
goes on, and the search is `truncated` too.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from typing import Any

from ._confine import PathRefused, Target, open_file, open_subdir, read_capped

MAX_DEPTH = 32  # directories below the searched one
_GLOB = frozenset("*?[")


class Search:
    """One `search_files` walk: depth first, sorted, never through a symlink, within limits."""

    def __init__(
        self, pattern: str, contains: str | None, *, max_results: int, max_files: int, max_bytes: int
    ) -> None:
        if contains is not None and "\n" in contains:  # it could never match: no empty answer
            raise ValueError("`contains` is matched within one line: give text without a line break")
        self.max_results = max_results
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.pattern = pattern
        self.contains = contains
        self.found: list[dict[str, Any]] = []
        self.visited = 0
        self.truncated = False
        self.skipped = False  # a file too large or unreadable, a directory unreadable: more may match

    def _add(self, match: dict[str, Any]) -> None:
        """Keep a match; one beyond `max_results` is what makes the search `truncated` (a last
        match at the limit, with nothing after it, is not)."""
        if len(self.found) >= self.max_results:
            self.truncated = True
        else:
            self.found.append(match)

    def directory(self, fd: int, prefix: tuple[str, ...], *, depth: int) -> None:
        with os.scandir(fd) as found:
            entries = sorted((e for e in found if utf8(e.name)), key=lambda e: e.name)
        for entry in entries:
            if self.truncated:
                return
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:  # gone meanwhile, or in a directory this user may list only
                self.skipped |= isinstance(exc, PermissionError)
                continue
            rel = (*prefix, entry.name)
            if stat.S_ISDIR(mode):
                if depth >= MAX_DEPTH:
                    self.truncated = True
                    continue
                try:
                    sub = open_subdir(fd, entry.name)  # None when swapped for a symlink: skipped
                except PermissionError:
                    self.skipped = True
                    continue
                if sub is not None:
                    try:
                        self.directory(sub, rel, depth=depth + 1)
                    finally:
                        os.close(sub)
            elif stat.S_ISREG(mode):
                if self.visited >= self.max_files:  # a file left unlooked at
                    self.truncated = True
                    return
                self.visited += 1
                if _matches(self.pattern, "/".join(rel) if "/" in self.pattern else entry.name):
                    self.file(fd, entry.name, rel)

    def file(self, dir_fd: int, name: str, rel: tuple[str, ...]) -> None:
        shown = "/".join(rel)
        if self.contains is None:
            self._add({"path": shown})
            return
        target = Target(shown, rel, rel)
        try:
            fd = open_file(dir_fd, name, target)  # refuses what was swapped for a link or a FIFO
            try:
                text = read_capped(fd, target, self.max_bytes).decode("utf-8")
            finally:
                os.close(fd)
        except (OSError, PathRefused, UnicodeDecodeError) as exc:
            too_large = isinstance(exc, PathRefused) and exc.code == "too_large"
            self.skipped |= too_large or isinstance(exc, PermissionError)
            return  # too large, unreadable, not text, or not a regular file any more: not searched
        # lines end at "\n" only, as grep and editors count them (splitlines also breaks at \f, U+2028...)
        lines = text.removesuffix("\n").split("\n") if text else []
        for number, line in enumerate(lines, start=1):
            if self.contains in line:
                self._add({"path": shown, "line": number, "text": line.strip()[:200]})
                if self.truncated:
                    return


def utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes: no path the tools accept can name it
        return False
    return True


def _matches(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) if _GLOB & set(pattern) else pattern in name
