"""A work directory with hostile neighbours, for the file tools' tests.

base/outside/secret.txt        "SECRET" (nothing may read, change or delete it)
base/outside/docs/readme.md    "SECRET docs"
base/work/                     the work directory
    a.txt                      "alpha\\n"
    docs/readme.md             "hello docs\\n"
    lo -> ../outside           a directory symlink out
    ls -> ../outside/secret.txt
    li -> docs                 a symlink that stays inside (refused all the same)
    z -> /dev/zero
    fifo                       a FIFO (a read must not block on it)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effectgate import ToolSpec
from effectgate.tools.files import file_tools

SECRET = "SECRET"


@dataclass(frozen=True)
class Tree:
    base: Path
    root: Path
    outside: Path

    def outside_state(self) -> dict[str, bytes | str]:
        """Every entry under `outside` (and `base` itself) with its content or link target."""
        state: dict[str, bytes | str] = {}
        for path in sorted(self.base.rglob("*")):
            if path.is_relative_to(self.root) and path != self.root:
                continue
            rel = str(path.relative_to(self.base))
            if path.is_symlink():
                state[rel] = f"-> {os.readlink(path)}"
            elif path.is_file():
                state[rel] = path.read_bytes()
            else:
                state[rel] = "dir"
        return state


def make_tree(base: Path) -> Tree:
    outside = base / "outside"
    (outside / "docs").mkdir(parents=True)  # base itself may exist already
    (outside / "secret.txt").write_text(SECRET)
    (outside / "docs" / "readme.md").write_text(f"{SECRET} docs")
    root = base / "work"
    (root / "docs").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "docs" / "readme.md").write_text("hello docs\n")
    (root / "lo").symlink_to("../outside")
    (root / "ls").symlink_to("../outside/secret.txt")
    (root / "li").symlink_to("docs")
    (root / "z").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo")
    return Tree(base, root, outside)


Tool = Callable[..., Any]


def tools(root: Path, **options: Any) -> dict[str, Tool]:
    """The tools' functions by name (approver role "ops", so delete_file is among them)."""
    options.setdefault("approver_role", "ops")
    return {spec.name: spec.fn for spec in file_tools(root, **options)}


def specs(root: Path, **options: Any) -> dict[str, ToolSpec]:
    options.setdefault("approver_role", "ops")
    return {spec.name: spec for spec in file_tools(root, **options)}
